# METADATA
# title: NAME compliance tests
# description: |
#   Table-driven: each case is a hop through fixture_catalog and the
#   destinations the rule set allows it; its denied twin differs in one label
#   and is denied with the code it names.
package complyroute.compliance_test

import data.complyroute.compliance
import data.complyroute.indexing

fixture_catalog := {
	"gateways": {"entry": {"region": "EU"}},
	"instances": {
		"ingest-eu": {"step": "ingest", "region": "EU"},
		"analyse-eu": {"step": "analyse", "region": "EU"},
		"analyse-us": {"step": "analyse", "region": "US"},
		"store-eu": {"step": "store", "region": "EU"},
	},
}

decided(hop) := decision if {
	decision := compliance.decision with input as object.union({"record": {}, "sender": "ingest-eu"}, hop)
		with data.complyroute.index as indexing.index(fixture_catalog)
}

residency_allowed := {
	"eu record to analyse": {"hop": {"labels": {"region": "EU"}, "step": "analyse"}, "destinations": [["analyse-eu"]]},
	"us record to analyse": {"hop": {"labels": {"region": "US"}, "step": "analyse"}, "destinations": [["analyse-us"]]},
}

residency_denied := {
	"us record to store": {"hop": {"labels": {"region": "US"}, "step": "store"}, "code": "REGION_MISMATCH"},
	"unlabelled record": {"hop": {"labels": {}, "step": "analyse"}, "code": "LABEL_MISSING"},
}

test_residency_allowed if {
	failures := {name: decision |
		some name, case in residency_allowed
		decision := decided(case.hop)
		decision.destinations != case.destinations
	}
	failures == {}
}

test_residency_denied if {
	failures := {name: decision |
		some name, case in residency_denied
		decision := decided(case.hop)
		not denied_with(decision, case.code)
	}
	failures == {}
}

denied_with(decision, code) if {
	decision.allowed == false
	decision.code == code
}
