# METADATA
# title: classification compliance tests
# description: |
#   Table-driven, as the shipped rule set's tests. Every case is an allowed
#   scenario (`given`, applied to base_input and fixture_catalog) with its
#   expected destinations (preference tiers), plus `twins`: denied scenarios that each add ONE
#   change to `given`, with the expected status, code, reasons (as "CODE" or
#   "CODE instance", in decision order) and texts the decision message must
#   mention. test_<what>_allowed checks the allowed side of a table,
#   test_<what>_denied every twin.
package complyroute.compliance_test

import data.complyroute.compliance
import data.complyroute.indexing

fixture_catalog := {
	"gateways": {
		"entry-eu": {"region": "EU", "node": "node-1"},
		"entry-us": {"region": "US", "node": "node-2"},
		"entry-jp": {"region": "JP", "node": "node-3"},
	},
	"instances": {
		"ingest-eu": instance("ingest", "EU", ["secret"], ["short", "standard", "long"], ["support"]),
		"ingest-us": instance("ingest", "US", ["confidential"], ["short", "standard"], ["support"]),
		"analyse-eu-b": instance("analyse", "EU", ["confidential"], ["standard"], ["analytics"]),
		"analyse-eu-a": instance("analyse", "EU", ["confidential"], ["standard"], ["analytics"]),
		"analyse-us": instance("analyse", "US", ["internal"], ["short", "standard"], ["analytics"]),
		"campaign-eu": instance("campaign", "EU", ["internal"], ["short"], ["marketing"]),
		"campaign-us": instance("campaign", "US", ["internal"], ["short", "standard"], ["analytics", "marketing"]),
		"notify-eu": instance("notify", "EU", ["internal"], ["short"], ["support"]),
		"notify-us": instance("notify", "US", ["internal"], ["short"], ["marketing", "support"]),
		"archive-eu": instance("archive", "EU", ["secret"], ["long"], []),
		"archive-us": object.union(
			instance("archive", "US", ["secret"], ["standard"], []),
			{"quarantined": ["yes"]},
		),
	},
}

instance(step, region, clearance, retains, purposes) := {
	"step": step,
	"region": region,
	"node": "node-x",
	"certifications": [],
	"purposes": purposes,
	"clearance": clearance,
	"retains": retains,
}

base_input := {
	"labels": {"classification": "internal"},
	"record": {"subject": "alice"},
	"sender": "entry-eu",
	"step": "analyse",
	"request_id": "r-1",
}

# A change: {"set": object merged into the input, "unset": input paths to remove,
#            "catalog_set": object merged into the catalog, "catalog_unset": catalog paths}.
apply(doc, change, set_key, unset_key) := json.remove(
	object.union(doc, object.get(change, set_key, {})),
	object.get(change, unset_key, []),
)

combine(given, change) := object.union(
	{key: value |
		some key in {"set", "catalog_set"}
		value := object.union(object.get(given, key, {}), object.get(change, key, {}))
	},
	{key: value |
		some key in {"unset", "catalog_unset"}
		value := array.concat(object.get(given, key, []), object.get(change, key, []))
	},
)

# decide(change): the decisions for the changed scenario, as a list (empty when undefined).
decide(change) := [result |
	result := compliance.decision with input as apply(base_input, change, "set", "unset")
		with data.complyroute.index as indexing.index(apply(fixture_catalog, change, "catalog_set", "catalog_unset"))
]

reason_key(reason) := concat(" ", [reason.code, reason.instance]) if {
	reason.instance
} else := reason.code

allowed_failures(cases) := {name: got |
	some name, case in cases
	got := decide(case.given)
	got != [{"allowed": true, "status": 200, "destinations": case.destinations, "reasons": []}]
}

denied_failures(cases) := {concat(" / ", [name, twin_name]): got |
	some name, case in cases
	some twin_name, twin in case.twins
	got := decide(combine(case.given, twin.change))
	not denied_as(got, twin)
}

denied_as([got], want) if {
	got.allowed == false
	got.status == want.status
	got.code == want.code
	[reason_key(reason) | some reason in got.reasons] == want.reasons
	every text in object.get(want, "mentions", []) {
		contains(got.message, text)
	}
	every reason in got.reasons {
		names_its_instance(reason)
	}
}

# A reason about an instance names it in its message.
names_its_instance(reason) if not reason.instance

names_its_instance(reason) if contains(reason.message, reason.instance)

set_label(name, value) := {"set": {"labels": {name: value}}}

