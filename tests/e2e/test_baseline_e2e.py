"""The baseline enforces nothing: the same records the enforcing topologies stop get through.

These tests pin that down, so a comparison with the baseline measures the cost of
enforcement and nothing else: no policy is asked, no OPA runs.
"""

import pytest

from complyroute.runtime.local import deployment

from .helpers import deploy_mixed_regions, instances_reached, post, wait_for_audit


CHAIN = ["ingest-eu-1", "analyse-eu-1", "store-eu-1"]  # the first instance of every step


@pytest.fixture(scope="module")
def baseline():
    state, _ = deploy_mixed_regions("baseline")
    yield state
    deployment.stop()


def test_baseline_runs_no_policy(baseline):
    assert not [p for p in baseline["parts"] if p["kind"] == "opa"]


def test_baseline_delivers_a_record_the_policy_allows(baseline):
    request_id, answer = post(baseline, {"region": "EU", "category": "personal", "consent": "care,billing"})
    assert answer.status == 200, answer.text
    assert [hop["instance"] for hop in answer.body["path"]] == CHAIN


def test_baseline_delivers_health_data_to_an_uncertified_instance(baseline):
    # Every enforcing topology answers 451 CERTIFICATION_MISSING here.
    request_id, answer = post(baseline, {"region": "EU", "category": "health", "consent": "care,billing"})
    assert answer.status == 200, answer.text
    wait_for_audit(baseline, request_id, 3)
    assert "store-eu-1" in instances_reached(baseline, request_id)


def test_baseline_ignores_consent(baseline):
    # Every enforcing topology answers 451 PURPOSE_NOT_CONSENTED here.
    request_id, answer = post(baseline, {"region": "EU", "category": "personal", "consent": "care"})
    assert answer.status == 200, answer.text


def test_baseline_refuses_unlabelled_records_only_at_the_service(baseline):
    # No enforcement point stops it; the first service's own input validation does.
    request_id, answer = post(baseline, {})
    assert answer.status == 400 and answer.body["code"] == "LABEL_MISSING", answer.text
