"""End to end: the mixed-regions example deployed as real Envoy, OPA and service processes.

Five instances in three steps (ingest, analyse, store) with EU and US replicas; the gateway
is in the US. Records are sent to the real entry; the answers, and afterwards the audit log
every instance wrote, show where each record went.
"""

import json
import os
import signal
import time
import uuid
from pathlib import Path

import pytest

from complyroute import deployment, manifest
from complyroute.client import send

pytestmark = pytest.mark.e2e

MANIFEST = "topologies/examples/mixed-regions.yaml"
REFERENCE = json.loads(manifest.REFERENCE_DATA.read_text())
EU_PERSONAL = {"region": "EU", "category": "personal", "consent": "care,billing"}
US_PERSONAL = {"region": "US", "category": "personal", "consent": "care,billing"}
EU_HEALTH = {"region": "EU", "category": "health", "consent": "care,billing"}
RECORD = {"subject": "alice", "reading": 42}


@pytest.fixture(scope="module")
def deployed():
    if deployment.read_state():
        deployment.stop()  # the test needs the entry port; a running deployment is replaced
    topology = manifest.load(MANIFEST)
    state = deployment.deploy(topology)
    yield state, topology
    deployment.stop()


def post(state, labels, record=RECORD, **kwargs):
    request_id = kwargs.pop("request_id", None) or f"e2e-{uuid.uuid4()}"
    return request_id, send(state["entry_url"], labels, record, request_id=request_id, **kwargs)


def audit_lines(state) -> list[dict]:
    lines = []
    for path in sorted(Path(state["run_dir"], "audit").glob("*.jsonl")):
        lines += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return lines