set_record(record) := {"set": {"record": record}}

set_instance(id, fields) := {"catalog_set": {"instances": {id: fields}}}

label_twin(change, code, mention) := {
	"change": change,
	"status": 400,
	"code": code,
	"reasons": [code],
	"mentions": [mention],
}

# exclusion_twin(change, code, ids): every candidate (ids) excluded by the one rule `code`.
exclusion_twin(change, code, ids, mentions) := {
	"change": change,
	"status": 451,
	"code": code,
	"reasons": [sprintf("%s %s", [code, id]) | some id in ids],
	"mentions": mentions,
}

analysers := ["analyse-eu-a", "analyse-eu-b", "analyse-us"]

# --- region preference and tie-break ------------------------------------------

test_routing_allowed if allowed_failures(routing_cases) == {}

test_routing_denied if denied_failures(routing_cases) == {}

routing_cases := {
	"EU sender: the EU replicas first, then the other allowed": {
		"given": {},
		"destinations": [["analyse-eu-a", "analyse-eu-b"], ["analyse-us"]],
		"twins": {"secret record": exclusion_twin(
			set_label("classification", "secret"),
			"CLEARANCE_INSUFFICIENT",
			analysers,
			["no instance of step \"analyse\"", "the record is secret"],
		)},
	},
	"US sender: the US replica first": {
		"given": {"set": {"sender": "entry-us"}},
		"destinations": [["analyse-us"], ["analyse-eu-a", "analyse-eu-b"]],
		"twins": {"unknown sender": label_twin({"set": {"sender": "entry-xx"}}, "SENDER_UNKNOWN", "entry-xx")},
	},
	"US sender, confidential record: preferred US replica excluded": {
		"given": {"set": {"sender": "entry-us", "labels": {"classification": "confidential"}}},
		"destinations": [["analyse-eu-a", "analyse-eu-b"]],
		"twins": {"classification labelled twice": label_twin(
			set_label("classification", "confidential,internal"),
			"LABELS_CONTRADICTORY",
			"confidential, internal",
		)},
	},
	"JP sender, no JP replica: every allowed instance in one tier": {
		"given": {"set": {"sender": "entry-jp"}},
		"destinations": [["analyse-eu-a", "analyse-eu-b", "analyse-us"]],
		"twins": {"classification absent": label_twin(
			{"unset": ["labels/classification"]},
			"LABEL_MISSING",
			"x-data-classification",
		)},
	},
	"the preferred replicas share the first tier": {
		"given": {
			"set": {"sender": "entry-us"},
			"catalog_set": {"instances": {"analyse-us-0": instance("analyse", "US", ["internal"], [], [])}},
		},
		"destinations": [["analyse-us", "analyse-us-0"], ["analyse-eu-a", "analyse-eu-b"]],
		"twins": {"sender not in the catalog": label_twin(
			{"catalog_unset": ["gateways/entry-us"]},
			"SENDER_UNKNOWN",
			"entry-us",
		)},
	},
}

# --- clearance -----------------------------------------------------------------

test_clearance_allowed if allowed_failures(clearance_cases) == {}

test_clearance_denied if denied_failures(clearance_cases) == {}

