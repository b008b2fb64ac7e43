"""A new topology is its folder and its manifest, nothing else: the hub topology (tests/conftest.py),
written into a temporary folder, deploys and carries a record, and its hub denies the twin the
rules deny."""

from complyroute.runtime.local import deployment, supervision

from tests.rulesets import of_manifest

from .helpers import instances_reached, post, wait_for_audit


ALL_PURPOSES = {"region": "EU", "category": "personal", "consent": "billing,analytics,care"}


def test_a_topology_written_in_the_test_carries_a_record_allowed_and_its_denied_twin_denied(hub_topology):
    if deployment.read_state():
        deployment.stop()
    state = deployment.deploy(hub_topology, of_manifest(hub_topology))
    try:
        assert state["enforces"]
        _, answer = post(state, ALL_PURPOSES)
        assert answer.status == 200, answer.text
        assert [hop["instance"] for hop in answer.body["path"]] == ["svc-01", "svc-02", "svc-03"]
        # svc-02 processes for analytics, which this record does not consent to: the hub refuses the hop into it.
        request_id, answer = post(state, {**ALL_PURPOSES, "consent": "billing"})
        assert answer.status == 451, answer.text
        wait_for_audit(state, request_id, 1)
        assert instances_reached(state, request_id) == {"svc-01"}
    finally:
        pids = [p["pid"] for p in state["parts"]]
        deployment.stop()
    assert not [pid for pid in pids if supervision.alive(pid)]
