# METADATA
# title: The quick path over a decision space (the guard)
# description: |
#   What each point's quick path (data.complyroute.envoy.quick_answer_of, with
#   the point's allowed table) answers over its decision space, for
#   complyroute/engines/precompute.py to compare with the rule set's own
#   answers before the point takes the table. Input: decision_space.rego's,
#   each point's data holding its table and its keys (data.complyroute_quick_path.table,
#   .keys, which must be the adapter's table_keys). A module of
#   its own: policy-diff loads decision_space.rego with older rule sets, whose
#   adapter has no quick_answer_of.
package complyroute_engines.quick_path # regal ignore:directory-package-mismatch

import data.complyroute.envoy
import data.complyroute_engines.decision_space

# quick: [point, listener, labelling, destination, revision] for every
# labelling the point's quick path (envoy.quick_answer, with the point's table) answers,
# whatever it answers: null destination and revision where its answer does more than allow
# without changing the labels. The guard (precompute.py) requires exactly allowed_space.allowed.
quick contains [point_name, listener_name, labelling, destination, revision] if {
	some point_name, point in input.points
	some listener_name, listener in point.listeners
	some labelling in input.labellings
	request := decision_space.check_request(listener, labelling)

	table := point.data.complyroute_quick_path.table

	# The keys the point's quick path reads beside its table: only the adapter's own (table_keys).
	keys := point.data.complyroute_quick_path.keys
	keys == envoy.table_keys
	response := envoy.quick_answer_of(request.attributes, listener.sender, table, keys, point.data.complyroute.revision)
	[destination, revision] := quick_outcome(request, response)
}

quick_outcome(request, response) := [headers["x-complyroute-destination"], headers["x-complyroute-revision"]] if {
	response.allowed == true
	headers := response.headers
	decision_space.changes_nothing(request, response)
} else := [null, null]
