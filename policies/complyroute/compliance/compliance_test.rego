# METADATA
# title: complyroute compliance tests
# description: |
#   Table-driven. Every case is an allowed scenario (`given`, applied to
#   base_input and fixture_catalog) with its expected destinations (preference tiers), plus `twins`:
#   denied scenarios that each add ONE change to `given`, with the expected
#   status, code, reasons (as "CODE" or "CODE instance", in decision order)
#   and texts the decision message must mention.
#   test_<what>_allowed checks the allowed side of a table, test_<what>_denied
#   every twin. On failure, `bin/opa test policies --ignore examples -v --var-values`
#   shows the failing cases with the decision they got.
package complyroute.compliance_test

import data.complyroute.compliance
import data.complyroute.indexing

fixture_catalog := {
	"gateways": {
		"entry-eu": {"region": "EU", "node": "node-1"},
		"entry-us": {"region": "US", "node": "node-3"},
		"entry-ch": {"region": "CH", "node": "node-4"},
		"entry-jp": {"region": "JP", "node": "node-5"},
	},
	"instances": {
		"ingest-eu": instance("ingest", "EU", [], ["billing"]),
		"ingest-us": instance("ingest", "US", [], ["billing"]),
		"analyse-eu-b": instance("analyse", "EU", [], ["analytics"]),
		"analyse-eu-a": instance("analyse", "EU", [], ["analytics"]),
		"analyse-us": instance("analyse", "US", [], ["analytics"]),
		"analyse-ch": instance("analyse", "CH", [], ["analytics"]),
		"store-eu": instance("store", "EU", ["health-data"], ["care"]),
		"store-ch": instance("store", "CH", [], ["care"]),
		"store-us": instance("store", "US", ["health-data"], ["care"]),
		"backup-ch": instance("backup", "CH", [], ["billing"]),
		"backup-us": instance("backup", "US", [], ["billing"]),
	},
}

instance(step, region, certifications, purposes) := {
	"step": step,
	"region": region,
	"node": "node-x",
	"certifications": certifications,
	"purposes": purposes,
}