clearance_cases := {
	"a clearance equal to the classification suffices": {
		"given": set_label("classification", "confidential"),
		"destinations": [["analyse-eu-a", "analyse-eu-b"]],
		"twins": {"a higher classification": exclusion_twin(
			set_label("classification", "secret"),
			"CLEARANCE_INSUFFICIENT",
			analysers,
			["analyse-eu-a holds clearance confidential; the record is secret", "analyse-us holds clearance internal"],
		)},
	},
	"a higher clearance suffices": {
		"given": {"set": {"step": "archive", "labels": {"classification": "internal"}}},
		"destinations": [["archive-eu"]],
		"twins": {"the instance's clearance drops below": {
			"change": set_instance("archive-eu", {"clearance": ["public"]}),
			"status": 451,
			"code": "NO_COMPLIANT_INSTANCE",
			"reasons": ["CLEARANCE_INSUFFICIENT archive-eu", "INSTANCE_QUARANTINED archive-us"],
			"mentions": ["archive-eu holds clearance public; the record is internal"],
		}},
	},
	"an instance without clearance holds public": {
		"given": {
			"set": {"step": "campaign", "sender": "entry-us", "labels": {"classification": "public"}},
			"catalog_unset": ["instances/campaign-eu", "instances/campaign-us/clearance"],
		},
		"destinations": [["campaign-us"]],
		"twins": {"an internal record": exclusion_twin(
			set_label("classification", "internal"),
			"CLEARANCE_INSUFFICIENT",
			["campaign-us"],
			["campaign-us holds clearance public; the record is internal"],
		)},
	},
	"a clearance as a comma-separated string": {
		"given": {
			"set": {"labels": {"classification": "secret"}},
			"catalog_set": {"instances": {"analyse-eu-b": {"clearance": " secret "}}},
		},
		"destinations": [["analyse-eu-b"]],
		"twins": {"a string naming a lower clearance": exclusion_twin(
			set_instance("analyse-eu-b", {"clearance": "internal"}),
			"CLEARANCE_INSUFFICIENT",
			analysers,
			["analyse-eu-b holds clearance internal"],
		)},
	},
	"an unknown clearance grants public only": {
		"given": {
			"set": {"labels": {"classification": "public"}},
			"catalog_set": {"instances": {"analyse-eu-a": {"clearance": ["top-secret"]}}},
			"catalog_unset": ["instances/analyse-eu-b", "instances/analyse-us"],
		},
		"destinations": [["analyse-eu-a"]],
		"twins": {"an internal record": exclusion_twin(
			set_label("classification", "internal"),
			"CLEARANCE_INSUFFICIENT",
			["analyse-eu-a"],
			["analyse-eu-a holds clearance public"],
		)},
	},
}

# --- retention -----------------------------------------------------------------

test_retention_allowed if allowed_failures(retention_cases) == {}

test_retention_denied if denied_failures(retention_cases) == {}

retention_cases := {
	"no retention label: any instance": {
		"given": {},
		"destinations": [["analyse-eu-a", "analyse-eu-b"], ["analyse-us"]],
		"twins": {"a retention no analyser supports": exclusion_twin(
			set_label("retention", "long"),
			"RETENTION_UNSUPPORTED",
			analysers,
			["analyse-eu-a retains standard; the record's retention is long"],
		)},
	},
	"an empty retention label is no retention": {
		"given": set_label("retention", " "),
		"destinations": [["analyse-eu-a", "analyse-eu-b"], ["analyse-us"]],
		"twins": {"an unknown retention": label_twin(
			set_label("retention", "forever"),
			"LABEL_UNKNOWN",
			"retention \"forever\" is unknown (known: long, short, standard)",
		)},
	},
	"short retention: only the instance that retains short": {
		"given": set_label("retention", "short"),
		"destinations": [["analyse-us"]],
		"twins": {"the instance stops retaining short": exclusion_twin(
			set_instance("analyse-us", {"retains": ["standard"]}),
			"RETENTION_UNSUPPORTED",
			analysers,
			["analyse-us retains standard; the record's retention is short"],
		)},
	},
	"retains as a comma-separated string": {
		"given": {
			"set": {"labels": {"retention": "short"}},
			"catalog_set": {"instances": {"analyse-eu-b": {"retains": "standard, short"}}},
		},
		"destinations": [["analyse-eu-b"], ["analyse-us"]],
		"twins": {"an instance without retains retains nothing": exclusion_twin(
			{"catalog_unset": ["instances/analyse-eu-b/retains", "instances/analyse-us/retains"]},
			"RETENTION_UNSUPPORTED",
			analysers,
			["analyse-eu-b retains none", "analyse-us retains none"],
		)},
	},
}

# --- minors and marketing (reads the record's body) -----------------------------

test_minor_allowed if allowed_failures(minor_cases) == {}

test_minor_denied if denied_failures(minor_cases) == {}

campaigns := ["campaign-eu", "campaign-us"]

