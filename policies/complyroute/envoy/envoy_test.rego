# METADATA
# title: complyroute Envoy adapter tests
# description: |
#   Table-driven like the compliance tests: each case is an allowed ext_authz
#   request (`given`, merged into base_request) with the expected destination
#   header and, where they differ from the headers sent, the canonical label
#   headers (`labels`, `removed`); each of its `twins` adds ONE change and
#   expects a denial, checked on the plugin result and on the decoded JSON body.
package complyroute.envoy_test

import data.complyroute.compliance
import data.complyroute.compliance_test
import data.complyroute.envoy
import data.complyroute.indexing

base_request := {"attributes": {
	"request": {"http": {
		"method": "POST",
		"path": "/process",
		"headers": {
			":authority": "127.0.0.1:12001",
			"content-type": "application/json",
			"x-data-region": "EU",
			"x-data-category": "personal",
			"x-data-consent": "analytics,billing,care",
			"x-request-id": "r-42",
			"x-complyroute-step": "analyse",
		},
		"body": "{\"subject\": \"alice\", \"amount\": 12}",
	}},
	"contextExtensions": {"sender": "entry-eu"},
}}

headers_path := "attributes/request/http/headers"

set_header(name, value) := {"set": {"attributes": {"request": {"http": {"headers": {name: value}}}}}}

set_body(body) := {"set": {"attributes": {"request": {"http": {"body": body}}}}}

set_context(name, value) := {"set": {"attributes": {"contextExtensions": {name: value}}}}

set_principal(principal) := {"set": {"attributes": {"source": {"principal": principal}}}}

instance_principal(id) := concat("", ["spiffe://complyroute/service/", id])

# respond(change): the plugin result for the changed request, as a list (empty when undefined).
respond(change) := [result |
	result := envoy.response with input as compliance_test.apply(base_request, change, "set", "unset")
		with data.complyroute.index as indexing.index(compliance_test.apply(
			compliance_test.fixture_catalog,
			change,
			"catalog_set",
			"catalog_unset",
		))
]

allowed_failures(cases) := {name: got |
	some name, case in cases
	got := respond(case.given)
	got != [allowed_response(case)]
}

# An allowed answer names the destination and sets the labels to `labels` (the label
# headers as sent when a case does not say: they are canonical already), removing those
# listed in `removed`.
allowed_response(case) := object.union(
	{"allowed": true, "headers": object.union(
		object.get(case, "labels", sent_labels(case.given)),
		{"x-complyroute-destination": case.destination},
	)},
	{"request_headers_to_remove": removed | removed := case.removed},
)

sent_labels(given) := object.filter(
	object.get(compliance_test.apply(base_request, given, "set", "unset"), split(headers_path, "/"), {}),
	{"x-data-region", "x-data-category", "x-data-consent"},
)

denied_failures(cases) := {concat(" / ", [name, twin_name]): got |
	some name, case in cases
	some twin_name, twin in case.twins
	got := respond(compliance_test.combine(case.given, twin.change))
	not denied_as(got, twin)
}

denied_as([got], want) if {
	object.keys(got) == {"allowed", "http_status", "headers", "body"}
	got.allowed == false

	# 451 travels to Envoy as 403 (see wire_status in envoy.rego); every other status as is.
	got.http_status == object.get({451: 403}, want.status, want.status)
	got.headers == {"content-type": "application/json"}
	body := json.unmarshal(got.body)
	object.keys(body) == {"code", "message", "request_id", "reasons"}
	body.code == want.code
	body.request_id == object.get(want, "request_id", "r-42")
	is_string(body.message)
	[reason.code | some reason in body.reasons] == want.reasons
}

test_adapter_allowed if allowed_failures(adapter_cases) == {}

test_adapter_denied if denied_failures(adapter_cases) == {}

