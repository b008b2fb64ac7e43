"""End to end, for every enforcing topology and engine: real Envoy, OPA and service processes.

The mixed-regions example (eight instances in three steps, ingest -> analyse -> store: two EU
replicas of each step, a US instance of two; the gateway is in the US) is deployed in each topology under each engine
in turn. Records are sent to the real entry; the answers, and afterwards the audit log every
instance wrote, show where each record went: to one instance of each step's compliant set (the
data plane picks either EU replica, so a path is asserted by the entries its instances are
replicas of: ingest-eu for ingest-eu-1 or ingest-eu-2). The assertions are the same for every topology
and engine: the rules are one rule set, whatever enforces them.
"""

import time
from pathlib import Path

import pytest

from complyroute.evidence import audit
from complyroute.runtime.local import deployment, supervision
from complyroute.topology.plan import GATEWAY_SENDER

from .helpers import (EU_PERSONAL, access_lines, audit_lines, entries, entries_reached, instances_reached, post, replicas,
                      matrix, send_as, wait_for_audit)

# Phase 1 of the pool's deployments (tests/e2e/conftest.py): before the error contract and the
# hostile suite put records in past the entry, which this suite's audit verdict would count.
pytestmark = pytest.mark.pool(phase=1)

US_PERSONAL = {"region": "US", "category": "personal", "consent": "care,billing"}
# Records a test put in past the entry, posing as ingest-eu-1 with a token of its own (send_as),
# that reached an instance: the audit's join reports each as a path not from the entry.
PUT_IN_PAST_THE_ENTRY: set[str] = set()
EU_HEALTH = {"region": "EU", "category": "health", "consent": "care,billing"}


@pytest.fixture(params=matrix())
def deployed(pooled):
    """The pool's deployment of the example in this topology under this engine: (state, loaded)."""
    return pooled


def test_eu_personal_record_travels_only_through_eu_instances_allowed(deployed):
    state, _ = deployed
    request_id, answer = post(state, EU_PERSONAL)
    assert answer.status == 200, answer.text
    assert answer.body["request_id"] == request_id
    path = [hop["instance"] for hop in answer.body["path"]]
    assert path[0] in replicas("ingest-eu") and entries(path) == ["ingest-eu", "analyse-eu", "store-eu"], path
    assert all(hop["region"] == "EU" for hop in answer.body["path"])
    for hop in answer.body["path"]:
        assert hop["t_in"] <= hop["t_out"]
    assert instances_reached(state, request_id) == set(path)
    # One access log line per hop, at the listener that decided it: from whom, into which step,
    # to which instance, under which revision.
    lines = access_lines(state, request_id, 3)
    assert [(line["sender"], line["step"], line["instance"], line["status"]) for line in lines] == [
        ("gateway", "ingest", path[0], 200), (path[0], "analyse", path[1], 200), (path[1], "store", path[2], 200)]
    assert {line["revision"] for line in lines} == {state["revision"]} and not any(line["denial_code"] for line in lines)


def test_eu_personal_record_without_consent_to_last_step_denied(deployed):
    state, _ = deployed
    request_id, answer = post(state, {**EU_PERSONAL, "consent": "care"})
    assert answer.status == 451, answer.text
    assert answer.body["code"] == "PURPOSE_NOT_CONSENTED"
    assert answer.body["request_id"] == request_id
    assert [r["instance"] for r in answer.body["reasons"]] == sorted(replicas("store-eu"))
    wait_for_audit(state, request_id, 2)
    assert entries_reached(state, request_id) == ["analyse-eu", "ingest-eu"]
    *passed, denial = access_lines(state, request_id, 3)
    assert [line["status"] for line in passed] == [451, 451] and all(line["instance"] for line in passed)
    assert (denial["step"], denial["status"], denial["instance"]) == ("store", 451, None)
    assert (denial["denial_code"], denial["denial_revision"]) == ("PURPOSE_NOT_CONSENTED", state["revision"])


def test_us_personal_record_may_use_us_instances_allowed(deployed):
    state, _ = deployed
    request_id, answer = post(state, US_PERSONAL)
    assert answer.status == 200, answer.text
    # The gateway and the US instances share a region, so the policy prefers them.
    assert entries(hop["instance"] for hop in answer.body["path"]) == ["ingest-us", "analyse-us", "store-eu"]


def test_eu_personal_record_never_takes_the_preferred_us_replica_denied(deployed):
    state, _ = deployed
    request_id, answer = post(state, EU_PERSONAL)
    assert answer.status == 200
    assert not {"ingest-us", "analyse-us"} & {hop["instance"] for hop in answer.body["path"]}
    assert not {"ingest-us", "analyse-us"} & instances_reached(state, request_id)


def test_health_record_goes_to_certified_instance_over_preferred_region_allowed(deployed):
    state, _ = deployed
    # A US health record: the gateway prefers US instances, but analyse-us is not certified
    # for health data, so the analyse hop goes to a certified analyse-eu replica instead.
    request_id, answer = post(state, {**US_PERSONAL, "category": "health"})
    wait_for_audit(state, request_id, 2)
    assert entries_reached(state, request_id) == ["analyse-eu", "ingest-us"]
    assert answer.status == 451 and answer.body["code"] == "CERTIFICATION_MISSING"  # store has none