minor_cases := {
	"an adult's record may go to marketing": {
		"given": {"set": {"step": "campaign", "sender": "entry-us", "record": {"subject": "bob", "subject_age": 30}}},
		"destinations": [["campaign-us"], ["campaign-eu"]],
		"twins": {"a minor's record may not": exclusion_twin(
			set_record({"subject": "bob", "subject_age": 17}),
			"MINOR_TO_MARKETING",
			campaigns,
			["campaign-us processes for analytics,marketing; subject_age is under 18"],
		)},
	},
	"18 is of age": {
		"given": {"set": {"step": "campaign", "record": {"subject_age": 18}}},
		"destinations": [["campaign-eu"], ["campaign-us"]],
		"twins": {"just under 18": exclusion_twin(
			set_record({"subject_age": 17.9}),
			"MINOR_TO_MARKETING",
			campaigns,
			["campaign-eu processes for marketing"],
		)},
	},
	"a subject_age that is not a number is not read": {
		"given": {"set": {"step": "campaign", "record": {"subject_age": "12"}}},
		"destinations": [["campaign-eu"], ["campaign-us"]],
		"twins": {"the same age as a number": exclusion_twin(
			set_record({"subject_age": 12}),
			"MINOR_TO_MARKETING",
			campaigns,
			[],
		)},
	},
	"a minor's record goes to the replica without marketing": {
		"given": {"set": {"step": "notify", "sender": "entry-us", "record": {"subject_age": 12}}},
		"destinations": [["notify-eu"]],
		"twins": {"that replica takes up marketing": exclusion_twin(
			set_instance("notify-eu", {"purposes": ["support", "marketing"]}),
			"MINOR_TO_MARKETING",
			["notify-eu", "notify-us"],
			["notify-eu processes for marketing,support"],
		)},
	},
	"a minor's record to instances without marketing": {
		"given": set_record({"subject_age": 9}),
		"destinations": [["analyse-eu-a", "analyse-eu-b"], ["analyse-us"]],
		"twins": {"the analysers take up marketing": exclusion_twin(
			{"catalog_set": {"instances": {id: {"purposes": ["marketing"]} | some id in analysers}}},
			"MINOR_TO_MARKETING",
			analysers,
			["analyse-us processes for marketing"],
		)},
	},
}

# --- quarantine (reads no label) ------------------------------------------------

test_quarantine_allowed if allowed_failures(quarantine_cases) == {}

test_quarantine_denied if denied_failures(quarantine_cases) == {}

quarantine_cases := {
	"the quarantined preferred replica is skipped": {
		"given": {"set": {"step": "archive", "sender": "entry-us", "labels": {"classification": "secret"}}},
		"destinations": [["archive-eu"]],
		"twins": {"without the other replica": exclusion_twin(
			{"catalog_unset": ["instances/archive-eu"]},
			"INSTANCE_QUARANTINED",
			["archive-us"],
			["archive-us is quarantined"],
		)},
	},
	"an instance quarantined \"no\" receives": {
		"given": {
			"set": {"step": "archive", "sender": "entry-us", "labels": {"classification": "public"}},
			"catalog_set": {"instances": {"archive-us": {"quarantined": ["no"]}}},
			"catalog_unset": ["instances/archive-eu"],
		},
		"destinations": [["archive-us"]],
		"twins": {"quarantined \"yes\" as a string: not even a public record": exclusion_twin(
			set_instance("archive-us", {"quarantined": "yes"}),
			"INSTANCE_QUARANTINED",
			["archive-us"],
			["archive-us is quarantined"],
		)},
	},
	"an instance without the attribute receives": {
		"given": {"set": {"step": "analyse"}},
		"destinations": [["analyse-eu-a", "analyse-eu-b"], ["analyse-us"]],
		"twins": {"every analyser quarantined": exclusion_twin(
			{"catalog_set": {"instances": {id: {"quarantined": ["yes"]} | some id in analysers}}},
			"INSTANCE_QUARANTINED",
			analysers,
			["analyse-eu-a is quarantined"],
		)},
	},
}

# --- several reasons -----------------------------------------------------------

test_multiple_reasons_allowed if allowed_failures(multiple_reasons_cases) == {}

test_multiple_reasons_denied if denied_failures(multiple_reasons_cases) == {}

multiple_reasons_cases := {"a secret long-kept record to archive": {
	"given": {"set": {
		"step": "archive",
		"sender": "entry-us",
		"labels": {"classification": "secret", "retention": "long"},
	}},
	"destinations": [["archive-eu"]],
	"twins": {
		"kept short instead": {
			"change": set_label("retention", "short"),
			"status": 451,
			"code": "NO_COMPLIANT_INSTANCE",
			"reasons": [
				"INSTANCE_QUARANTINED archive-us",
				"RETENTION_UNSUPPORTED archive-eu",
				"RETENTION_UNSUPPORTED archive-us",
			],
			"mentions": ["no instance of step \"archive\"", "archive-eu retains long", "archive-us is quarantined"],
		},
		"a record-level violation hides the exclusions": {
			"change": {"set": {"sender": "nobody", "labels": {"retention": "short"}}},
			"status": 400,
			"code": "SENDER_UNKNOWN",
			"reasons": ["SENDER_UNKNOWN"],
		},
	},
}}

