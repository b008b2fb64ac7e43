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

# The revision of the rule set the tests decide with: as a point's bundle names it.
revision_under_test := "0123abc-dirty.456def"

# respond(change): the plugin result for the changed request, as a list (empty when undefined).
respond(change) := [result |
	result := envoy.response with input as compliance_test.apply(base_request, change, "set", "unset")
		with data.complyroute.revision as revision_under_test
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
		{"x-complyroute-destination": case.destination, "x-complyroute-revision": revision_under_test},
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
	object.keys(got) == {"allowed", "http_status", "headers", "body", "dynamic_metadata"}
	got.allowed == false

	# 451 travels to Envoy as 403 (see wire_status in envoy.rego); every other status as is.
	got.http_status == object.get({451: 403}, want.status, want.status)
	got.headers == {"content-type": "application/json"}
	body := json.unmarshal(got.body)
	object.keys(body) == {"code", "message", "request_id", "revision", "reasons"}
	body.code == want.code
	body.revision == revision_under_test

	# What Envoy's access log and counters name of the denial, as the body does.
	got.dynamic_metadata == {"code": body.code, "revision": body.revision}
	body.request_id == object.get(want, "request_id", "r-42")
	is_string(body.message)
	[reason.code | some reason in body.reasons] == want.reasons
}

test_adapter_allowed if allowed_failures(adapter_cases) == {}

test_adapter_denied if denied_failures(adapter_cases) == {}