adapter_cases := {
	"labels and step from the headers, sender from the route": {
		"given": {},
		"destination": "analyse-eu-a",
		"twins": {
			"health data to analyse": {
				"change": set_header("x-data-category", "health"),
				"status": 451,
				"code": "NO_COMPLIANT_INSTANCE",
				"reasons": [
					"CERTIFICATION_MISSING",
					"CERTIFICATION_MISSING",
					"CERTIFICATION_MISSING",
					"CERTIFICATION_MISSING",
					"RESIDENCY_VIOLATION",
				],
			},
			"repeated region header joined by Envoy": {
				"change": set_header("x-data-region", "EU,US"),
				"status": 400,
				"code": "LABELS_CONTRADICTORY",
				"reasons": ["LABELS_CONTRADICTORY"],
			},
			"body is not JSON": {
				"change": set_body("subject=alice"),
				"status": 400,
				"code": "RECORD_MALFORMED",
				"reasons": ["RECORD_MALFORMED"],
			},
			"body is a JSON array": {
				"change": set_body("[1, 2]"),
				"status": 400,
				"code": "RECORD_MALFORMED",
				"reasons": ["RECORD_MALFORMED"],
			},
			"body absent": {
				"change": {"unset": ["attributes/request/http/body"]},
				"status": 400,
				"code": "RECORD_MALFORMED",
				"reasons": ["RECORD_MALFORMED"],
			},
			"no sender in the route's contextExtensions": {
				"change": {"unset": ["attributes/contextExtensions/sender"]},
				"status": 400,
				"code": "SENDER_UNKNOWN",
				"reasons": ["SENDER_UNKNOWN"],
			},
			"headers absent": {
				"change": {"unset": [headers_path]},
				"status": 400,
				"code": "INPUT_INVALID",
				"reasons": ["LABEL_MISSING", "LABEL_MISSING", "STEP_UNKNOWN"],
				"request_id": null,
			},
		},
	},
	"the route's step overrides the header's": {
		"given": object.union(set_header("x-data-category", "health"), set_context("step", "store")),
		"destination": "store-eu",
		"twins": {
			"without a route step the header's step applies": {
				"change": {"unset": ["attributes/contextExtensions/step"]},
				"status": 451,
				"code": "NO_COMPLIANT_INSTANCE",
				"reasons": [
					"CERTIFICATION_MISSING",
					"CERTIFICATION_MISSING",
					"CERTIFICATION_MISSING",
					"CERTIFICATION_MISSING",
					"RESIDENCY_VIOLATION",
				],
			},
			"an empty route step also falls back to the header": {
				"change": set_context("step", ""),
				"status": 451,
				"code": "NO_COMPLIANT_INSTANCE",
				"reasons": [
					"CERTIFICATION_MISSING",
					"CERTIFICATION_MISSING",
					"CERTIFICATION_MISSING",
					"CERTIFICATION_MISSING",
					"RESIDENCY_VIOLATION",
				],
			},
		},
	},
	"snake_case context_extensions (v2 API) are read too": {
		"given": {
			"unset": ["attributes/contextExtensions"],
			"set": {"attributes": {"context_extensions": {"sender": "entry-us", "step": "backup"}}},
		},
		"destination": "backup-ch",
		"twins": {"without the CH replica": {
			"change": {"catalog_unset": ["instances/backup-ch"]},
			"status": 451,
			"code": "RESIDENCY_VIOLATION",
			"reasons": ["RESIDENCY_VIOLATION"],
		}},
	},
	"no request id": {
		"given": {"unset": [concat("/", [headers_path, "x-request-id"])]},
		"destination": "analyse-eu-a",
		"twins": {"denied without a request id": {
			"change": set_body("{"),
			"status": 400,
			"code": "RECORD_MALFORMED",
			"reasons": ["RECORD_MALFORMED"],
			"request_id": null,
		}},
	},
	"the destination header a client sent is replaced": {
		"given": set_header("x-complyroute-destination", "analyse-us"),
		"destination": "analyse-eu-a",
		"twins": {"and ignored when denied": {
			"change": set_header("x-data-consent", "billing"),
			"status": 451,
			"code": "NO_COMPLIANT_INSTANCE",
			"reasons": [
				"PURPOSE_NOT_CONSENTED",
				"PURPOSE_NOT_CONSENTED",
				"PURPOSE_NOT_CONSENTED",
				"PURPOSE_NOT_CONSENTED",
				"RESIDENCY_VIOLATION",
			],
		}},
	},
}

# --- canonical labels on an allowed hop ------------------------------------------

test_canonical_labels_allowed if allowed_failures(canonical_label_cases) == {}

test_canonical_labels_denied if denied_failures(canonical_label_cases) == {}

