"""What the end-to-end tests share: deploying the example, reading audit logs, the reference data."""

import json
import time
import uuid
from pathlib import Path

from complyroute import deployment, manifest
from complyroute.client import send

MIXED_REGIONS = manifest.REPO / "topologies" / "examples" / "mixed-regions.yaml"
ENFORCING = ["sidecar", "central-entity", "dynamic-router-3", "dynamic-router-6"]
ENGINES = list(manifest.ENGINES)
REFERENCE = json.loads(manifest.REFERENCE_DATA.read_text())
EU_PERSONAL = {"region": "EU", "category": "personal", "consent": "care,billing"}
RECORD = {"subject": "alice", "reading": 42}


def post(state, labels, record=RECORD, request_id=None, **kwargs):
    """Send a record to the deployment's entry; returns (the id the record went by, answer).

    An enforcing entry replaces the client's x-request-id with its own (the answer names it);
    the no-policy baseline keeps it.
    """
    request_id = request_id or f"e2e-{uuid.uuid4()}"
    answer = send(state["entry_url"], labels, record, request_id=request_id, **kwargs)
    assert answer.request_id, f"the answer names the record's id: {answer.status} {answer.text[:200]}"
    return answer.request_id, answer


def mixed_regions(topology: str, engine: str | None = None) -> manifest.Topology:
    """The mixed-regions example's services and gateway, in the given topology's manifest."""
    return manifest.load(topology, services=str(MIXED_REGIONS), engine=engine)


def deploy_mixed_regions(topology: str, policies: Path = deployment.POLICIES, engine: str | None = None):
    """Deploy the example in a topology, replacing a running deployment (the entry port is one)."""
    if deployment.read_state():
        deployment.stop()
    loaded = mixed_regions(topology, engine)
    return deployment.deploy(loaded, policies=policies), loaded


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


def instances_reached(state, request_id) -> set[str]:
    return {line["instance"] for line in audit_lines(state) if line["request_id"] == request_id}
