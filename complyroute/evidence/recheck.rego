# METADATA
# title: Re-check of audit lines
# description: |
#   Asks the rule set, after the fact, whether each reception an audit line
#   records was allowed: data.complyroute.compliance.decision for the hop
#   (sender, step, labels) with the data of the point that decided it, its
#   candidates narrowed to the instance that received the record, so the
#   answer is "allowed to that instance" or not, whichever instance the point
#   would have preferred. complyroute/evidence/audit.py writes the input and reads the
#   answer; nothing here decides anything itself.
#
#   Input:
#     points  {point: <the point's OPA data document, as deployed>}
#     hops    [{"point", "sender", "step", "instance", "labels"}]
#             labels as the audit line holds them (consent null when absent)
package complyroute_audit.recheck

import data.complyroute.compliance

# allowed: the indexes of the hops the rule set allows into their instance.
allowed contains i if {
	some i, hop in input.hops
	index := input.points[hop.point].complyroute.index
	candidate := index.steps[hop.step][hop.instance]
	narrowed := object.union(object.remove(index, ["steps"]), {"steps": {hop.step: {hop.instance: candidate}}})

	# The line holds the record's digest, not the record: the service accepted only a JSON
	# object, which is all the rules ask of a record.
	asked := {"labels": hop.labels, "record": {}, "sender": hop.sender, "step": hop.step}

	# regal ignore:with-outside-test-context
	decision := compliance.decision with input as asked with data.complyroute.index as narrowed
	decision.allowed == true
	decision.destination == hop.instance
}