canonical_label_cases := {
	"consent values in another order are sorted": {
		"given": object.union(set_header("x-data-consent", "care,analytics,billing"), set_context("step", "analyse")),
		"destination": "analyse-eu-a",
		"labels": {"x-data-region": "EU", "x-data-category": "personal", "x-data-consent": "analytics,billing,care"},
		"twins": {"one of them unknown": {
			"change": set_header("x-data-consent", "care,analytics,billing,spying"),
			"status": 400,
			"code": "LABEL_UNKNOWN",
			"reasons": ["LABEL_UNKNOWN"],
		}},
	},
	"blanks, repeats and unsorted consent are rewritten": {
		"given": {"set": {"attributes": {"request": {"http": {"headers": {
			"x-data-region": " EU ",
			"x-data-category": "personal,personal",
			"x-data-consent": "care, billing,analytics,care",
		}}}}}},
		"destination": "analyse-eu-a",
		"labels": {"x-data-region": "EU", "x-data-category": "personal", "x-data-consent": "analytics,billing,care"},
		"twins": {"a second, different category": {
			"change": set_header("x-data-category", "personal,health"),
			"status": 400,
			"code": "LABELS_CONTRADICTORY",
			"reasons": ["LABELS_CONTRADICTORY"],
		}},
	},
	"anonymous record without consent: the consent header is removed": {
		"given": {"set": {"attributes": {"request": {"http": {"headers": {
			"x-data-category": "anonymous",
			"x-data-consent": " , ",
		}}}}}},
		"destination": "analyse-eu-a",
		"labels": {"x-data-region": "EU", "x-data-category": "anonymous"},
		"removed": ["x-data-consent"],
		"twins": {"personal record without consent": {
			"change": set_header("x-data-category", "personal"),
			"status": 400,
			"code": "LABEL_MISSING",
			"reasons": ["LABEL_MISSING"],
		}},
	},
	"anonymous record with consent keeps it": {
		"given": {"set": {"attributes": {"request": {"http": {"headers": {
			"x-data-category": " anonymous",
			"x-data-consent": "billing",
		}}}}}},
		"destination": "analyse-eu-a",
		"labels": {"x-data-region": "EU", "x-data-category": "anonymous", "x-data-consent": "billing"},
		"twins": {"an unknown consent purpose": {
			"change": set_header("x-data-consent", "billing,Billing"),
			"status": 400,
			"code": "LABEL_UNKNOWN",
			"reasons": ["LABEL_UNKNOWN"],
		}},
	},
}

# --- the sender from the verified peer identity ------------------------------------

test_peer_identity_allowed if allowed_failures(peer_identity_cases) == {}

test_peer_identity_denied if denied_failures(peer_identity_cases) == {}

# A US instance as the sender, a US record: the destination (analyse-us, in the sender's
# region, where an EU sender gets analyse-eu-a) shows whom the policy took for the sender.
from_ingest_us := {"set": {"attributes": {
	"source": {"principal": instance_principal("ingest-us")},
	"contextExtensions": {"sender": "ingest-us", "step": "analyse"},
	"request": {"http": {"headers": {"x-data-region": "US"}}},
}}}

sender_unknown := {"status": 400, "code": "SENDER_UNKNOWN", "reasons": ["SENDER_UNKNOWN"]}

sender_mismatch := {"status": 400, "code": "SENDER_MISMATCH", "reasons": ["SENDER_MISMATCH"]}

twin(change, outcome) := object.union(outcome, {"change": change})

