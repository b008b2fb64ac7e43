# METADATA
# title: NAME catalog index tests
# description: each instance's candidate entry, with its region and without one.
package complyroute.indexing_test

import data.complyroute.indexing

fixture_index := indexing.index({
	"gateways": {"entry": {"region": "EU"}, "ingest-eu": {"region": "US"}},
	"instances": {
		"ingest-eu": {"step": "ingest", "region": "EU"},
		"analyse-none": {"step": "analyse"},
	},
})

test_candidates_allowed if fixture_index.steps.ingest["ingest-eu"] == {"region": "EU"}

test_candidates_denied if fixture_index.steps.analyse["analyse-none"] == {}

# An instance wins a clash with a gateway of the same id.
test_senders_allowed if fixture_index.senders == {
	"entry": {"region": "EU"},
	"ingest-eu": {"region": "EU"},
	"analyse-none": {},
}

# Every point gets its own catalog's index, and nothing for a point without a catalog.
test_documents_allowed if {
	documents := indexing.documents with input as {"catalogs": {"entry": {"gateways": {"entry": {"region": "EU"}}}}}
	documents == {"entry": {"complyroute": {"index": {"senders": {"entry": {"region": "EU"}}, "steps": {}}}}}
}

test_documents_denied if {
	documents := indexing.documents with input as {"catalogs": {}}
	documents == {}
}