adapter_cases := {
	"labels and step from the headers, sender from the route": {
		"given": {},
		"destination": "analyse-eu-a,analyse-eu-b|analyse-ch",
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
		"destination": "analyse-eu-a,analyse-eu-b|analyse-ch",
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
		"destination": "analyse-eu-a,analyse-eu-b|analyse-ch",
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
		"destination": "analyse-eu-a,analyse-eu-b|analyse-ch",
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
		"destination": "analyse-eu-a,analyse-eu-b|analyse-ch",
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
		"destination": "analyse-eu-a,analyse-eu-b|analyse-ch,analyse-us",
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
		"destination": "analyse-eu-a,analyse-eu-b|analyse-ch,analyse-us",
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
		"destination": "analyse-us|analyse-ch,analyse-eu-a,analyse-eu-b",
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
		"destination": "analyse-us|analyse-ch,analyse-eu-a,analyse-eu-b",
		"twins": {
			"an instance the catalog lacks": twin(set_principal(instance_principal("ingest-xx")), sender_unknown),
			"the instance left the catalog": twin({"catalog_unset": ["instances/ingest-us"]}, sender_unknown),
			"the peer is an enforcement point": twin(set_principal("spiffe://complyroute/point/router-1"), sender_unknown),
		},
	},
	"an empty route sender is none": {
		"given": compliance_test.combine(from_ingest_us, set_context("sender", "")),
		"destination": "analyse-us|analyse-ch,analyse-eu-a,analyse-eu-b",
		"twins": {"the peer is the control plane": twin(set_principal("spiffe://complyroute/control"), sender_unknown)},
	},
	"no principal (the entry's clients, mutual TLS off): the route's sender": {
		"given": compliance_test.combine(from_ingest_us, {
			"unset": ["attributes/source/principal"],
			"set": {"attributes": {"source": {"address": {"socketAddress": {"address": "10.0.0.1", "portValue": 40000}}}}},
		}),
		"destination": "analyse-us|analyse-ch,analyse-eu-a,analyse-eu-b",
		"twins": {
			"the route names no sender": twin({"unset": ["attributes/contextExtensions/sender"]}, sender_unknown),
			"the route names an unknown one": twin(set_context("sender", "ingest-xx"), sender_unknown),
			"no route context at all": twin({"unset": ["attributes/contextExtensions"]}, sender_unknown),
		},
	},
	"an empty principal is none": {
		"given": compliance_test.combine(from_ingest_us, set_principal("")),
		"destination": "analyse-us|analyse-ch,analyse-eu-a,analyse-eu-b",
		"twins": {"the route names no sender": twin({"unset": ["attributes/contextExtensions/sender"]}, sender_unknown)},
	},
	"snake_case context_extensions with a verified peer": {
		"given": compliance_test.combine(from_ingest_us, {
			"unset": ["attributes/contextExtensions"],
			"set": {"attributes": {"context_extensions": {"sender": "ingest-us", "step": "analyse"}}},
		}),
		"destination": "analyse-us|analyse-ch,analyse-eu-a,analyse-eu-b",
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

# The table the control plane would write for a scenario's point: the full path's answer
# (no table), when it allows the hop without rewriting a label, under the sender, step and
# labels the request has (complyroute/engines/precompute.py builds it so, over every
# labelling of the point's decision space); empty otherwise.
table_for(scenario) := table if {
	full := explained(scenario)
	full.allowed == true
	given := scenario.request.attributes.request.http.headers
	every name in envoy.label_header_order {
		object.get(full.headers, name, null) == object.get(given, name, null)
	}
	sender := envoy.sender with input as scenario.request
	entry := {"destination": full.headers["x-complyroute-destination"]}
	step := scenario.request.attributes.contextExtensions.step

	# A level per label of the shipped schema (category, consent, region), NUL for none.
	absent := envoy.table_keys.absent
	[category, consent, region] := [object.get(given, name, absent) | some name in envoy.label_header_order]
	table := {sender: {step: {category: {consent: {region: entry}}}}}
} else := {}

# answer(scenario): the plugin result with the point's table; explained(scenario): the
# compliance policy's own, without one.
answer(scenario) := response if {
	response := envoy.response with input as scenario.request
		with data.complyroute.index as scenario.index
		with data.complyroute_quick_path.table as table_for(scenario)
		with data.complyroute_quick_path.keys as envoy.table_keys
}

explained(scenario) := response if {
	response := envoy.response with input as scenario.request
		with data.complyroute.index as scenario.index
}

# Answered by the quick path: allowed though the compliance policy would deny everything.
quick(scenario) if {
	response := envoy.response with input as scenario.request
		with data.complyroute.index as scenario.index
		with data.complyroute_quick_path.table as table_for(scenario)
		with data.complyroute_quick_path.keys as envoy.table_keys
		with compliance.decision as {"allowed": false, "status": 400, "code": "NOT_ASKED"}
	response.allowed == true
}

quick_answers(outcome) := {name | some name, scenario in scenarios[outcome]; quick(scenario)}

# With its table, the quick path answers every allowed scenario but those it leaves to the
# compliance policy (for the reason given), and it answers as the compliance policy does.
# (Where it does not answer, the compliance policy answers alone.)
test_quick_path_allowed if {
	answered := quick_answers("allowed")
	object.keys(scenarios.allowed) - answered == object.keys(left_to_the_compliance_policy)
	disagreements := {name: answers |
		some name, scenario in scenarios.allowed
		answers := [answer(scenario), explained(scenario)]
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
	"labels: the same region repeated is one region": "a label that is not canonical",
	"labels: blanks around values are ignored": "a label that is not canonical",
	"canonical labels: blanks, repeats and unsorted consent are rewritten": "a label that is not canonical",
	"canonical labels: anonymous record with consent keeps it": "a label that is not canonical",
	"canonical labels: anonymous record without consent: the consent header is removed": "a label that is not canonical",
	"canonical labels: consent values in another order are sorted": "a label that is not canonical",
}

# A denial is always the compliance policy's, reasons and all: it has no table entry.
test_quick_path_denied if quick_answers("denied") == set()

# The quick path answers from its table only: without one (a point whose rule set reads what
# cannot be enumerated, policy-diff, the decision space itself) it answers nothing.
test_quick_path_without_table_denied if {
	answered := {name |
		some name, scenario in scenarios.allowed
		envoy.quick_answer with input as scenario.request with data.complyroute.index as scenario.index
	}
	answered == set()
}

# A table entry is for a record: the same labels with a body that is no JSON object are the
# compliance policy's (400 RECORD_MALFORMED), as is a labelling the table does not hold.
test_quick_path_checks_the_record_denied if {
	scenario := scenarios.allowed["routing: EU sender: the EU replicas first, then the other allowed"]
	not_an_object := compliance_test.apply(scenario.request, set_body("[1]"), "set", "unset")
	response := envoy.response with input as not_an_object
		with data.complyroute.index as scenario.index
		with data.complyroute_quick_path.table as table_for(scenario)
		with data.complyroute_quick_path.keys as envoy.table_keys
	response.http_status == 400
	json.unmarshal(response.body).code == "RECORD_MALFORMED"
}

test_quick_path_checks_the_record_allowed if {
	scenario := scenarios.allowed["routing: EU sender: the EU replicas first, then the other allowed"]
	envoy.quick_answer with input as scenario.request
		with data.complyroute.index as scenario.index
		with data.complyroute_quick_path.table as table_for(scenario)
		with data.complyroute_quick_path.keys as envoy.table_keys
}

# The keys come with the table (the control plane writes both, precompute.py): a table
# without them is never taken, and the compliance policy answers.
test_quick_path_without_its_keys_denied if {
	scenario := scenarios.allowed["routing: EU sender: the EU replicas first, then the other allowed"]
	not envoy.quick_answer with input as scenario.request
		with data.complyroute.index as scenario.index
		with data.complyroute_quick_path.table as table_for(scenario)
}

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

# --- the label token the entry issues --------------------------------------------

# The entry's route asks for a token (contextExtensions.label_token "issue"); its OPA holds
# data.complyroute.token. The key pair below is for these tests only (EC P-256, generated
# once with Python's cryptography); every deployment makes its own (complyroute/trust/pki.py).
entry_token := {
	"issuer": "complyroute-entry",
	"kid": "test-entry",
	"jwk": object.union(entry_public_jwk, {"d": "d44NetkYev6OTDZr53dh4g3ufLamSTRmiAzTjYNbjNU"}),
	"lifetime_seconds": 600,
	"audience": {"first_hop": "spiffe://complyroute/service/", "later_steps": ["spiffe://complyroute/step/store"]},
}

entry_public_jwk := {
	"kty": "EC",
	"crv": "P-256",
	"x": "12nwPqFiUmhz2kTyQsJxJDtB6E_SRnYgLsZCFHCI2rk",
	"y": "jQAgmKwrAvPZ1UUquy7sNaqnP8QNNJ7ANEwo0bMI5pM",
	"alg": "ES256",
	"use": "sig",
	"kid": "test-entry",
}

# Another P-256 public key: a token must not verify with it.
other_public_jwk := object.union(entry_public_jwk, {
	"x": "Whc1dLeRMlMrnnkj8nl_uqw9RbaS0rtOwE4U7PtWjxo",
	"y": "cBFeqWt_yU8F8qhIQdyKqfgbY11pZcrHGtNJ0O-dxbM",
})

# The clock while a test evaluates (time.now_ns): 2023-11-14T22:13:20.123456789Z.
now_ns := 1700000000123456789

issuing := set_context("label_token", "issue")

# respond_issuing(change, token): the plugin result for the changed request with `token` as
# data.complyroute.token ("absent": none loaded), with the point's table ("quick") or
# without one ("compliance policy").
respond_issuing(change, token, path) := [result |
	request := compliance_test.apply(base_request, change, "set", "unset")
	index := indexing.index(compliance_test.apply(
		compliance_test.fixture_catalog,
		change,
		"catalog_set",
		"catalog_unset",
	))
	table := {"compliance policy": {}, "quick": table_for({"request": request, "index": index})}[path]
	result := issued_with(request, index, table, token)
]

issued_with(request, index, table, "absent") := result if {
	result := envoy.response with input as request
		with data.complyroute.index as index
		with data.complyroute_quick_path.table as table
		with data.complyroute_quick_path.keys as envoy.table_keys
		with data.complyroute.revision as revision_under_test
		with time.now_ns as now_ns
}

issued_with(request, index, table, token) := result if {
	token != "absent"

	# regal ignore:unresolved-reference
	result := envoy.response with data.complyroute.token as token
		with input as request
		with data.complyroute.index as index
		with data.complyroute_quick_path.table as table
		with data.complyroute_quick_path.keys as envoy.table_keys
		with data.complyroute.revision as revision_under_test
		with time.now_ns as now_ns
}

paths := ["quick", "compliance policy"]

# Each allowed case, by either path: the answer it gets without a token plus the token and
# the digest, the token verifying with the entry's public key (and no other), every claim
# as expected (`claims`: the labels).
token_failures(cases) := {concat(" / ", [name, path]): got |
	some name, case in cases
	some path in paths
	got := respond_issuing(case.given, object.get(case, "token", entry_token), path)
	not issued_as(got, case)
}

issued_as([got], case) if {
	request := compliance_test.apply(base_request, case.given, "set", "unset")
	digest := concat("", ["sha256:", crypto.sha256(request.attributes.request.http.body)])
	object.get(case, "digest", digest) == digest
	json.remove(got, ["headers/x-complyroute-labels", "headers/x-complyroute-digest"]) == allowed_response(case)
	got.headers["x-complyroute-digest"] == digest
	token := got.headers["x-complyroute-labels"]
	[valid, header, claims] := io.jwt.decode_verify(token, {
		"cert": json.marshal(entry_public_jwk),
		"iss": "complyroute-entry",
		"time": now_ns,
		"aud": token_audiences(case.destination)[0], # a listener of the first hop's set
	})
	valid == true
	header == {"alg": "ES256", "typ": "JWT", "kid": "test-entry"}
	claims == object.union(
		{
			"iss": "complyroute-entry",
			"iat": 1700000000,
			"exp": 1700000600,
			"rid": object.get(case, "rid", "r-42"),
			"digest": digest,
			"aud": token_audiences(case.destination),
		},
		case.claims,
	)
	io.jwt.verify_es256(token, json.marshal(other_public_jwk)) == false
}

# The listener of every instance of the set the hop routes to, then the later steps'.
token_audiences(destination) := array.concat(
	[concat("", ["spiffe://complyroute/service/", id]) | some id in sort(envoy.set_members(destination))],
	["spiffe://complyroute/step/store"],
)

# Each twin, by either path: denied as it says, without a token (denied_as checks that the
# answer holds nothing but its status, content type and body).
token_denied_failures(cases) := {concat(" / ", [name, twin_name, path]): got |
	some name, case in cases
	some twin_name, twin in case.twins
	some path in paths
	change := compliance_test.combine(case.given, object.get(twin, "change", {}))
	got := respond_issuing(change, object.get(twin, "token", entry_token), path)
	not denied_as(got, twin)
}

test_label_token_allowed if token_failures(label_token_cases) == {}

test_label_token_denied if token_denied_failures(label_token_cases) == {}

token_unavailable := {"status": 503, "code": "LABEL_TOKEN_UNAVAILABLE", "reasons": ["LABEL_TOKEN_UNAVAILABLE"]}

label_token_cases := {
	"the entry signs the labels it lets in": {
		"given": object.union(issuing, set_context("step", "analyse")),
		"destination": "analyse-eu-a,analyse-eu-b|analyse-ch",
		"claims": {"region": "EU", "category": "personal", "consent": "analytics,billing,care"},
		"twins": {
			"a denied record gets no token": {
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
			"no data.complyroute.token": object.union(token_unavailable, {"token": "absent"}),
			"a token document without its key": object.union(
				token_unavailable,
				{"token": object.remove(entry_token, ["jwk"])},
			),
			"a key that is no EC private key": object.union(
				token_unavailable,
				{"token": object.union(entry_token, {"jwk": {"kty": "oct", "k": "c2VjcmV0"}})},
			),
			"no lifetime": object.union(token_unavailable, {"token": object.remove(entry_token, ["lifetime_seconds"])}),
			"no audience to name": object.union(token_unavailable, {"token": object.remove(entry_token, ["audience"])}),
			"no request id to name": object.union(token_unavailable, {
				"change": {"unset": [concat("/", [headers_path, "x-request-id"])]},
				"request_id": null,
			}),
		},
	},
	"rewritten labels: the token carries the canonical ones": {
		"given": object.union(issuing, {"set": {"attributes": {"request": {"http": {"headers": {
			"x-data-region": " EU ",
			"x-data-category": "personal,personal",
			"x-data-consent": "care, billing,analytics,care",
		}}}}}}),
		"destination": "analyse-eu-a,analyse-eu-b|analyse-ch",
		"labels": {"x-data-region": "EU", "x-data-category": "personal", "x-data-consent": "analytics,billing,care"},
		"claims": {"region": "EU", "category": "personal", "consent": "analytics,billing,care"},
		"twins": {"a second, different category": {
			"change": set_header("x-data-category", "personal,health"),
			"status": 400,
			"code": "LABELS_CONTRADICTORY",
			"reasons": ["LABELS_CONTRADICTORY"],
		}},
	},
	"a record without consent values: no consent claim": {
		"given": object.union(issuing, {"set": {"attributes": {"request": {"http": {"headers": {
			"x-data-category": "anonymous",
			"x-data-consent": " , ",
		}}}}}}),
		"destination": "analyse-eu-a,analyse-eu-b|analyse-ch,analyse-us",
		"labels": {"x-data-region": "EU", "x-data-category": "anonymous"},
		"removed": ["x-data-consent"],
		"claims": {"region": "EU", "category": "anonymous"},
		"twins": {"personal, so consent is required": {
			"change": set_header("x-data-category", "personal"),
			"status": 400,
			"code": "LABEL_MISSING",
			"reasons": ["LABEL_MISSING"],
		}},
	},
	"the digest is of the body's bytes as sent": {
		"given": object.union(
			object.union(issuing, set_body("{\"subject\": \"zo\u00eb\", \"amount\": 12}")),
			set_header("x-request-id", "r-7"),
		),
		"destination": "analyse-eu-a,analyse-eu-b|analyse-ch",
		"digest": "sha256:0a0908644b4a75711c8f2227579ecf12a40766a8e497c1e3a808fc28b4c9cfd3",
		"rid": "r-7",
		"claims": {"region": "EU", "category": "personal", "consent": "analytics,billing,care"},
		"twins": {"the same bytes as a JSON array": {
			"change": set_body("[{\"subject\": \"zo\u00eb\", \"amount\": 12}]"),
			"status": 400,
			"code": "RECORD_MALFORMED",
			"reasons": ["RECORD_MALFORMED"],
			"request_id": "r-7",
		}},
	},
	"snake_case context_extensions (v2 API) ask for it too": {
		"given": {
			"unset": ["attributes/contextExtensions"],
			"set": {"attributes": {"context_extensions": {"sender": "entry-us", "step": "backup", "label_token": "issue"}}},
		},
		"destination": "backup-ch",
		"claims": {"region": "EU", "category": "personal", "consent": "analytics,billing,care"},
		"twins": {"without the CH replica": {
			"change": {"catalog_unset": ["instances/backup-ch"]},
			"status": 451,
			"code": "RESIDENCY_VIOLATION",
			"reasons": ["RESIDENCY_VIOLATION"],
		}},
	},
}

# Without label_token "issue" (every listener but the entry's), the answer is exactly the
# one the other tables expect, though the point holds a key; its twins are denied as usual.
test_label_token_not_asked_allowed if {
	failures := {concat(" / ", [name, path]): got |
		some name, case in not_issuing_cases
		some path in paths
		got := respond_issuing(case.given, entry_token, path)
		got != [allowed_response(case)]
	}
	failures == {}
}

test_label_token_not_asked_denied if token_denied_failures(not_issuing_cases) == {}

not_issuing_cases := {
	"no label_token": {
		"given": set_context("step", "analyse"),
		"destination": "analyse-eu-a,analyse-eu-b|analyse-ch",
		"twins": {"a denied record": {
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
	"an empty label_token": {
		"given": object.union(set_context("step", "analyse"), set_context("label_token", "")),
		"destination": "analyse-eu-a,analyse-eu-b|analyse-ch",
		"twins": {},
	},
	"a label_token other than issue": {
		"given": object.union(set_context("step", "analyse"), set_context("label_token", "Issue")),
		"destination": "analyse-eu-a,analyse-eu-b|analyse-ch",
		"twins": {},
	},
	"snake_case label_token beside contextExtensions (which win)": {
		"given": object.union(
			set_context("step", "analyse"),
			{"set": {"attributes": {"context_extensions": {"label_token": "issue"}}}},
		),
		"destination": "analyse-eu-a,analyse-eu-b|analyse-ch",
		"twins": {},
	},
	"a record without consent values": {
		"given": {"set": {"attributes": {"request": {"http": {"headers": {
			"x-data-category": "anonymous",
			"x-data-consent": " , ",
		}}}}}},
		"destination": "analyse-eu-a,analyse-eu-b|analyse-ch,analyse-us",
		"labels": {"x-data-region": "EU", "x-data-category": "anonymous"},
		"removed": ["x-data-consent"],
		"twins": {"no key, nor is one needed": {
			"change": set_header("x-data-category", "personal"),
			"token": "absent",
			"status": 400,
			"code": "LABEL_MISSING",
			"reasons": ["LABEL_MISSING"],
		}},
	},
}

# --- the compliant set's cluster ---------------------------------------------------------

# routed(tiers, clusters): a set's own cluster where the point has one (or lists none, as in
# policy-diff), a single instance's always; else the first instance of the first tier.
routed_cases := {
	"a set with a cluster": {"tiers": [["a-1", "a-2"], ["b"]], "clusters": ["a-1,a-2|b"], "routed": "a-1,a-2|b"},
	"no list of clusters: every set named": {"tiers": [["a-1", "a-2"], ["b"]], "clusters": null, "routed": "a-1,a-2|b"},
	"one instance is its own cluster": {"tiers": [["a-1"]], "clusters": [], "routed": "a-1"},
	"one tier of several": {"tiers": [["a-1", "a-2"]], "clusters": ["a-1,a-2"], "routed": "a-1,a-2"},
}

# Without a cluster for the set, the record still goes inside it: to its first instance.
routed_twins := {
	"a set without a cluster here": {"tiers": [["a-1", "a-2"], ["b"]], "clusters": ["a-1,a-2"], "routed": "a-1"},
	"another tiering of the same instances": {"tiers": [["b"], ["a-1", "a-2"]], "clusters": ["a-1,a-2|b"], "routed": "b"},
}

test_routed_allowed if {
	every case in routed_cases {
		envoy.routed(case.tiers, case.clusters) == case.routed
		envoy.set_members(case.routed) == {id | some tier in case.tiers; some id in tier}
	}
}

test_routed_denied if {
	every case in routed_twins {
		envoy.routed(case.tiers, case.clusters) == case.routed
		count(envoy.set_members(case.routed)) == 1
	}
}

# The answer's routing header follows the point's list of set clusters.
test_set_clusters_allowed if {
	answer := envoy.response with input as base_request
		with data.complyroute.index as indexing.index(compliance_test.fixture_catalog)
		with data.complyroute_quick_path.set_clusters as ["analyse-eu-a,analyse-eu-b|analyse-ch"]
	answer.headers["x-complyroute-destination"] == "analyse-eu-a,analyse-eu-b|analyse-ch"
}

test_set_clusters_denied if {
	answer := envoy.response with input as base_request
		with data.complyroute.index as indexing.index(compliance_test.fixture_catalog)
		with data.complyroute_quick_path.set_clusters as []
	answer.headers["x-complyroute-destination"] == "analyse-eu-a"
}