peer_identity_cases := {
	"mutual TLS: the route's sender is the verified peer": {
		"given": from_ingest_us,
		"destination": "analyse-us",
		"twins": {
			"the peer is another instance": twin(set_principal(instance_principal("ingest-eu")), sender_mismatch),
			"the route names another sender": twin(set_context("sender", "ingest-eu"), sender_mismatch),
			"the mismatch is reported alone": twin(
				object.union(set_principal(instance_principal("ingest-eu")), set_body("[1]")),
				sender_mismatch,
			),
			"the peer is an enforcement point": twin(set_principal("spiffe://complyroute/point/router-1"), sender_unknown),
			"the peer is the control plane": twin(set_principal("spiffe://complyroute/control"), sender_unknown),
			"an identity of another trust domain": twin(set_principal("spiffe://elsewhere/service/ingest-us"), sender_unknown),
			"the instance prefix alone": twin(set_principal(instance_principal("")), sender_unknown),
			"a bare name is no identity": twin(set_principal("ingest-us"), sender_unknown),
			"the prefix is case-sensitive": twin(set_principal("SPIFFE://complyroute/service/ingest-us"), sender_unknown),
		},
	},
	"the verified peer names the sender of a route that names none": {
		"given": compliance_test.combine(from_ingest_us, {"unset": ["attributes/contextExtensions/sender"]}),
		"destination": "analyse-us",
		"twins": {
			"an instance the catalog lacks": twin(set_principal(instance_principal("ingest-xx")), sender_unknown),
			"the instance left the catalog": twin({"catalog_unset": ["instances/ingest-us"]}, sender_unknown),
			"the peer is an enforcement point": twin(set_principal("spiffe://complyroute/point/router-1"), sender_unknown),
		},
	},
	"an empty route sender is none": {
		"given": compliance_test.combine(from_ingest_us, set_context("sender", "")),
		"destination": "analyse-us",
		"twins": {"the peer is the control plane": twin(set_principal("spiffe://complyroute/control"), sender_unknown)},
	},
	"no principal (the entry's clients, mutual TLS off): the route's sender": {
		"given": compliance_test.combine(from_ingest_us, {
			"unset": ["attributes/source/principal"],
			"set": {"attributes": {"source": {"address": {"socketAddress": {"address": "10.0.0.1", "portValue": 40000}}}}},
		}),
		"destination": "analyse-us",
		"twins": {
			"the route names no sender": twin({"unset": ["attributes/contextExtensions/sender"]}, sender_unknown),
			"the route names an unknown one": twin(set_context("sender", "ingest-xx"), sender_unknown),
			"no route context at all": twin({"unset": ["attributes/contextExtensions"]}, sender_unknown),
		},
	},
	"an empty principal is none": {
		"given": compliance_test.combine(from_ingest_us, set_principal("")),
		"destination": "analyse-us",
		"twins": {"the route names no sender": twin({"unset": ["attributes/contextExtensions/sender"]}, sender_unknown)},
	},
	"snake_case context_extensions with a verified peer": {
		"given": compliance_test.combine(from_ingest_us, {
			"unset": ["attributes/contextExtensions"],
			"set": {"attributes": {"context_extensions": {"sender": "ingest-us", "step": "analyse"}}},
		}),
		"destination": "analyse-us",
		"twins": {
			"the route names another sender": twin(
				{"set": {"attributes": {"context_extensions": {"sender": "ingest-eu"}}}},
				sender_mismatch,
			),
			"the peer is an enforcement point": twin(set_principal("spiffe://complyroute/point/router-1"), sender_unknown),
		},
	},
}

# --- the quick path answers as the compliance policy does -------------------------

# Every allowed scenario and every twin of every table, as Envoy sends it: the
# compliance tables' direct inputs in Envoy's form, and the adapter's own tables.
scenarios[outcome] := object.union(
	{concat(": ", [table_name, name]): scenario(
		as_check_request(compliance_test.apply(compliance_test.base_input, change, "set", "unset")),
		change,
	) |
		some table_name, table in compliance_tables
		some name, change in changes(table, outcome)
	},
	{concat(": ", [table_name, name]): scenario(compliance_test.apply(base_request, change, "set", "unset"), change) |
		some table_name, table in {
			"adapter": adapter_cases,
			"canonical labels": canonical_label_cases,
			"peer identity": peer_identity_cases,
		}
		some name, change in changes(table, outcome)
	},
) if {
	some outcome in ["allowed", "denied"]
}

# A request and the index of its catalog, derived once.
scenario(request, change) := {
	"request": request,
	"index": indexing.index(compliance_test.apply(
		compliance_test.fixture_catalog,
		change,
		"catalog_set",
		"catalog_unset",
	)),
}

compliance_tables := {
	"routing": compliance_test.routing_cases,
	"adequacy": compliance_test.adequacy_cases,
	"certification": compliance_test.certification_cases,
	"purpose": compliance_test.purpose_cases,
	"anonymous": compliance_test.anonymous_cases,
	"labels": compliance_test.label_cases,
	"record": compliance_test.record_cases,
	"sender and step": compliance_test.sender_step_cases,
	"several reasons": compliance_test.multiple_reasons_cases,
}

changes(table, "allowed") := {name: case.given | some name, case in table}

changes(table, "denied") := {concat(" / ", [name, twin_name]): compliance_test.combine(case.given, twin.change) |
	some name, case in table
	some twin_name, twin in case.twins
}