# --- label errors (400) --------------------------------------------------------

test_labels_allowed if allowed_failures(label_cases) == {}

test_labels_denied if denied_failures(label_cases) == {}

label_cases := {
	"well-labelled record": {
		"given": set_label("retention", "standard"),
		"destinations": [["analyse-eu-a", "analyse-eu-b"], ["analyse-us"]],
		"twins": {
			"classification absent": label_twin({"unset": ["labels/classification"]}, "LABEL_MISSING", "x-data-classification"),
			"classification empty": label_twin(set_label("classification", ""), "LABEL_MISSING", "label \"classification\""),
			"classification only blanks and commas": label_twin(
				set_label("classification", " , "),
				"LABEL_MISSING",
				"classification",
			),
			"classification not a string": label_twin(set_label("classification", 2), "LABEL_MISSING", "classification"),
			"classification unknown": label_twin(
				set_label("classification", "top-secret"),
				"LABEL_UNKNOWN",
				"classification \"top-secret\" is unknown (known: confidential, internal, public, secret)",
			),
			"classification is case-sensitive": label_twin(set_label("classification", "Secret"), "LABEL_UNKNOWN", "\"Secret\""),
			"retention unknown": label_twin(set_label("retention", "forever"), "LABEL_UNKNOWN", "\"forever\""),
			"classification labelled twice": label_twin(
				set_label("classification", "internal,public"),
				"LABELS_CONTRADICTORY",
				"classification has the values internal, public",
			),
			"retention labelled twice": label_twin(set_label("retention", "short,long"), "LABELS_CONTRADICTORY", "long, short"),
			"no labels at all": label_twin({"unset": ["labels"]}, "LABEL_MISSING", "x-data-classification"),
			"classification twice, one unknown": {
				"change": set_label("classification", "internal,XX"),
				"status": 400,
				"code": "INPUT_INVALID",
				"reasons": ["LABELS_CONTRADICTORY", "LABEL_UNKNOWN"],
				"mentions": ["input rejected", "XX, internal", "\"XX\" is unknown"],
			},
			"both labels unknown": {
				"change": {"set": {"labels": {"classification": "XX", "retention": "YY"}}},
				"status": 400,
				"code": "LABEL_UNKNOWN",
				"reasons": ["LABEL_UNKNOWN", "LABEL_UNKNOWN"],
				"mentions": ["\"XX\"", "\"YY\""],
			},
		},
	},
	"the same classification repeated is one": {
		"given": set_label("classification", "internal, internal"),
		"destinations": [["analyse-eu-a", "analyse-eu-b"], ["analyse-us"]],
		"twins": {"two classifications": label_twin(
			set_label("classification", "internal,secret"),
			"LABELS_CONTRADICTORY",
			"internal, secret",
		)},
	},
	"a label outside the schema is ignored": {
		"given": {"set": {"labels": {"region": "XX", "category": "health"}}},
		"destinations": [["analyse-eu-a", "analyse-eu-b"], ["analyse-us"]],
		"twins": {"the schema's label is still required": label_twin(
			{"unset": ["labels/classification"]},
			"LABEL_MISSING",
			"x-data-classification",
		)},
	},
}

# --- record (400) --------------------------------------------------------------

test_record_allowed if allowed_failures(record_cases) == {}

test_record_denied if denied_failures(record_cases) == {}

record_cases := {
	"record is an object": {
		"given": {},
		"destinations": [["analyse-eu-a", "analyse-eu-b"], ["analyse-us"]],
		"twins": {
			"record absent": label_twin({"unset": ["record"]}, "RECORD_MALFORMED", "got nothing"),
			"record is a string": label_twin(set_record("alice"), "RECORD_MALFORMED", "got string"),
			"record is an array": label_twin(set_record([{"subject_age": 12}]), "RECORD_MALFORMED", "got array"),
			"record is null": label_twin(set_record(null), "RECORD_MALFORMED", "got null"),
		},
	},
	"an empty object is a record": {
		"given": {"unset": ["record/subject"]},
		"destinations": [["analyse-eu-a", "analyse-eu-b"], ["analyse-us"]],
		"twins": {"an empty string is not": label_twin(set_record(""), "RECORD_MALFORMED", "got string")},
	},
}

# --- sender and step (400) -----------------------------------------------------

test_sender_step_allowed if allowed_failures(sender_step_cases) == {}

test_sender_step_denied if denied_failures(sender_step_cases) == {}