def wait_for_audit(state, request_id, count, timeout=5.0):
    """Audit lines are written through a stream; give the last one a moment to land."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        seen = [line for line in audit_lines(state) if line["request_id"] == request_id]
        if len(seen) >= count:
            return seen
        time.sleep(0.05)
    return [line for line in audit_lines(state) if line["request_id"] == request_id]


def instances_reached(state, request_id):
    return {line["instance"] for line in audit_lines(state) if line["request_id"] == request_id}


def in_eu_or_adequate(region):
    return REFERENCE["regions"][region]["gdpr"] or region in REFERENCE["adequacy"]


def test_eu_personal_record_travels_only_through_eu_instances_allowed(deployed):
    state, _ = deployed
    request_id, answer = post(state, EU_PERSONAL)
    assert answer.status == 200, answer.text
    assert answer.body["request_id"] == request_id
    assert [hop["instance"] for hop in answer.body["path"]] == ["ingest-eu", "analyse-eu", "store-eu"]
    assert all(hop["region"] == "EU" for hop in answer.body["path"])
    for hop in answer.body["path"]:
        assert hop["t_in"] <= hop["t_out"]
    assert instances_reached(state, request_id) == {"ingest-eu", "analyse-eu", "store-eu"}


def test_eu_personal_record_without_consent_to_last_step_denied(deployed):
    state, _ = deployed
    request_id, answer = post(state, {**EU_PERSONAL, "consent": "care"})
    assert answer.status == 451, answer.text
    assert answer.body["code"] == "PURPOSE_NOT_CONSENTED"
    assert answer.body["request_id"] == request_id
    assert [r["instance"] for r in answer.body["reasons"]] == ["store-eu"]
    wait_for_audit(state, request_id, 2)
    assert instances_reached(state, request_id) == {"ingest-eu", "analyse-eu"}


def test_us_personal_record_may_use_us_instances_allowed(deployed):
    state, _ = deployed
    request_id, answer = post(state, US_PERSONAL)
    assert answer.status == 200, answer.text
    # The gateway and the US replicas share a region, so the policy prefers them.
    assert [hop["instance"] for hop in answer.body["path"]] == ["ingest-us", "analyse-us", "store-eu"]


def test_eu_personal_record_never_takes_the_preferred_us_replica_denied(deployed):
    state, _ = deployed
    request_id, answer = post(state, EU_PERSONAL)
    assert answer.status == 200
    assert not {"ingest-us", "analyse-us"} & {hop["instance"] for hop in answer.body["path"]}
    assert not {"ingest-us", "analyse-us"} & instances_reached(state, request_id)


def test_health_record_goes_to_certified_instance_over_preferred_region_allowed(deployed):
    state, _ = deployed
    # A US health record: the gateway prefers US instances, but analyse-us is not certified
    # for health data, so the analyse hop goes to the certified analyse-eu instead.
    request_id, answer = post(state, {**US_PERSONAL, "category": "health"})
    wait_for_audit(state, request_id, 2)
    assert instances_reached(state, request_id) == {"ingest-us", "analyse-eu"}
    assert answer.status == 451 and answer.body["code"] == "CERTIFICATION_MISSING"  # store has none


def test_eu_health_record_meeting_step_without_certified_instance_denied(deployed):
    state, _ = deployed
    request_id, answer = post(state, EU_HEALTH)
    assert answer.status == 451, answer.text
    assert answer.body["code"] == "CERTIFICATION_MISSING"
    assert answer.body["request_id"] == request_id
    assert {r["instance"] for r in answer.body["reasons"]} == {"store-eu"}
    wait_for_audit(state, request_id, 2)
    assert "store-eu" not in instances_reached(state, request_id)


@pytest.mark.parametrize(
    "labels, code",
    [
        ({}, "LABEL_MISSING"),
        ({"region": "EU", "consent": "care"}, "LABEL_MISSING"),
        ({"region": "Atlantis", "category": "personal", "consent": "care"}, "LABEL_UNKNOWN"),
        ({"region": "EU,US", "category": "personal", "consent": "care"}, "LABELS_CONTRADICTORY"),
    ],
)
def test_badly_labelled_record_refused_before_any_instance_denied(deployed, labels, code):
    state, _ = deployed
    request_id, answer = post(state, labels)
    assert answer.status == 400, answer.text
    assert answer.body["code"] == code
    time.sleep(0.2)
    assert instances_reached(state, request_id) == set()


@pytest.mark.parametrize("body", ['{"subject": "alice"', "[1, 2]", "not json"])
def test_malformed_record_refused_before_any_instance_denied(deployed, body):
    state, _ = deployed
    request_id, answer = post(state, EU_PERSONAL, record=body)
    assert answer.status == 400, answer.text
    assert answer.body["code"] == "RECORD_MALFORMED"
    time.sleep(0.2)
    assert instances_reached(state, request_id) == set()


def test_client_set_routing_header_changes_nothing_allowed(deployed):
    state, _ = deployed
    # The client asks for the US replica; the policy still picks ingest-eu for an EU record.
    request_id, answer = post(state, EU_PERSONAL, headers={"x-complyroute-destination": "ingest-us"})
    assert answer.status == 200, answer.text
    assert [hop["instance"] for hop in answer.body["path"]] == ["ingest-eu", "analyse-eu", "store-eu"]


def test_client_set_routing_header_cannot_force_a_denied_hop_denied(deployed):
    state, _ = deployed
    request_id, answer = post(state, EU_HEALTH, headers={"x-complyroute-destination": "store-eu"})
    assert answer.status == 451
    wait_for_audit(state, request_id, 2)
    assert "store-eu" not in instances_reached(state, request_id)


def test_service_set_routing_header_at_egress_changes_nothing_denied(deployed):
    state, topology = deployed
    # Acting as ingest-eu, send an EU record to its sidecar's egress asking for the US replica.
    egress = next(p for p in state["parts"] if p["name"] == "sidecar-ingest-eu/envoy")
    config = Path(egress["command"][2]).read_text()
    assert "egress" in config
    ingest_eu = next(i for i in topology.instances if i.id == "ingest-eu")
    url = f"http://{ingest_eu.node.address}:{22000 + ingest_eu.index}/process"
    request_id = f"e2e-{uuid.uuid4()}"
    answer = send(url, EU_PERSONAL, RECORD, request_id=request_id, headers={"x-complyroute-destination": "analyse-us"})
    assert answer.status == 200, answer.text
    assert [hop["instance"] for hop in answer.body["path"]] == ["analyse-eu", "store-eu"]
    assert "analyse-us" not in instances_reached(state, request_id)


def test_audit_logs_show_no_forbidden_record_reached_any_instance(deployed):
    state, topology = deployed
    catalog = {i.id: i for i in topology.instances}
    lines = audit_lines(state)
    assert len(lines) >= 10  # the tests above delivered records; an empty log would prove nothing
    for line in lines:
        instance = catalog[line["instance"]]
        assert line["region"] in REFERENCE["regions"] and line["category"] in REFERENCE["categories"], line
        category = REFERENCE["categories"][line["category"]]
        consent = set(filter(None, str(line.get("consent") or "").split(",")))
        if category["personal"]:
            if REFERENCE["regions"][line["region"]]["gdpr"]:
                assert in_eu_or_adequate(instance.region), line
            assert set(instance.purposes) <= consent, line
        if "requires_certification" in category:
            assert category["requires_certification"] in instance.certifications, line


def test_killed_sidecar_opa_fails_that_hop_closed_while_the_rest_works(deployed):
    state, _ = deployed
    opa = next(p for p in state["parts"] if p["name"] == "sidecar-ingest-us/opa")
    os.killpg(opa["pid"], signal.SIGKILL)
    deadline = time.monotonic() + 5
    while deployment.alive(opa["pid"]) and time.monotonic() < deadline:
        time.sleep(0.05)

    # US records go through ingest-us, whose egress can no longer get a decision.
    request_id, answer = post(state, US_PERSONAL)
    assert answer.status == 503, answer.text
    assert answer.body["code"] == "DECISION_UNAVAILABLE"
    wait_for_audit(state, request_id, 1)
    assert instances_reached(state, request_id) == {"ingest-us"}  # nothing forwarded past it

    # EU records never touch that sidecar and still get through.
    request_id, answer = post(state, EU_PERSONAL)
    assert answer.status == 200, answer.text
    assert [hop["instance"] for hop in answer.body["path"]] == ["ingest-eu", "analyse-eu", "store-eu"]