# A direct input as Envoy's check request: labels as headers, the record as the body,
# sender and step in the route's context; what is absent stays absent.
as_check_request(direct) := {"attributes": {
	"request": {"http": object.union(
		{"headers": object.union(
			{concat("", ["x-data-", name]): value | some name, value in object.get(direct, "labels", {})},
			{"x-request-id": id | id := direct.request_id},
		)},
		{"body": json.marshal(record) | record := direct.record},
	)},
	"contextExtensions": {key: value | some key in ["sender", "step"]; value := direct[key]},
}}

# answer(scenario): the plugin result; explained(scenario): the compliance
# policy's own, with the quick path out of the way (no preferred instance to try).
answer(scenario) := response if {
	response := envoy.response with input as scenario.request
		with data.complyroute.index as scenario.index
}

explained(scenario) := response if {
	response := envoy.response with input as scenario.request
		with data.complyroute.index as object.remove(scenario.index, ["preferred"])
}

# Answered by the quick path: allowed though the compliance policy would deny everything.
quick(scenario) if {
	response := envoy.response with input as scenario.request
		with data.complyroute.index as scenario.index
		with compliance.decision as {"allowed": false, "status": 400, "code": "NOT_ASKED"}
	response.allowed == true
}

quick_answers(outcome) := {name | some name, scenario in scenarios[outcome]; quick(scenario)}

# The quick path answers every allowed scenario but those it leaves to the
# compliance policy (for the reason given), and it answers as the compliance
# policy does. (Where it does not answer, the compliance policy answers alone.)
test_quick_path_allowed if {
	answered := quick_answers("allowed")
	object.keys(scenarios.allowed) - answered == object.keys(left_to_the_compliance_policy)
	disagreements := {name: answers |
		some name in answered
		answers := [answer(scenarios.allowed[name]), explained(scenarios.allowed[name])]
		answers[0] != answers[1]
	}
	disagreements == {}
}

left_to_the_compliance_policy := {
	"adapter: labels and step from the headers, sender from the route": "the route pins no step",
	"adapter: no request id": "the route pins no step",
	"adapter: the destination header a client sent is replaced": "the route pins no step",
	"adapter: snake_case context_extensions (v2 API) are read too": "no contextExtensions",
	"peer identity: snake_case context_extensions with a verified peer": "no contextExtensions",
	"labels: the same region repeated is one region": "a label that is not a plain code",
	"labels: blanks around values are ignored": "a label that is not a plain code",
	"canonical labels: blanks, repeats and unsorted consent are rewritten": "a label that is not a plain code",
	"canonical labels: anonymous record with consent keeps it": "a label that is not a plain code",
	"canonical labels: anonymous record without consent: the consent header is removed": "no consent purposes",
	"anonymous: anonymous data needs no consent": "no consent label",
	"adequacy: CH is adequate for EU personal data (US sender, US replica excluded)": "the preferred instance is excluded",
	"routing: US sender, EU subject: preferred US replica excluded": "the preferred instance is excluded",
}

# A denial is always the compliance policy's, reasons and all.
test_quick_path_denied if quick_answers("denied") == set()

# The adapted direct input, checked once in full; absent headers and body stay absent.
test_direct_input_allowed if {
	got := envoy.compliance_input with input as base_request
	got == {
		"labels": {"region": "EU", "category": "personal", "consent": "analytics,billing,care"},
		"record": {"subject": "alice", "amount": 12},
		"sender": "entry-eu",
		"step": "analyse",
		"request_id": "r-42",
	}
}

test_direct_input_denied if {
	no_headers_no_body := {"unset": [headers_path, "attributes/request/http/body"]}
	request := compliance_test.apply(base_request, no_headers_no_body, "set", "unset")
	got := envoy.compliance_input with input as request
	got == {"labels": {}, "sender": "entry-eu"}
	response := envoy.response with input as request
		with data.complyroute.index as indexing.index(compliance_test.fixture_catalog)
	response.http_status == 400
}

# The sender in the direct input: the instance the verified peer names; none for another identity.
test_direct_input_sender_allowed if {
	request := compliance_test.apply(base_request, set_principal(instance_principal("ingest-us")), "set", "unset")
	got := envoy.compliance_input with input as compliance_test.apply(request, set_context("sender", ""), "set", "unset")
	got.sender == "ingest-us"
}

test_direct_input_sender_denied if {
	request := compliance_test.apply(base_request, set_principal("spiffe://complyroute/point/entry"), "set", "unset")
	got := envoy.compliance_input with input as request
	not "sender" in object.keys(got)
	got.step == "analyse"
}
