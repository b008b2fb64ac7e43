"""A rule reading a label, a reference document or a candidate's index field the rule set lacks is refused, by name
(complyroute/policy/names.py), at policy-test, deploy and reload (engines.configure)."""


import pytest

from complyroute import engines
from complyroute.policy import names
from complyroute.policy.ruleset import RuleSet
from complyroute.topology import manifest
from complyroute.topology.plan import place

from tests.rulesets import shipped_with

RULE = '''
# METADATA
# title: Tenant
# description: Records of one tenant go only to its instances.
# custom:
#   code: TENANT
#   message: the instance does not serve the tenant
exclusions contains exclusion(rego.metadata.rule(), id, "tenant") if {{
	{condition}
	some id, _ in candidates
}}
'''


def with_rule(tmp_path, condition: str):
    return shipped_with(tmp_path, RULE.format(condition=condition))


@pytest.mark.parametrize("condition", ['label.region == "US"', 'input.labels["category"] == "health"',
                                       'object.get(label_values, "consent", set()) == set()', 'reference.adequacy.JP',
                                       'some candidate in candidates; candidate.certifications.iso', 'candidates[_].region == "US"'])
def test_a_rule_reading_what_the_rule_set_has_allowed(tmp_path, condition):
    assert names.unknown_names(with_rule(tmp_path, condition)) == []


@pytest.mark.parametrize(("condition", "named"), [
    ('label.tenant == "acme"', "label tenant, which the label schema lacks"),
    ('input.labels["tenant"] == "acme"', "label tenant, which the label schema lacks"),
    ('object.get(label_values, "tenant", set()) == {"acme"}', "label tenant, which the label schema lacks"),
    ('reference.tenants.acme', "reference document tenants, which the reference data lacks"),
    ('data.complyroute.reference.tenants.acme', "reference document tenants, which the reference data lacks"),
    ('some candidate in candidates; candidate.tenant == "acme"', "index field tenant, which the index of the example catalogs lacks"),
    ('candidates[_].tenant == "acme"', "index field tenant, which the index of the example catalogs lacks"),
])
def test_a_rule_reading_what_nothing_provides_denied(tmp_path, condition, named):
    policies = with_rule(tmp_path, condition)
    (problem,) = names.unknown_names(policies)
    row = len((policies / "complyroute" / "compliance" / "compliance.rego").read_text().splitlines()) - 2
    assert problem.startswith(f"complyroute/compliance/compliance.rego:{row} reads {named}")


def test_deploy_and_reload_refuse_it_denied(tmp_path):
    points = place(manifest.load("central-entity", services="2")).points
    with pytest.raises(engines.EngineError, match="compliance.rego:[0-9]+ reads label tenant"):
        engines.configure("envoy-opa", points, {}, RuleSet.of(with_rule(tmp_path, 'label.tenant == "acme"')), ahead=False)
