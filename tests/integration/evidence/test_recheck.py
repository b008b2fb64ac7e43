"""The audit's re-check (complyroute/evidence/recheck.rego) with real OPA: a reception is allowed
when its instance is in the compliant set the rule set gives for the hop, in any tier, under
this checkout's rules and under a revision from before the decision gave sets."""

import pytest

from complyroute.authoring import policydiff
from complyroute.evidence import audit
from complyroute.policy import policydata
from complyroute.policy.policyfiles import POLICIES

# The entry of a US gateway deciding the ingest step: an EU replica pair and a US instance.
CATALOG = {
    "gateways": {"gateway": {"region": "US", "node": "gateway"}},
    "instances": {
        "ingest-eu-1": {"step": "ingest", "region": "EU", "node": "node-1", "certifications": [], "purposes": ["care"]},
        "ingest-eu-2": {"step": "ingest", "region": "EU", "node": "node-2", "certifications": [], "purposes": ["care"]},
        "ingest-us": {"step": "ingest", "region": "US", "node": "node-3", "certifications": [], "purposes": ["care"]},
    },
}
US_PERSONAL = {"region": "US", "category": "personal", "consent": "care"}  # [[ingest-us], [ingest-eu-1, ingest-eu-2]]
EU_PERSONAL = {"region": "EU", "category": "personal", "consent": "care"}  # [[ingest-eu-1, ingest-eu-2]]


def hop(instance: str, labels: dict) -> dict:
    return {"point": "entry", "sender": "gateway", "step": "ingest", "instance": instance, "labels": labels}


def allowed(instances_and_labels: list[tuple[str, dict]], policies=POLICIES) -> list[bool]:
    points = {"entry": policydata.opa_data({"entry": CATALOG}, policies)["entry"]}
    hops = [hop(instance, labels) for instance, labels in instances_and_labels]
    kept = audit.allowed_hops(hops, points, policies)
    return [i in kept for i in range(len(hops))]


def test_any_instance_of_the_set_may_receive_allowed():
    # The first tier, the second tier, and either replica of a tier.
    assert allowed([("ingest-us", US_PERSONAL), ("ingest-eu-2", US_PERSONAL), ("ingest-eu-1", EU_PERSONAL),
                    ("ingest-eu-2", EU_PERSONAL)]) == [True, True, True, True]


def test_an_instance_outside_the_set_is_a_forbidden_reception_denied():
    assert allowed([("ingest-us", EU_PERSONAL), ("ingest-eu-1", {**EU_PERSONAL, "consent": "billing"})]) == [False, False]


@pytest.fixture(scope="module")
def before_sets(tmp_path_factory):
    """The shipped rule set at 8ed2ef9, whose decision named one destination."""
    folder = tmp_path_factory.mktemp("before-sets")
    return policydiff.rule_set_at("8ed2ef9", folder)


def test_a_revision_from_before_sets_allows_its_one_destination_allowed(before_sets):
    # Its choice then: the smallest id in the sender's region, else the smallest id.
    assert allowed([("ingest-us", US_PERSONAL), ("ingest-eu-1", EU_PERSONAL)], before_sets) == [True, True]


def test_a_revision_from_before_sets_allows_no_other_instance_denied(before_sets):
    assert allowed([("ingest-eu-1", US_PERSONAL), ("ingest-eu-2", EU_PERSONAL)], before_sets) == [False, False]
