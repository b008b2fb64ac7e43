"""The differential check (engines/differential.py) refuses precomputed answers the full decision
would route otherwise for a record, a clock time or a request id the decision space does not
enumerate, and passes honest ones. Real OPA over a central entity of two services; a rule that
reads the body or the clock is tabled here only when OPA's partial evaluation is made to say it
may be (the analysis stood in for by one that misses it), as a hidden form of a rule would be."""


import pytest

from complyroute.engines import EngineError, differential, envoy_opa, independence, precompute
from complyroute.policy.policyfiles import POLICIES
from complyroute.topology import manifest
from complyroute.topology.plan import place

from tests.rulesets import shipped_with

HIDDEN = '''
# METADATA
# title: Hidden
# description: Excludes every candidate when the condition holds.
# custom:
#   code: HIDDEN
#   message: a hidden rule
exclusions contains exclusion(rego.metadata.rule(), id, "hidden") if {{
	{condition}
	some id, _ in candidates
}}
'''

# Conditions false for the empty record, today and for any request id the space asks with, so
# that the table built over the space holds answers the condition would change.
CONDITIONS = {
    "an example record's field": 'input.record.diagnosis == "J45"',  # policies/examples/eu-health-denied.json's
    "a field with another value": "input.record.amount == 0",  # a field the examples mention, a value they do not
    "the clock": 'time.date([time.now_ns(), "UTC"])[0] >= 2100',
}


def with_rule(tmp_path, condition: str):
    return shipped_with(tmp_path, HIDDEN.format(condition=condition))


def points():
    return place(manifest.load("central-entity", services="2")).points


@pytest.mark.parametrize("condition", CONDITIONS.values(), ids=CONDITIONS.keys())
def test_a_table_the_analysis_let_through_is_refused_by_the_differential_check_denied(tmp_path, monkeypatch, condition):
    monkeypatch.setattr(independence, "dependent", lambda space, labellings, policies: [])  # an analysis that misses the read
    monkeypatch.setattr(precompute, "CACHE", tmp_path / "cache")
    with pytest.raises(EngineError, match=r"differ from the rule set .* the rule set decides HIDDEN: .*hidden"):
        envoy_opa.decided_data(points(), with_rule(tmp_path, condition))


@pytest.mark.parametrize("condition", CONDITIONS.values(), ids=CONDITIONS.keys())
def test_the_same_rule_set_with_opa_s_analysis_passes_the_differential_check_allowed(tmp_path, condition):
    _, precomputed = envoy_opa.decided_data(points(), with_rule(tmp_path, condition))
    assert precomputed.answers and not precomputed.outcomes  # every answer left to OPA in full, nothing to refuse


@pytest.fixture(scope="module")
def shipped():
    data, precomputed = envoy_opa.decided_data(points(), POLICIES)
    return data, precomputed


def test_the_honest_table_passes_allowed(shipped):
    data, precomputed = shipped
    assert precomputed.outcomes
    differential.check(precomputed.outcomes, precomputed.space, data, POLICIES)


def test_a_table_with_one_wrong_entry_is_refused_denied(shipped):
    data, precomputed = shipped
    outcomes = dict(precomputed.outcomes)
    labelling = min(outcomes, key=independence.order)
    destination, revision = outcomes[labelling]
    outcomes[labelling] = ("svc-nowhere", revision)
    with pytest.raises(EngineError, match="the table routes it to svc-nowhere"):
        differential.check({labelling: outcomes[labelling]}, precomputed.space, data, POLICIES)
