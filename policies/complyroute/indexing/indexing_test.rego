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

# A case names the fields it owns (and any it expects absent): an index that adds a field of
# its own breaks no case.
candidate_failures(cases) := {name: got |
	some name, case in cases
	got := object.get(fixture_index.steps, [case.step, case.id], "absent")
	not holds(got, case)
}

holds(got, case) if {
	is_object(got)
	every field, value in case.candidate {
		got[field] == value
	}
	every field in object.get(case, "absent", []) {
		not field in object.keys(got)
	}
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
		},
	},
	"no region": {
		"step": "analyse",
		"id": "analyse-none",
		"candidate": {"protected": false, "certifications": {}, "purposes": {}},
		"absent": ["region"],
	},
}

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
	empty == {"senders": {}, "steps": {}}
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
