# METADATA
# title: complyroute catalog index tests
# description: |
#   Table-driven: each case names an instance of fixture_catalog and the
#   candidate entry the index holds for it; test_candidates_allowed covers the
#   instances that may receive personal data of GDPR subjects (protected),
#   test_candidates_denied those that may not.
package complyroute.indexing_test

import data.complyroute.indexing

fixture_catalog := {
	"gateways": {
		"entry": {"region": "EU", "node": "gateway"},
		"nowhere": {"node": "gateway"},
		"ingest-eu": {"region": "US", "node": "gateway"},
	},
	"instances": {
		"ingest-eu": {
			"step": "ingest",
			"region": "EU",
			"certifications": ["health-data", "health-data"],
			"purposes": ["care"],
		},
		"analyse-ch": {"step": "analyse", "region": "CH", "certifications": "iso-27001, health-data", "purposes": []},
		"analyse-us": {"step": "analyse", "region": "US", "purposes": "billing,analytics"},
		"analyse-none": {"step": "analyse"},
	},
}

fixture_index := indexing.index(fixture_catalog)

candidate_failures(cases) := {name: got |
	some name, case in cases
	got := object.get(fixture_index.steps, [case.step, case.id], "absent")
	got != case.candidate
}

test_candidates_allowed if candidate_failures(protected_cases) == {}

test_candidates_denied if candidate_failures(unprotected_cases) == {}

protected_cases := {
	"a GDPR region; repeated certifications count once": {
		"step": "ingest",
		"id": "ingest-eu",
		"candidate": {
			"region": "EU",
			"protected": true,
			"certifications": {"health-data": true},
			"purposes": {"care": true},
			"needs": needs_of({"care": true}),
		},
	},
	"an adequate region; certifications as a comma-separated string": {
		"step": "analyse",
		"id": "analyse-ch",
		"candidate": {
			"region": "CH",
			"protected": true,
			"certifications": {"iso-27001": true, "health-data": true},
			"purposes": {},
			"needs": needs_of({}),
		},
	},
}

unprotected_cases := {
	"neither GDPR nor adequate; purposes as a string, certifications absent": {
		"step": "analyse",
		"id": "analyse-us",
		"candidate": {
			"region": "US",
			"protected": false,
			"certifications": {},
			"purposes": {"billing": true, "analytics": true},
			"needs": needs_of({"billing": true, "analytics": true}),
		},
	},
	"no region": {
		"step": "analyse",
		"id": "analyse-none",
		"candidate": {"protected": false, "certifications": {}, "purposes": {}, "needs": needs_of({})},
	},
}

# A record of a personal category needs consent to every purpose of the instance.
needs_of(purposes) := {"anonymous": {}, "personal": purposes, "health": purposes}

# Every instance and gateway is a sender, with its region when it has one; an
# instance wins a clash with a gateway.
test_senders_allowed if {
	fixture_index.senders == {
		"entry": {"region": "EU"},
		"nowhere": {},
		"ingest-eu": {"region": "EU"},
		"analyse-ch": {"region": "CH"},
		"analyse-us": {"region": "US"},
		"analyse-none": {},
	}
}

test_senders_denied if {
	empty := indexing.index({})
	[empty.senders, empty.steps, empty.preferred] == [{}, {}, {}]
}

# The candidate the destination rule tries first, for each sender and step: the
# smallest id in the sender's region, else the smallest id.
test_preferred_allowed if {
	fixture_index.preferred == {
		"entry": {"ingest": "ingest-eu", "analyse": "analyse-ch"},
		"nowhere": {"ingest": "ingest-eu", "analyse": "analyse-ch"},
		"ingest-eu": {"ingest": "ingest-eu", "analyse": "analyse-ch"},
		"analyse-ch": {"ingest": "ingest-eu", "analyse": "analyse-ch"},
		"analyse-us": {"ingest": "ingest-eu", "analyse": "analyse-us"},
		"analyse-none": {"ingest": "ingest-eu", "analyse": "analyse-ch"},
	}
}

test_preferred_denied if {
	not fixture_index.preferred.entry.store
	not fixture_index.preferred.nobody
}

# What labels ask of an instance, held by its candidate entry or not: allowed
# cases hold it, denied cases do not (residency, certification).
asks_failures(cases) := {name |
	some name, case in cases
	asks := fixture_index.asks[case.region][case.category]
	object.subset(fixture_index.steps[case.step][case.id], asks) != case.holds
}

asked(region, category, step, id, holds) := {
	"region": region,
	"category": category,
	"step": step,
	"id": id,
	"holds": holds,
}

test_asks_allowed if asks_failures(held_asks) == set()

test_asks_denied if asks_failures(unheld_asks) == set()

held_asks := {
	"EU health data, certified EU instance": asked("EU", "health", "ingest", "ingest-eu", true),
	"EU personal data, adequate instance": asked("EU", "personal", "analyse", "analyse-ch", true),
	"US personal data, US instance": asked("US", "personal", "analyse", "analyse-us", true),
	"EU anonymous data, US instance": asked("EU", "anonymous", "analyse", "analyse-us", true),
}

unheld_asks := {
	"EU personal data, US instance": asked("EU", "personal", "analyse", "analyse-us", false),
	"NO personal data, no region": asked("NO", "personal", "analyse", "analyse-none", false),
	"US health data, uncertified instance": asked("US", "health", "analyse", "analyse-us", false),
}

# Each canonical consent label names its purposes; other forms are not labels.
test_consents_allowed if {
	fixture_index.consents["analytics,billing,care"] == {"analytics": true, "billing": true, "care": true}
	fixture_index.consents.research == {"research": true}
	count(fixture_index.consents) == 63
}

test_consents_denied if {
	not fixture_index.consents["billing,analytics"] # not sorted
	not fixture_index.consents["billing,billing"]
	not fixture_index.consents["billing, care"]
	not fixture_index.consents[""]
}

# One document per point, rooted at data; JSON as it is, since a point loads
# it from a file and the policy tests use it unserialized.
test_documents_allowed if {
	documents := indexing.documents with input as {"catalogs": {"p1": fixture_catalog, "p2": {}}}
	documents == {
		"p1": {"complyroute": {"index": fixture_index}},
		"p2": {"complyroute": {"index": indexing.index({})}},
	}
	json.unmarshal(json.marshal(documents)) == documents
}

test_documents_denied if {
	documents := indexing.documents with input as {}
	documents == {}
}
