# METADATA
# title: Decision space of enforcement points
# description: |
#   Asks the rule set, ahead of time, what Envoy would ask it at run time:
#   data.complyroute.envoy.response for an ext_authz check of a POST /process
#   with a JSON object as body, for every labelling of a listener's decision
#   space. The adapter's full path answers (data.complyroute_quick_path.table, the
#   precomputed table, held out), so every answer is the compliance
#   entrypoint's, data.complyroute.compliance.decision, whatever rules it holds.
#   complyroute/engines/precompute.py writes the input and builds the allowed
#   table both engines use from allowed_space.rego's `allowed` (quick_path.rego
#   checks the quick path against it); complyroute/authoring/policydiff.py
#   compares two rule sets' answers (`decisions`), of this checkout's and of
#   older rule sets. Nothing here decides anything itself.
#
#   Input:
#     points      {point: {"data": <the point's OPA data document>,
#                          "listeners": {listener: {"sender", "step"}}}}
#     labels      [[label name, header], ...]: the rule set's label schema, in
#                 its order (by name)
#     labellings  [[value or null, ...], ...]: the labellings to try at every
#                 listener, a value per label in that order, null = absent
package complyroute_engines.decision_space # regal ignore:directory-package-mismatch

import data.complyroute.envoy

check_request(listener, labelling) := {"attributes": {
	"request": {"http": {
		"method": "POST",
		"path": "/process",
		"headers": object.union(
			{"content-type": "application/json"},
			{header: value | some i, [_, header] in input.labels; value := labelling[i]; value != null},
		),
		"body": "{}",
	}},
	"contextExtensions": {"sender": listener.sender, "step": listener.step},
}}

# The answer only allows and names the destination and the revision: the headers it sets
# already hold those values, the headers it removes are absent.
changes_nothing(request, response) if {
	object.keys(response) - {"allowed", "headers", "request_headers_to_remove"} == set()
	headers := request.attributes.request.http.headers
	every name, value in object.remove(response.headers, ["x-complyroute-destination", "x-complyroute-revision"]) {
		headers[name] == value
	}
	every name in object.get(response, "request_headers_to_remove", []) {
		not headers[name]
	}
}

# METADATA
# title: Every decision of the space
# description: |
#   [point, listener, labelling, outcome] for every labelling
#   of the space, whatever the answer, at every listener the input names
#   (a listener taking records from a client too: its labels are tried as a
#   client sends canonical ones). What `make policy-diff`
#   (complyroute/authoring/policydiff.py) asks of two rule sets and compares. outcome:
#     allowed  {"allowed": true, "destination"}
#     denied   {"allowed": false, "status", "code",
#               "reasons": [[instance or null, code], ...] sorted}
#   status 451 restored from its wire status 403 (see envoy.wire_status);
#   reasons without their messages, which quote the labels and would tell
#   every labelling apart.
# entrypoint: true
decisions contains [point_name, listener_name, labelling, outcome] if {
	some point_name, point in input.points

	# The adapter's answers with the point's data and no precomputed table (the compliance
	# entrypoint decides), the data replaced once for all the point's labellings, not once per
	# labelling: a quarter less CPU for a policy-diff ask.
	# regal ignore:with-outside-test-context
	answers := point_decisions(point) with data.complyroute.index as point.data.complyroute.index
		with data.complyroute.revision as point.data.complyroute.revision # regal ignore:with-outside-test-context
		with data.complyroute_quick_path.table as {} # regal ignore:with-outside-test-context
	some [listener_name, labelling, outcome] in answers
}

# [listener, labelling, outcome] for every labelling at each of the point's listeners.
point_decisions(point) := {[listener_name, labelling, outcome_of(response)] |
	some listener_name, listener in point.listeners
	some labelling in input.labellings
	request := check_request(listener, labelling)

	# regal ignore:with-outside-test-context
	response := envoy.response with input as request
}

outcome_of(response) := {"allowed": true, "destination": response.headers["x-complyroute-destination"]} if {
	response.allowed == true
}

outcome_of(response) := {"allowed": false, "status": status, "code": body.code, "reasons": reasons} if {
	response.allowed == false
	status := object.get({403: 451}, response.http_status, response.http_status)
	body := json.unmarshal(response.body)
	reasons := sort({[object.get(reason, "instance", null), reason.code] | some reason in body.reasons})
}