def test_eu_health_record_meeting_step_without_certified_instance_denied(deployed):
    state, _ = deployed
    request_id, answer = post(state, EU_HEALTH)
    assert answer.status == 451, answer.text
    assert answer.body["code"] == "CERTIFICATION_MISSING"
    assert answer.body["request_id"] == request_id
    assert {r["instance"] for r in answer.body["reasons"]} == replicas("store-eu")
    wait_for_audit(state, request_id, 2)
    assert entries_reached(state, request_id) == ["analyse-eu", "ingest-eu"]


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
    # The client asks for the US instance; the policy still picks the EU set for an EU record.
    request_id, answer = post(state, EU_PERSONAL, headers={"x-complyroute-destination": "ingest-us"})
    assert answer.status == 200, answer.text
    assert entries(hop["instance"] for hop in answer.body["path"]) == ["ingest-eu", "analyse-eu", "store-eu"]


def test_client_set_routing_header_cannot_force_a_denied_hop_denied(deployed):
    state, _ = deployed
    request_id, answer = post(state, EU_HEALTH, headers={"x-complyroute-destination": "store-eu-1"})
    assert answer.status == 451
    wait_for_audit(state, request_id, 2)
    assert "store-eu" not in entries_reached(state, request_id)


def test_service_set_routing_header_at_egress_changes_nothing_denied(deployed):
    state, _ = deployed
    # Acting as ingest-eu-1, send an EU record where it sends records on (its sidecar, router
    # or the central entity), asking for the US instance: the policy still decides.
    request_id, answer = send_as(state, "ingest-eu-1", EU_PERSONAL, headers={"x-complyroute-destination": "analyse-us"})
    assert answer.status == 200, answer.text
    PUT_IN_PAST_THE_ENTRY.add(request_id)
    assert entries(hop["instance"] for hop in answer.body["path"]) == ["analyse-eu", "store-eu"]
    assert "analyse-us" not in instances_reached(state, request_id)


def test_audit_logs_show_no_forbidden_record_reached_any_instance(deployed):
    state, _ = deployed
    lines = audit_lines(state)
    assert len(lines) >= 10  # the tests above delivered records; an empty log would prove nothing
    # The rule set itself re-checks every line (complyroute/evidence/audit.py), with each point's data.
    verdict = audit.audit_run(Path(state["run_dir"]))
    assert verdict.lines == len(lines)
    assert (verdict.broken_chains, verdict.forbidden, verdict.undecided) == (0, 0, 0), verdict.problems
    # Every record's lines join into a whole path, but those of the records put in past the entry.
    put_in = PUT_IN_PAST_THE_ENTRY & {line["request_id"] for line in lines}
    assert put_in and verdict.paths == {"entry": len(put_in)}, verdict.problems
    assert {problem.detail.split(":")[0] for problem in verdict.problems} == {f"request {request_id}" for request_id in put_in}


def hops_before(path_senders, killed_senders):
    """Instances a record reaches before its first hop decided by the killed point."""
    reached = set()
    for sender, instance in path_senders:
        if sender in killed_senders:
            return reached, False
        reached.add(instance)
    return reached, True


@pytest.mark.pool(phase=4, spends=True)  # its OPA stays down: the last test on its deployment
def test_killed_opa_fails_its_hops_closed_while_the_rest_works(deployed):
    state, topology = deployed
    # Take down the OPA of the point that decides the hop out of ingest-us (its sidecar, its
    # router, or the central entity, which decides every hop), and keep it down: supervisord
    # would restart a killed one within a second (test_supervision_e2e.py covers that).
    point = next(p for p in state["points"] if "ingest-us" in p["senders"])
    opa = next(p for p in supervision.refresh_pids(deployment.read_state())["parts"] if p["name"] == f"{point['name']}/opa")
    deployment.stop_part(opa["name"], state)
    assert not supervision.alive(opa["pid"])
    # The hops that still need the killed OPA: with envoy-opa every hop the point decides; with
    # envoy-compiled, only its hop from clients (the entry) and the hops it denies: the hops it
    # allows from services were decided ahead of time.
    if topology.engine["kind"] == "envoy-compiled":
        needing_opa = {sender for sender in point["senders"] if sender == GATEWAY_SENDER}
    else:
        needing_opa = set(point["senders"])

    # Sent on by ingest-us, a record the point would deny (no consent to analysis), and one
    # whose labels are not canonical: both need its OPA under either engine, so both fail
    # closed and reach no instance.
    for labels in ({**US_PERSONAL, "consent": "billing"}, {**US_PERSONAL, "consent": "care, billing"}):
        request_id, answer = send_as(state, "ingest-us", labels)
        assert answer.status == 503 and answer.body["code"] == "DECISION_UNAVAILABLE", answer.text
        time.sleep(0.2)
        assert instances_reached(state, request_id) == set()

    for labels, path in (
        (US_PERSONAL, [("gateway", "ingest-us"), ("ingest-us", "analyse-us"), ("analyse-us", "store-eu")]),
        (EU_PERSONAL, [("gateway", "ingest-eu"), ("ingest-eu", "analyse-eu"), ("analyse-eu", "store-eu")]),
    ):
        # The path by entries: no EU replica's point decides a hop of ingest-us's.
        expected, delivered = hops_before(path, needing_opa)
        request_id, answer = post(state, labels)
        if delivered:
            assert answer.status == 200, answer.text
            assert entries(hop["instance"] for hop in answer.body["path"]) == [instance for _, instance in path]
        else:
            assert answer.status == 503 and answer.body["code"] == "DECISION_UNAVAILABLE", answer.text
            time.sleep(0.2)
            assert entries_reached(state, request_id) == sorted(expected)  # nothing forwarded past the failed point