sender_step_cases := {
	"a gateway sends to a known step": {
		"given": {},
		"destinations": [["analyse-eu-a", "analyse-eu-b"], ["analyse-us"]],
		"twins": {
			"sender unknown": label_twin({"set": {"sender": "nobody"}}, "SENDER_UNKNOWN", "sender \"nobody\""),
			"sender absent": label_twin({"unset": ["sender"]}, "SENDER_UNKNOWN", "sender nothing"),
			"step unknown": label_twin(
				{"set": {"step": "publish"}},
				"STEP_UNKNOWN",
				"step \"publish\" (steps here: analyse, archive, campaign, ingest, notify)",
			),
			"step absent": label_twin({"unset": ["step"]}, "STEP_UNKNOWN", "step nothing"),
			"step is case-sensitive": label_twin({"set": {"step": "Analyse"}}, "STEP_UNKNOWN", "\"Analyse\""),
			"empty catalog": {
				"change": {"catalog_unset": ["instances", "gateways"]},
				"status": 400,
				"code": "INPUT_INVALID",
				"reasons": ["SENDER_UNKNOWN", "STEP_UNKNOWN"],
				"mentions": ["steps here: )"],
			},
		},
	},
	"an instance sends (its region is preferred)": {
		"given": {"set": {"sender": "ingest-us"}},
		"destinations": [["analyse-us"], ["analyse-eu-a", "analyse-eu-b"]],
		"twins": {"the instance is not in the catalog": label_twin(
			{"catalog_unset": ["instances/ingest-us"]},
			"SENDER_UNKNOWN",
			"\"ingest-us\"",
		)},
	},
}

# --- no catalog at all (the default catalog is empty) ---------------------------

test_catalog_absent_allowed if {
	decision := compliance.decision with input as base_input with data.complyroute.index as indexing.index(fixture_catalog)
	decision.destinations == [["analyse-eu-a", "analyse-eu-b"], ["analyse-us"]]
}

test_catalog_absent_denied if {
	decision := compliance.decision with input as base_input
	decision.status == 400
	decision.code == "INPUT_INVALID"
	[reason.code | some reason in decision.reasons] == ["SENDER_UNKNOWN", "STEP_UNKNOWN"]
}

# --- canonical labels (what the Envoy adapter writes back) ----------------------

canonical(labels) := [result |
	result := compliance.canonical_labels with input as object.union(base_input, {"labels": labels})
]

test_canonical_labels_allowed if {
	canonical({"classification": " internal , internal"}) == [{"classification": "internal", "retention": ""}]
	canonical({"classification": "secret", "retention": "long"}) == [{"classification": "secret", "retention": "long"}]
}

# Undefined when a single-valued label has several values.
test_canonical_labels_denied if canonical({"classification": "internal", "retention": "short,long"}) == []

# --- the label rules follow the schema, whatever labels it declares -------------

# A third label, multiple and required, declared in the reference data only.
extended_reference := object.union(data.complyroute.reference, {
	"labels": {"handling": {"header": "x-data-handling", "values": "handlings", "multiple": true, "required": true}},
	"handlings": {"no-print": {}, "no-copy": {}},
})

decide_extended(labels) := [result |
	result := compliance.decision with input as object.union(base_input, {"labels": labels})
		with data.complyroute.index as indexing.index(fixture_catalog)
		with data.complyroute.reference as extended_reference
]

canonical_extended(labels) := [result |
	result := compliance.canonical_labels with input as object.union(base_input, {"labels": labels})
		with data.complyroute.reference as extended_reference
]

test_schema_label_allowed if {
	decided := decide_extended({"classification": "internal", "handling": "no-print, no-copy"})
	decided[0].destinations == [["analyse-eu-a", "analyse-eu-b"], ["analyse-us"]]
	canonical_extended({"classification": "internal", "handling": "no-print,no-copy,no-copy"}) == [{
		"classification": "internal",
		"handling": "no-copy,no-print",
		"retention": "",
	}]
}

test_schema_label_denied if {
	[missing] := decide_extended({"classification": "internal"})
	missing.code == "LABEL_MISSING"
	contains(missing.message, "label \"handling\" (header x-data-handling) is required")
	[unknown] := decide_extended({"classification": "internal", "handling": "no-print,burn"})
	unknown.code == "LABEL_UNKNOWN"
	contains(unknown.message, "handling \"burn\" is unknown (known: no-copy, no-print)")
}
