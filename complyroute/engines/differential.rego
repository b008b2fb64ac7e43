# METADATA
# title: The differential check of the precomputed answers
# description: |
#   Asks the compliance entrypoint, in full, each sampled answer a point's
#   table (and so its compiled routes) holds, with records and clock times and
#   request ids the decision space does not enumerate: complyroute/engines/
#   differential.py builds the input and names the first difference.
package complyroute_engines.differential # regal ignore:directory-package-mismatch

import data.complyroute.compliance
import data.complyroute.envoy

# differences: [point, listener, labelling, probe index, the decision there] for every sampled
# answer the full decision, with a probe's record, clock time and request id, would not route
# as the table does (not allowed, labels rewritten, or another destination).
differences contains difference if {
	some point_name, point in input.points

	# regal ignore:with-outside-test-context
	found := point_differences(point_name, point) with data.complyroute.index as point.data.complyroute.index
		with data.complyroute_quick_path as object.get(point.data, "complyroute_quick_path", {})
	some difference in found
}

point_differences(point_name, point) := {[point_name, check.listener, check.labelling, index, decision] |
	clusters := object.get(point.data, ["complyroute_quick_path", "set_clusters"], null)
	some check in point.checks
	labels := {name: value | some i, [name, _] in input.labels; value := check.labelling[i]; value != null}
	some index, probe in input.probes
	direct := {
		"labels": labels, "record": probe.record, "request_id": probe.request_id,
		"sender": check.sender, "step": check.step,
	}

	# regal ignore:with-outside-test-context
	[decision, canonical] := [compliance.decision, compliance.canonical_labels] with input as direct
		with time.now_ns as probe.now_ns
	not routes_as(decision, canonical, labels, clusters, check.destination)
}

# Small arguments only: OPA keys a function's results by its arguments, and a point's data
# (its table: 450 kB at a central entity of 50 services) as one made each call cost 1 ms.
routes_as(decision, canonical, labels, clusters, destination) if {
	decision.allowed == true
	canonical == {name: object.get(labels, name, "") | some [name, _] in input.labels}
	envoy.routed(decision.destinations, clusters) == destination
}