base_input := {
	"labels": {"region": "EU", "category": "personal", "consent": "analytics,billing,care"},
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

# --- region preference and tie-break ------------------------------------------

test_routing_allowed if allowed_failures(routing_cases) == {}

test_routing_denied if denied_failures(routing_cases) == {}

routing_cases := {
	"EU sender: the EU replicas first, then the other allowed": {
		"given": {},
		"destinations": [["analyse-eu-a", "analyse-eu-b"], ["analyse-ch"]],
		"twins": {"no consent for analytics": {
			"change": {"set": {"labels": {"consent": "billing,care"}}},
			"status": 451,
			"code": "NO_COMPLIANT_INSTANCE",
			"reasons": [
				"PURPOSE_NOT_CONSENTED analyse-ch",
				"PURPOSE_NOT_CONSENTED analyse-eu-a",
				"PURPOSE_NOT_CONSENTED analyse-eu-b",
				"PURPOSE_NOT_CONSENTED analyse-us",
				"RESIDENCY_VIOLATION analyse-us",
			],
			"mentions": ["no instance of step \"analyse\"", "analytics", "billing,care"],
		}},
	},
	"US sender, US subject: the US replica first": {
		"given": {"set": {"sender": "entry-us", "labels": {"region": "US"}}},
		"destinations": [["analyse-us"], ["analyse-ch", "analyse-eu-a", "analyse-eu-b"]],
		"twins": {"health data": {
			"change": {"set": {"labels": {"category": "health"}}},
			"status": 451,
			"code": "CERTIFICATION_MISSING",
			"reasons": [
				"CERTIFICATION_MISSING analyse-ch",
				"CERTIFICATION_MISSING analyse-eu-a",
				"CERTIFICATION_MISSING analyse-eu-b",
				"CERTIFICATION_MISSING analyse-us",
			],
			"mentions": ["health-data", "category health"],
		}},
	},
	"CH sender, EU subject: the CH replica first": {
		"given": {"set": {"sender": "entry-ch"}},
		"destinations": [["analyse-ch"], ["analyse-eu-a", "analyse-eu-b"]],
		"twins": {"unknown sender": {
			"change": {"set": {"sender": "entry-xx"}},
			"status": 400,
			"code": "SENDER_UNKNOWN",
			"reasons": ["SENDER_UNKNOWN"],
			"mentions": ["entry-xx"],
		}},
	},
	"JP sender, no JP replica: every allowed instance in one tier": {
		"given": {"set": {"sender": "entry-jp"}},
		"destinations": [["analyse-ch", "analyse-eu-a", "analyse-eu-b"]],
		"twins": {"region label absent": {
			"change": {"unset": ["labels/region"]},
			"status": 400,
			"code": "LABEL_MISSING",
			"reasons": ["LABEL_MISSING"],
			"mentions": ["x-data-region"],
		}},
	},
	"US sender, EU subject: preferred US replica excluded": {
		"given": {"set": {"sender": "entry-us"}},
		"destinations": [["analyse-ch", "analyse-eu-a", "analyse-eu-b"]],
		"twins": {"category labelled twice": {
			"change": {"set": {"labels": {"category": "personal,health"}}},
			"status": 400,
			"code": "LABELS_CONTRADICTORY",
			"reasons": ["LABELS_CONTRADICTORY"],
			"mentions": ["health, personal"],
		}},
	},
	"the preferred replicas share the first tier": {
		"given": {
			"set": {"sender": "entry-us", "labels": {"region": "US"}},
			"catalog_set": {"instances": {"analyse-us-0": instance("analyse", "US", [], ["analytics"])}},
		},
		"destinations": [["analyse-us", "analyse-us-0"], ["analyse-ch", "analyse-eu-a", "analyse-eu-b"]],
		"twins": {"sender not in the catalog": {
			"change": {"catalog_unset": ["gateways/entry-us"]},
			"status": 400,
			"code": "SENDER_UNKNOWN",
			"reasons": ["SENDER_UNKNOWN"],
			"mentions": ["entry-us"],
		}},
	},
}

# --- residency and adequacy ----------------------------------------------------

test_adequacy_allowed if allowed_failures(adequacy_cases) == {}

test_adequacy_denied if denied_failures(adequacy_cases) == {}

adequacy_cases := {
	"CH is adequate for EU personal data (US sender, US replica excluded)": {
		"given": {"set": {"step": "backup", "sender": "entry-us"}},
		"destinations": [["backup-ch"]],
		"twins": {
			"without the CH replica only US is left": {
				"change": {"catalog_unset": ["instances/backup-ch"]},
				"status": 451,
				"code": "RESIDENCY_VIOLATION",
				"reasons": ["RESIDENCY_VIOLATION backup-us"],
				"mentions": ["backup-us is in US", "subject region EU", "category personal"],
			},
			"an instance without a region is not adequate": {
				"change": {"catalog_unset": ["instances/backup-ch/region"]},
				"status": 451,
				"code": "RESIDENCY_VIOLATION",
				"reasons": ["RESIDENCY_VIOLATION backup-ch", "RESIDENCY_VIOLATION backup-us"],
				"mentions": ["backup-ch is in no region"],
			},
		},
	},
	"US subjects are not protected by GDPR": {
		"given": {
			"set": {"step": "backup", "sender": "entry-us", "labels": {"region": "US"}},
			"catalog_unset": ["instances/backup-ch"],
		},
		"destinations": [["backup-us"]],
		"twins": {
			"EU subject": residency_twin("EU"),
			"Norwegian (EEA) subject": residency_twin("NO"),
			"Icelandic (EEA) subject": residency_twin("IS"),
			"Liechtenstein (EEA) subject": residency_twin("LI"),
		},
	},
	"UK is adequate": {
		"given": {
			"set": {"step": "backup"},
			"catalog_set": {"instances": {"backup-uk": instance("backup", "UK", [], ["billing"])}},
			"catalog_unset": ["instances/backup-ch"],
		},
		"destinations": [["backup-uk"]],
		"twins": {"India is not": {
			"change": {"catalog_set": {"instances": {"backup-uk": {"region": "IN"}}}},
			"status": 451,
			"code": "RESIDENCY_VIOLATION",
			"reasons": ["RESIDENCY_VIOLATION backup-uk", "RESIDENCY_VIOLATION backup-us"],
			"mentions": ["backup-uk is in IN"],
		}},
	},
}

residency_twin(region) := {
	"change": {"set": {"labels": {"region": region}}},
	"status": 451,
	"code": "RESIDENCY_VIOLATION",
	"reasons": ["RESIDENCY_VIOLATION backup-us"],
	"mentions": [sprintf("subject region %s", [region])],
}

# --- certification -------------------------------------------------------------

test_certification_allowed if allowed_failures(certification_cases) == {}

test_certification_denied if denied_failures(certification_cases) == {}

uncertified_store := {
	"status": 451,
	"code": "NO_COMPLIANT_INSTANCE",
	"reasons": [
		"CERTIFICATION_MISSING store-ch",
		"CERTIFICATION_MISSING store-eu",
		"RESIDENCY_VIOLATION store-us",
	],
	"mentions": ["store-eu holds", "requires \"health-data\""],
}

certification_cases := {
	"health data to the certified EU replica": {
		"given": {"set": {"step": "store", "labels": {"category": "health"}}},
		"destinations": [["store-eu"]],
		"twins": {"the EU replica loses its certification": object.union(
			uncertified_store,
			{"change": {"catalog_set": {"instances": {"store-eu": {"certifications": []}}}}},
		)},
	},
	"certifications as a comma-separated string": {
		"given": {
			"set": {"step": "store", "labels": {"category": "health"}},
			"catalog_set": {"instances": {"store-eu": {"certifications": "iso-27001, health-data"}}},
		},
		"destinations": [["store-eu"]],
		"twins": {"a string without the certification": object.union(
			uncertified_store,
			{"change": {"catalog_set": {"instances": {"store-eu": {"certifications": "iso-27001"}}}}},
		)},
	},
	"personal data needs no certification": {
		"given": {
			"set": {"step": "store"},
			"catalog_set": {"instances": {"store-eu": {"certifications": []}}},
		},
		"destinations": [["store-eu"], ["store-ch"]],
		"twins": {"health data does": object.union(
			uncertified_store,
			{"change": {"set": {"labels": {"category": "health"}}}},
		)},
	},
}

# --- purpose limitation --------------------------------------------------------

test_purpose_allowed if allowed_failures(purpose_cases) == {}

test_purpose_denied if denied_failures(purpose_cases) == {}

purpose_cases := {
	"consent covers the instance's purpose": {
		"given": {"set": {"sender": "entry-us", "labels": {"region": "US", "consent": "analytics"}}},
		"destinations": [["analyse-us"], ["analyse-ch", "analyse-eu-a", "analyse-eu-b"]],
		"twins": {"consent without analytics": {
			"change": {"set": {"labels": {"consent": "billing,care"}}},
			"status": 451,
			"code": "PURPOSE_NOT_CONSENTED",
			"reasons": [
				"PURPOSE_NOT_CONSENTED analyse-ch",
				"PURPOSE_NOT_CONSENTED analyse-eu-a",
				"PURPOSE_NOT_CONSENTED analyse-eu-b",
				"PURPOSE_NOT_CONSENTED analyse-us",
			],
			"mentions": ["analyse-us processes for analytics; consent is billing,care"],
		}},
	},
	"consent must cover every purpose (purposes as a string)": {
		"given": {
			"set": {"step": "ingest", "sender": "entry-us", "labels": {"region": "US", "consent": "billing,marketing"}},
			"catalog_set": {"instances": {
				"ingest-eu": {"purposes": ["billing", "marketing"]},
				"ingest-us": {"purposes": "billing, marketing"},
			}},
		},
		"destinations": [["ingest-us"], ["ingest-eu"]],
		"twins": {"consent without marketing": {
			"change": {"set": {"labels": {"consent": "billing"}}},
			"status": 451,
			"code": "PURPOSE_NOT_CONSENTED",
			"reasons": ["PURPOSE_NOT_CONSENTED ingest-eu", "PURPOSE_NOT_CONSENTED ingest-us"],
			"mentions": ["ingest-us processes for marketing; consent is billing"],
		}},
	},
	"an instance without purposes needs no particular consent": {
		"given": {
			"set": {"sender": "entry-us", "labels": {"region": "US", "consent": "billing"}},
			"catalog_set": {"instances": {"analyse-us": {"purposes": []}}},
		},
		"destinations": [["analyse-us"]],
		"twins": {"the instance processes for research": {
			"change": {"catalog_set": {"instances": {"analyse-us": {"purposes": ["research"]}}}},
			"status": 451,
			"code": "PURPOSE_NOT_CONSENTED",
			"reasons": [
				"PURPOSE_NOT_CONSENTED analyse-ch",
				"PURPOSE_NOT_CONSENTED analyse-eu-a",
				"PURPOSE_NOT_CONSENTED analyse-eu-b",
				"PURPOSE_NOT_CONSENTED analyse-us",
			],
			"mentions": ["analyse-us processes for research"],
		}},
	},
}

# --- anonymous data ------------------------------------------------------------

test_anonymous_allowed if allowed_failures(anonymous_cases) == {}

test_anonymous_denied if denied_failures(anonymous_cases) == {}

anonymous_cases := {
	"anonymous data needs no consent": {
		"given": {"set": {"labels": {"category": "anonymous"}}, "unset": ["labels/consent"]},
		"destinations": [["analyse-eu-a", "analyse-eu-b"], ["analyse-ch", "analyse-us"]],
		"twins": {"personal data does": {
			"change": {"set": {"labels": {"category": "personal"}}},
			"status": 400,
			"code": "LABEL_MISSING",
			"reasons": ["LABEL_MISSING"],
			"mentions": ["label \"consent\"", "for category \"personal\""],
		}},
	},
	"anonymous EU data may go to the US": {
		"given": {
			"set": {"step": "backup", "sender": "entry-us", "labels": {"category": "anonymous"}},
			"catalog_unset": ["instances/backup-ch"],
		},
		"destinations": [["backup-us"]],
		"twins": {"personal EU data may not": {
			"change": {"set": {"labels": {"category": "personal"}}},
			"status": 451,
			"code": "RESIDENCY_VIOLATION",
			"reasons": ["RESIDENCY_VIOLATION backup-us"],
		}},
	},
	"anonymous data ignores purposes": {
		"given": {"set": {"labels": {"category": "anonymous", "consent": "billing"}}},
		"destinations": [["analyse-eu-a", "analyse-eu-b"], ["analyse-ch", "analyse-us"]],
		"twins": {
			"personal data does not": {
				"change": {"set": {"labels": {"category": "personal"}}},
				"status": 451,
				"code": "NO_COMPLIANT_INSTANCE",
				"reasons": [
					"PURPOSE_NOT_CONSENTED analyse-ch",
					"PURPOSE_NOT_CONSENTED analyse-eu-a",
					"PURPOSE_NOT_CONSENTED analyse-eu-b",
					"PURPOSE_NOT_CONSENTED analyse-us",
					"RESIDENCY_VIOLATION analyse-us",
				],
			},
			"but its consent must be known": {
				"change": {"set": {"labels": {"consent": "billing,spam"}}},
				"status": 400,
				"code": "LABEL_UNKNOWN",
				"reasons": ["LABEL_UNKNOWN"],
				"mentions": ["consent \"spam\" is unknown"],
			},
		},
	},
}

# --- label errors (400) --------------------------------------------------------

test_labels_allowed if allowed_failures(label_cases) == {}

test_labels_denied if denied_failures(label_cases) == {}

label_cases := {
	"well-labelled record": {
		"given": {},
		"destinations": [["analyse-eu-a", "analyse-eu-b"], ["analyse-ch"]],
		"twins": {
			"region absent": label_twin({"unset": ["labels/region"]}, "LABEL_MISSING", "x-data-region"),
			"region empty": label_twin(set_label("region", ""), "LABEL_MISSING", "x-data-region"),
			"region only blanks and commas": label_twin(set_label("region", " , "), "LABEL_MISSING", "region"),
			"region not a string": label_twin(set_label("region", 49), "LABEL_MISSING", "region"),
			"category absent": label_twin({"unset": ["labels/category"]}, "LABEL_MISSING", "x-data-category"),
			"consent absent": label_twin({"unset": ["labels/consent"]}, "LABEL_MISSING", "x-data-consent"),
			"consent empty": label_twin(set_label("consent", ""), "LABEL_MISSING", "category \"personal\""),
			"region unknown": label_twin(set_label("region", "XX"), "LABEL_UNKNOWN", "region \"XX\" is unknown"),
			"region is case-sensitive": label_twin(set_label("region", "eu"), "LABEL_UNKNOWN", "known: AU, BR"),
			"category unknown": label_twin(set_label("category", "secret"), "LABEL_UNKNOWN", "\"secret\""),
			"consent purpose unknown": label_twin(set_label("consent", "analytics,spying"), "LABEL_UNKNOWN", "spying"),
			"unknown label beats exclusions": label_twin(set_label("consent", "spying"), "LABEL_UNKNOWN", "spying"),
			"region labelled twice": label_twin(set_label("region", "EU,US"), "LABELS_CONTRADICTORY", "EU, US"),
			"category labelled twice": label_twin(
				set_label("category", "personal,anonymous"),
				"LABELS_CONTRADICTORY",
				"anonymous, personal",
			),
			"no labels at all": {
				"change": {"unset": ["labels"]},
				"status": 400,
				"code": "LABEL_MISSING",
				"reasons": ["LABEL_MISSING", "LABEL_MISSING"],
				"mentions": ["x-data-category", "x-data-region"],
			},
			"region twice, one unknown": {
				"change": set_label("region", "EU,XX"),
				"status": 400,
				"code": "INPUT_INVALID",
				"reasons": ["LABELS_CONTRADICTORY", "LABEL_UNKNOWN"],
				"mentions": ["input rejected", "EU, XX", "\"XX\" is unknown"],
			},
		},
	},
	"the same region repeated is one region": {
		"given": set_label("region", "EU,EU"),
		"destinations": [["analyse-eu-a", "analyse-eu-b"], ["analyse-ch"]],
		"twins": {"two regions": label_twin(set_label("region", "EU,CH"), "LABELS_CONTRADICTORY", "CH, EU")},
	},
	"blanks around values are ignored": {
		"given": {"set": {"labels": {"region": " EU ", "consent": "analytics , care"}}},
		"destinations": [["analyse-eu-a", "analyse-eu-b"], ["analyse-ch"]],
		"twins": {"consent made of blanks": label_twin(set_label("consent", " , "), "LABEL_MISSING", "consent")},
	},
}

set_label(name, value) := {"set": {"labels": {name: value}}}

label_twin(change, code, mention) := {
	"change": change,
	"status": 400,
	"code": code,
	"reasons": [code],
	"mentions": [mention],
}

# --- record (400) --------------------------------------------------------------

test_record_allowed if allowed_failures(record_cases) == {}

test_record_denied if denied_failures(record_cases) == {}

record_cases := {
	"record is an object": {
		"given": {},
		"destinations": [["analyse-eu-a", "analyse-eu-b"], ["analyse-ch"]],
		"twins": {
			"record absent": label_twin({"unset": ["record"]}, "RECORD_MALFORMED", "got nothing"),
			"record is a string": label_twin({"set": {"record": "alice"}}, "RECORD_MALFORMED", "got string"),
			"record is an array": label_twin({"set": {"record": [1, 2]}}, "RECORD_MALFORMED", "got array"),
			"record is null": label_twin({"set": {"record": null}}, "RECORD_MALFORMED", "got null"),
		},
	},
	"an empty object is a record": {
		"given": {"unset": ["record/subject"]},
		"destinations": [["analyse-eu-a", "analyse-eu-b"], ["analyse-ch"]],
		"twins": {"an empty string is not": label_twin({"set": {"record": ""}}, "RECORD_MALFORMED", "got string")},
	},
}

# --- sender and step (400) -----------------------------------------------------

test_sender_step_allowed if allowed_failures(sender_step_cases) == {}

test_sender_step_denied if denied_failures(sender_step_cases) == {}

sender_step_cases := {
	"a gateway sends to a known step": {
		"given": {},
		"destinations": [["analyse-eu-a", "analyse-eu-b"], ["analyse-ch"]],
		"twins": {
			"sender unknown": label_twin({"set": {"sender": "nobody"}}, "SENDER_UNKNOWN", "sender \"nobody\""),
			"sender absent": label_twin({"unset": ["sender"]}, "SENDER_UNKNOWN", "sender nothing"),
			"step unknown": label_twin(
				{"set": {"step": "archive"}},
				"STEP_UNKNOWN",
				"step \"archive\" (steps here: analyse, backup, ingest, store)",
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
		"given": {"set": {"sender": "ingest-us", "labels": {"region": "US"}}},
		"destinations": [["analyse-us"], ["analyse-ch", "analyse-eu-a", "analyse-eu-b"]],
		"twins": {"the instance is not in the catalog": label_twin(
			{"catalog_unset": ["instances/ingest-us"]},
			"SENDER_UNKNOWN",
			"\"ingest-us\"",
		)},
	},
}

# --- several reasons -----------------------------------------------------------

test_multiple_reasons_allowed if allowed_failures(multiple_reasons_cases) == {}

test_multiple_reasons_denied if denied_failures(multiple_reasons_cases) == {}

multiple_reasons_cases := {"EU health data to store": {
	"given": {"set": {"step": "store", "labels": {"category": "health"}}},
	"destinations": [["store-eu"]],
	"twins": {
		"consent without care": {
			"change": {"set": {"labels": {"consent": "analytics,billing"}}},
			"status": 451,
			"code": "NO_COMPLIANT_INSTANCE",
			"reasons": [
				"CERTIFICATION_MISSING store-ch",
				"PURPOSE_NOT_CONSENTED store-ch",
				"PURPOSE_NOT_CONSENTED store-eu",
				"PURPOSE_NOT_CONSENTED store-us",
				"RESIDENCY_VIOLATION store-us",
			],
			"mentions": ["no instance of step \"store\"", "store-ch holds none", "consent is analytics,billing"],
		},
		"a record-level violation hides the exclusions": {
			"change": {"set": {"sender": "nobody"}},
			"status": 400,
			"code": "SENDER_UNKNOWN",
			"reasons": ["SENDER_UNKNOWN"],
		},
	},
}}

# --- no catalog at all (the default catalog is empty) ---------------------------

test_catalog_absent_allowed if {
	decision := compliance.decision with input as base_input with data.complyroute.index as indexing.index(fixture_catalog)
	decision.destinations == [["analyse-eu-a", "analyse-eu-b"], ["analyse-ch"]]
}

test_catalog_absent_denied if {
	decision := compliance.decision with input as base_input
	decision.status == 400
	decision.code == "INPUT_INVALID"
	[reason.code | some reason in decision.reasons] == ["SENDER_UNKNOWN", "STEP_UNKNOWN"]
}
