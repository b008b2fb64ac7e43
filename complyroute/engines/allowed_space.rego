# METADATA
# title: The allowed answers over a decision space
# description: |
#   What the compliance entrypoint allows over each point's decision space,
#   as the Envoy adapter routes it: complyroute/engines/precompute.py builds
#   the allowed table and the compiled routes from `allowed`. Input:
#   decision_space.rego's. A module of its own: policy-diff loads
#   decision_space.rego with older rule sets, whose adapter has no `routed`.
package complyroute_engines.allowed_space # regal ignore:directory-package-mismatch

import data.complyroute.compliance
import data.complyroute.envoy

# allowed: [point, listener, labelling, destination, revision] for every
# labelling the compliance entrypoint allows and whose labels it reads as they are
# (compliance.canonical_labels: the adapter would rewrite no label), with the cluster the
# adapter routes it to (envoy.routed: the compliant set's, given the set clusters the
# point's data lists, if any) and the revision of the point's rule set (the route and the
# quick path set both, as OPA's answer would). Any other labelling is left out: the point
# keeps asking OPA for it.
allowed contains answer if {
	some point_name, point in input.points

	# The point's index replaced once for all its labellings, not once per labelling (8% less CPU).
	# regal ignore:with-outside-test-context
	answers := point_allowed(point_name, point) with data.complyroute.index as point.data.complyroute.index
	some answer in answers
}

point_allowed(point_name, point) := {[point_name, listener_name, labelling, destination, point.data.complyroute.revision] |
	some listener_name, listener in point.listeners
	some labelling in input.labellings
	labels := {name: value | some i, [name, _] in input.labels; value := labelling[i]; value != null}
	direct := {"labels": labels, "record": {}, "sender": listener.sender, "step": listener.step}

	# regal ignore:with-outside-test-context
	[decision, canonical] := [compliance.decision, compliance.canonical_labels] with input as direct
	decision.allowed == true
	canonical == {name: object.get(labels, name, "") | some [name, _] in input.labels}
	clusters := object.get(point.data, ["complyroute_quick_path", "set_clusters"], null)
	destination := envoy.routed(decision.destinations, clusters)
}
