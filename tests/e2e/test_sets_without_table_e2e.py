"""A rule set that reads the record's body has no table: OPA decides every hop in full, with the
body. Its points still hold a cluster for every compliant set its answers name (Precomputed.answers),
so the data plane balances inside a set exactly as it does with a table. The mixed-regions example
in the central entity under the compiled engine: EU personal records, each of whose steps has a set
of two EU replicas; each replica takes 50 +- 10% of a step's records, with the shipped (tabled) rule
set and with the same rules plus one that reads the body (a record that holds `quarantine: true`
goes nowhere; the records balanced hold none)."""

import io
from collections import Counter

import pytest

from complyroute.policy.policyfiles import POLICIES
from complyroute.runtime.local import deployment

from tests.rulesets import shipped_with

from .helpers import EU_PERSONAL, RECORD, deploy_mixed_regions, post

# Envoy's least-request balancing picks at random between instances with nothing in flight (the
# records go one at a time): a replica's share of N records has a standard deviation of
# 0.5 / sqrt(N), 2.5% at 400, so the 10% bound is four of them (a false failure about once in
# 15,000 runs of one step).
RECORDS = 400
BODY_RULE = '''
# METADATA
# title: Quarantined record
# description: A record whose body says quarantine goes nowhere.
# custom:
#   code: RECORD_QUARANTINED
#   message: the record is quarantined
exclusions contains exclusion(rego.metadata.rule(), id, "quarantined") if {
	input.record.quarantine == true
	some id, _ in candidates
}
'''


def body_reading(folder):
    return shipped_with(folder, BODY_RULE)


@pytest.fixture(scope="module", params=["tabled", "body-reading"])
def deployed(request, tmp_path_factory):
    policies = POLICIES if request.param == "tabled" else body_reading(tmp_path_factory.mktemp("rules"))
    state, _ = deploy_mixed_regions("central-entity", policies=policies, engine="envoy-compiled")
    yield request.param, state
    deployment.stop(out=io.StringIO())


def test_each_replica_of_a_set_takes_half_of_its_step_s_records_allowed(deployed):
    kind, state = deployed
    taken = Counter()
    for _ in range(RECORDS):
        _, answer = post(state, EU_PERSONAL, RECORD)
        assert answer.status == 200, answer.text[:300]
        taken.update(entry["instance"] for entry in answer.body["path"])
    for step in ("ingest-eu", "analyse-eu", "store-eu"):
        shares = [taken[f"{step}-{number}"] / RECORDS for number in (1, 2)]
        assert all(0.4 <= share <= 0.6 for share in shares), f"{kind}: {step} replicas took {shares} of {RECORDS} records"


def test_a_record_the_body_rule_excludes_goes_nowhere_denied(deployed):
    kind, state = deployed
    _, answer = post(state, EU_PERSONAL, {**RECORD, "quarantine": True})
    if kind == "tabled":
        assert answer.status == 200  # the shipped rules do not read it
    else:
        assert answer.status == 451 and "the record is quarantined" in answer.body["message"], answer.text[:300]
