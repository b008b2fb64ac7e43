"""End to end: the audit lines real services write, checked by `python -m complyroute audit`.

The mixed-regions example in the sidecar topology (every hop decided by the sender's own
sidecar, delivered through the receiver's forwarding ingress) under each engine: records sent
to the real entry leave lines the audit finds clean, their paths whole; a record posted
straight to a service's port, as a hostile process on the machine could, leaves a line the
audit reports as received without a decision, on a path that did not start at the entry.
"""

import hashlib
import json
import subprocess
import sys
import uuid

import pytest

from complyroute.client import send
from complyroute.policy import bundles
from complyroute.runtime.local import deployment
from complyroute.topology import manifest

from tests.rulesets import of_manifest

from .helpers import ENGINES, EU_PERSONAL, MIXED_REGIONS, RECORD, entry_of, post, wait_for_audit


US_PERSONAL = {"region": "US", "category": "personal", "consent": "care,billing"}


@pytest.fixture(params=ENGINES)
def deployed(pooled):
    """The pool's sidecar deployment under this engine (tests/e2e/conftest.py), before any other
    test sends it a record (the marker's `untouched`): the verdict below counts the run's records."""
    state, _ = pooled
    return state


def audit(state):
    """The audit command as a user runs it, on this deployment's run folder."""
    return subprocess.run([sys.executable, "-m", "complyroute", "audit", state["run_dir"]],
                          cwd=manifest.REPO, capture_output=True, text=True, timeout=120)


@pytest.mark.pool(phase=0, untouched=True)
def test_allowed_records_leave_lines_the_audit_finds_clean_allowed(deployed):
    state = deployed
    # Consent as a client may write it: the lines hold it as the deciding point rewrote it. And a
    # decision time of the client's own: each deciding point writes its own over it.
    request_id, answer = post(state, {**EU_PERSONAL, "consent": " care , billing"}, headers={"x-complyroute-decided-at": "1"})
    assert answer.status == 200, answer.text
    assert post(state, US_PERSONAL)[1].status == 200
    denied_id, denied = post(state, {**EU_PERSONAL, "consent": "care"})  # reaches an analyse-eu replica, no store-eu one
    assert denied.status == 451, denied.text
    wait_for_audit(state, denied_id, 2)

    received = wait_for_audit(state, request_id, 3)
    lines = {entry_of(line["instance"]): line for line in received}  # one replica of each EU entry
    assert len(received) == 3 and set(lines) == {"ingest-eu", "analyse-eu", "store-eu"}
    ingest, analyse = lines["ingest-eu"]["instance"], lines["analyse-eu"]["instance"]
    assert {name: (line["sender"], line["decided_by"]) for name, line in lines.items()} == {
        "ingest-eu": ("gateway", "entry"),
        "analyse-eu": (ingest, f"sidecar-{ingest}"),
        "store-eu": (analyse, f"sidecar-{analyse}"),
    }
    for line in lines.values():
        assert line["labels"] == {"region": "EU", "category": "personal", "consent": "billing,care"}
        assert line["digest"] == "sha256:" + hashlib.sha256(json.dumps(RECORD).encode()).hexdigest()
        assert line["revision"] == bundles.revision()
        assert isinstance(line["decided_at"], int) and line["decided_at"] != 1, line

    result = audit(state)
    assert result.returncode == 0, result.stdout + result.stderr
    # Three records joined: two delivered, one denied at the store step, each path whole as far as it went.
    assert "forbidden receptions 0, receptions without a decision 0, path findings 0 in 3 records: clean" in result.stdout


@pytest.fixture
def without_mtls():
    if deployment.read_state():
        deployment.stop()
    loaded = manifest.load("sidecar", services=str(MIXED_REGIONS), overrides={"security": {"mtls": False, "label_tokens": False}})
    yield deployment.deploy(loaded, of_manifest(loaded))
    deployment.stop()


def test_a_record_posted_straight_to_a_service_is_reported_without_a_decision_denied(without_mtls):
    """With mutual TLS off (security.mtls: false), a local process can post past every point:
    the service cannot tell, the audit can. (With it on, that post gets no answer at all:
    test_hostile_e2e.py.)"""
    state = without_mtls
    store_eu = next(p for p in state["parts"] if p["name"] == "store-eu-1")
    # Past every enforcement point, with the headers a decided hop carries, but for the ones
    # only a deciding point sets.
    request_id = f"e2e-{uuid.uuid4()}"
    answer = send(store_eu["health_url"].removesuffix("/health") + "/process", EU_PERSONAL, RECORD,
                  request_id=request_id, headers={"x-complyroute-sender": "analyse-eu-1"})
    assert answer.status == 200, answer.text  # the service cannot tell: the audit can
    assert len(wait_for_audit(state, request_id, 1)) == 1

    result = audit(state)
    assert result.returncode == 1, result.stdout + result.stderr
    # And its path starts at the last step: the join tells as well.
    assert "forbidden receptions 0, receptions without a decision 1, path findings 1 in 1 records (entry 1): FAILED" in result.stdout
    assert f"request {request_id}: no decided_by, revision: no enforcement point decided this hop" in result.stdout
    assert f"request {request_id}: no line of it was sent by a gateway (gateway): its earliest, at store-eu-1, was sent by analyse-eu-1" in result.stdout
