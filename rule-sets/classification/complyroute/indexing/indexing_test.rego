# METADATA
# title: classification catalog index tests
# description: |
#   Table-driven: each case names an instance of fixture_catalog and the
#   candidate entry the index holds for it; test_candidates_allowed covers the
#   instances cleared above public, test_candidates_denied those that hold
#   public only (no clearance, an unknown one) or are quarantined.
package complyroute.indexing_test

import data.complyroute.indexing

fixture_catalog := {
	"gateways": {
		"entry": {"region": "EU", "node": "gateway"},
		"nowhere": {"node": "gateway"},
		"store-eu": {"region": "US", "node": "gateway"},
	},
	"instances": {
		"store-eu": {
			"step": "store",
			"region": "EU",
			"clearance": ["secret"],
			"retains": ["short", "long", "short"],
			"purposes": ["care"],
			"quarantined": ["no"],
		},
		"store-us": {
			"step": "store",
			"region": "US",
			"clearance": "confidential, secret",
			"retains": "standard",
			"purposes": "marketing, support",
		},
		"store-ca": {"step": "store", "region": "CA", "clearance": ["cosmic"], "quarantined": "yes"},
		"store-none": {"step": "store", "clearance": []},
	},
}

fixture_index := indexing.index(fixture_catalog)

candidate_failures(cases) := {name: got |
	some name, case in cases
	got := object.get(fixture_index.steps, [case.step, case.id], "absent")
	got != case.candidate
}

test_candidates_allowed if candidate_failures(cleared_cases) == {}

test_candidates_denied if candidate_failures(uncleared_cases) == {}

cleared_cases := {
	"one clearance; repeated retentions count once; quarantined no": {
		"step": "store",
		"id": "store-eu",
		"candidate": {
			"region": "EU",
			"clearance": {"name": "secret", "level": 3},
			"retains": {"short": true, "long": true},
			"purposes": {"care": true},
			"quarantined": false,
		},
	},
	"several clearances as a string grant the lowest; attributes as strings": {
		"step": "store",
		"id": "store-us",
		"candidate": {
			"region": "US",
			"clearance": {"name": "confidential", "level": 2},
			"retains": {"standard": true},
			"purposes": {"marketing": true, "support": true},
			"quarantined": false,
		},
	},
}

uncleared_cases := {
	"an unknown clearance holds public; quarantined as a string": {
		"step": "store",
		"id": "store-ca",
		"candidate": {
			"region": "CA",
			"clearance": {"name": "public", "level": 0},
			"retains": {},
			"purposes": {},
			"quarantined": true,
		},
	},
	"no region, an empty clearance": {
		"step": "store",
		"id": "store-none",
		"candidate": {
			"clearance": {"name": "public", "level": 0},
			"retains": {},
			"purposes": {},
			"quarantined": false,
		},
	},
}

# Every instance and gateway is a sender, with its region when it has one; an
# instance wins a clash with a gateway.
test_senders_allowed if {
	fixture_index.senders == {
		"entry": {"region": "EU"},
		"nowhere": {},
		"store-eu": {"region": "EU"},
		"store-us": {"region": "US"},
		"store-ca": {"region": "CA"},
		"store-none": {},
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
