# METADATA
# title: Decision space of enforcement points (envoy-compiled engine)
# description: |
#   Asks the rule set, ahead of time, what Envoy would ask it at run time:
#   data.complyroute.envoy.response for an ext_authz check of a POST /process
#   with a JSON object as body, for every labelling of a listener's decision
#   space. complyroute/engines/envoy_compiled.py writes the input and turns the
#   answers into Envoy routes (`allowed`); complyroute/policydiff.py compares two
#   rule sets' answers (`decisions`). Nothing here decides anything itself.
#
#   Input:
#     points      {point: {"data": <the point's OPA data document>,
#                          "listeners": {listener: {"sender", "step", "consents"}}}}
#                 consents: canonical x-data-consent values to try, null = absent
#     regions     x-data-region values to try
#     categories  x-data-category values to try
package complyroute_engines.decision_space # regal ignore:directory-package-mismatch

import data.complyroute.envoy

# allowed: [point, listener, region, category, consent, destination, revision] for every
# labelling the rule set allows without changing the labels, with the instance it chose and
# the revision it names (the route sets both, as OPA's answer would). A labelling whose
# answer rewrites a label (not canonical) or does more than allow is left out: Envoy keeps
# asking OPA for it.
allowed contains [point_name, listener_name, region, category, consent, destination, revision] if {
	some point_name, point in input.points
	some listener_name, listener in point.listeners
	some region in input.regions
	some category in input.categories
	some consent in listener.consents
	request := check_request(listener, region, category, consent)

	# regal ignore:with-outside-test-context
	response := envoy.response with input as request
		with data.complyroute.index as point.data.complyroute.index # regal ignore:with-outside-test-context
		with data.complyroute.revision as point.data.complyroute.revision # regal ignore:with-outside-test-context
	response.allowed == true
	destination := response.headers["x-complyroute-destination"]
	revision := response.headers["x-complyroute-revision"]
	changes_nothing(request, response)
}

check_request(listener, region, category, consent) := {"attributes": {
	"request": {"http": {
		"method": "POST",
		"path": "/process",
		"headers": object.union(
			{"content-type": "application/json", "x-data-region": region, "x-data-category": category},
			consent_header(consent),
		),
		"body": "{}",
	}},
	"contextExtensions": {"sender": listener.sender, "step": listener.step},
}}

default consent_header(_) := {}

consent_header(consent) := {"x-data-consent": consent} if consent != null

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
#   [point, listener, region, category, consent, outcome] for every labelling
#   of the space, whatever the answer, at every listener the input names
#   (a listener taking records from a client too: its labels are tried as a
#   client sends canonical ones). What `make policy-diff`
#   (complyroute/policydiff.py) asks of two rule sets and compares. outcome:
#     allowed  {"allowed": true, "destination"}
#     denied   {"allowed": false, "status", "code",
#               "reasons": [[instance or null, code], ...] sorted}
#   status 451 restored from its wire status 403 (see envoy.wire_status);
#   reasons without their messages, which quote the labels and would tell
#   every labelling apart.
# entrypoint: true
decisions contains [point_name, listener_name, region, category, consent, outcome] if {
	some point_name, point in input.points
	some listener_name, listener in point.listeners
	some region in input.regions
	some category in input.categories
	some consent in listener.consents
	request := check_request(listener, region, category, consent)

	# regal ignore:with-outside-test-context
	response := envoy.response with input as request
		with data.complyroute.index as point.data.complyroute.index # regal ignore:with-outside-test-context
		with data.complyroute.revision as point.data.complyroute.revision # regal ignore:with-outside-test-context
	outcome := outcome_of(response)
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
