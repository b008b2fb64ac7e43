# METADATA
# title: Re-check of audit lines
# description: |
#   Asks the rule set, after the fact, whether each reception an audit line
#   records was allowed: data.complyroute.compliance.decision for the hop
#   (sender, step, labels) with the data of the point that decided it: the
#   hop was allowed when the instance that received the record is in the
#   compliant set the decision gives (any of its tiers), whichever instance of
#   the set the point's Envoy chose. complyroute/evidence/audit.py writes the input and reads the
#   answer; nothing here decides anything itself.
#
#   Input:
#     points  {point: <the point's OPA data document, as deployed>}
#     hops    [{"point", "sender", "step", "instance", "labels", "time_ns"}]
#             labels as the audit line holds them (consent null when absent);
#             time_ns when the deciding point took the hop (the line's decided_at;
#             its ts, when the instance received the record, on a line without it),
#             the clock the rules read (null: the audit's own), so that a rule
#             reading the clock gets one verdict whenever the audit runs
package complyroute_audit.recheck

import data.complyroute.compliance

# allowed: the indexes of the hops the rule set allows into their instance: the instance is in
# one of the decision's tiers (the compliant set the point could send the record to).
allowed contains i if {
	some i, hop in input.hops

	# The line holds the record's digest, not the record: the service accepted only a JSON
	# object, which is all the rules ask of a record.
	asked := {"labels": hop.labels, "record": {}, "sender": hop.sender, "step": hop.step}

	decision := decision_at(asked, input.points[hop.point].complyroute.index, object.get(hop, "time_ns", null))
	decision.allowed == true
	some tier in compliant_set(decision)
	hop.instance in tier
}

# The tiers an allowed decision gives; a revision from before the decision gave its compliant
# set named one destination, its set of one. (object.get: either key is unknown to the type
# checker under the other revisions' rules.)
compliant_set(decision) := object.get(decision, "destinations", [[object.get(decision, "destination", null)]])

# The decision for a hop, at the time its line records. A reception follows its decision by the
# hop's own duration (milliseconds), within which a rule reading the clock is taken to hold still.
decision_at(asked, index, time_ns) := decision if {
	is_number(time_ns)

	# regal ignore:with-outside-test-context
	decision := compliance.decision with input as asked with data.complyroute.index as index with time.now_ns as time_ns
} else := decision if {
	# regal ignore:with-outside-test-context
	decision := compliance.decision with input as asked with data.complyroute.index as index
}
