"""A rule set that adds a label to the shipped one's schema: `sensitivity` (x-data-sensitivity,
low or high), and a rule reading it, with its tests. What a reload adds to a running deployment
(tests/unit/runtime/local/test_label_reload.py, tests/e2e/test_reload_e2e.py)."""

import json
import shutil
from pathlib import Path

from complyroute.policy.policyfiles import POLICIES

SENSITIVITY_RULE = """
# METADATA
# title: High sensitivity stays protected
# description: records labelled sensitivity high go only to instances in GDPR or adequate regions.
# custom:
#   code: SENSITIVITY_UNPROTECTED
#   message: highly sensitive records may go only to instances in GDPR or adequate regions
exclusions contains exclusion(rego.metadata.rule(), id, detail) if {
	label.sensitivity == "high"
	some id, candidate in candidates
	not candidate.protected
	detail := sprintf("%s is in %v; sensitivity high", [id, object.get(candidate, "region", "no region")])
}
"""

SENSITIVITY_TEST = """package complyroute.sensitivity_test

import data.complyroute.compliance
import data.complyroute.compliance_test
import data.complyroute.indexing

# A personal record of a US subject from ingest-us to analyse, labelled with `sensitivity` (or not).
decide(labels) := decision if {
	hop := object.union(compliance_test.base_input, {
		"labels": object.union({"region": "US", "category": "personal", "consent": "analytics,billing,care"}, labels),
		"sender": "ingest-us",
	})
	decision := compliance.decision with input as hop
		with data.complyroute.index as indexing.index(compliance_test.fixture_catalog)
}

test_low_sensitivity_allowed if decide({"sensitivity": "low"}).destination == "analyse-us"

test_no_sensitivity_allowed if decide({}).destination == "analyse-us"

# Not to the US: a protected region's instance instead.
test_high_sensitivity_denied if decide({"sensitivity": "high"}).destination != "analyse-us"

test_unknown_sensitivity_denied if decide({"sensitivity": "secret"}).reasons[0].code == "LABEL_UNKNOWN"
"""


def rule_set_with_label(folder: Path, required: bool = False, base: Path = POLICIES) -> Path:
    """`base` copied under `folder` with the label sensitivity (optional, or `required`), its
    values, the rule reading it and its tests."""
    policies = folder / "policies"
    shutil.copytree(base, policies)
    reference = policies / "complyroute" / "reference" / "data.json"
    data = json.loads(reference.read_text())
    data["labels"]["sensitivity"] = {"header": "x-data-sensitivity", "values": "sensitivities", "required": required}
    data["sensitivities"] = {"low": {}, "high": {}}
    reference.write_text(json.dumps(data, indent=1))
    compliance = policies / "complyroute" / "compliance" / "compliance.rego"
    compliance.write_text(compliance.read_text() + SENSITIVITY_RULE)
    (policies / "complyroute" / "compliance" / "sensitivity_test.rego").write_text(SENSITIVITY_TEST)
    return policies
