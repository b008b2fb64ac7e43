"""python -m complyroute trace on the walkthrough: access logs and decision logs joined to audit
lines by the record's id, under both engines; the record's body never lands in a decision log."""

import dataclasses
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from complyroute.client import send
from complyroute.runtime.local import deployment
from complyroute.topology import manifest

from tests.rulesets import of_manifest

from .helpers import ENGINES, EU_PERSONAL, MIXED_REGIONS, access_lines, entries


MARKER = "body-marker-7f3a9c"
EU_HEALTH = {**EU_PERSONAL, "category": "health"}


def trace(request_id, run_dir=None):
    command = [sys.executable, "-m", "complyroute", "trace", request_id] + (["--run", str(run_dir)] if run_dir else [])
    return subprocess.run(command, capture_output=True, text=True, cwd=manifest.REPO)


@pytest.mark.parametrize("engine", ENGINES)
def test_trace_names_every_hop_its_decision_revision_and_audit_line_allowed(engine):
    if deployment.read_state():
        deployment.stop(out=open("/dev/null", "w"))
    topology = manifest.load(str(MIXED_REGIONS), engine=engine)
    topology = dataclasses.replace(topology, engine={**topology.engine, "decision_logs": "file"})
    state = deployment.deploy(topology, of_manifest(topology), out=open("/dev/null", "w"))
    try:
        allowed = send(state["entry_url"], EU_PERSONAL, {"subject": MARKER})
        denied = send(state["entry_url"], EU_HEALTH, {"subject": MARKER})
        assert (allowed.status, denied.status) == (200, 451)
        time.sleep(1.0)  # OPA's console logger and the audit streams write a moment later
        access_lines(state, denied.request_id, 3)  # and Envoy flushes its access logs every second
        revision = state["revision"]
        shown = trace(allowed.request_id)
        assert shown.returncode == 0, shown.stderr
        hops = shown.stdout.split("\nhop ")[1:]
        assert len(hops) == 3
        # The entry routes to the compliant set, named by its instances; a hop is received by one of them.
        assert hops[0].startswith("1: entry decides gateway -> ingest") and "allowed -> ingest-eu-1,ingest-eu-2\n" in hops[0]
        received = [re.search(r"received  by (\S+) ", hop)[1] for hop in hops]
        assert entries(received) == ["ingest-eu", "analyse-eu", "store-eu"], received
        assert all(f"revision  {revision}" in hop for hop in hops)
        if engine == "envoy-compiled":  # inner hops decided by routes OPA computed ahead of time
            assert f"decided ahead of time by sidecar-{received[0]}: a route of the compiled engine" in hops[1]
        else:
            assert "category personal, consent billing,care, region EU" in hops[1]
            assert "allowed -> analyse-eu-1,analyse-eu-2\n" in hops[1]
        shown = trace(denied.request_id)
        assert shown.returncode == 0, shown.stderr
        assert "denied 451" in shown.stdout
        assert "reason CERTIFICATION_MISSING (store-eu-1)" in shown.stdout and "reason CERTIFICATION_MISSING (store-eu-2)" in shown.stdout
        # Masked: neither the record nor a label token is in any decision log.
        logs = "".join(path.read_text() for path in Path(state["run_dir"], "logs").glob("*.opa.log"))
        assert MARKER not in logs and "eyJ" not in logs
        decisions = [line for line in logs.splitlines() if '"Decision Log"' in line]
        # The deploy's warm-up (runtime/local/warmup.py): one decision per deciding listener,
        # each under the record id state.json names; the records' are the others.
        warm_ups = set(state["warm_up"]["decided"].values())
        warm = [line for line in decisions if any(record_id in line for record_id in warm_ups)]
        assert len(warm) == len(warm_ups) == len(state["warm_up"]["decided"]) == 7  # the entry, 6 sidecars
        # One access log line per request: each warm-up record at its listener, once.
        access = [json.loads(line) for path in Path(state["run_dir"], "logs").glob("*.access.log") for line in path.read_text().splitlines()]
        assert sorted(line["record_id"] for line in access if line["record_id"] in warm_ups) == sorted(warm_ups)
        # envoy-opa: 3 + 3 decisions; compiled: the entry's two and the denial at the store step.
        assert len(decisions) - len(warm) == (3 if engine == "envoy-compiled" else 6)
    finally:
        deployment.stop(out=open("/dev/null", "w"))


def test_trace_of_an_unknown_record_says_so_and_without_decision_logs_reads_the_access_logs_denied():
    if deployment.read_state():
        deployment.stop(out=open("/dev/null", "w"))
    topology = manifest.load(str(MIXED_REGIONS))
    state = deployment.deploy(topology, of_manifest(topology), out=open("/dev/null", "w"))
    try:
        shown = trace("no-such-record")
        assert shown.returncode == 2 and "no decision and no audit line of record no-such-record" in shown.stderr
        answer = send(state["entry_url"], EU_PERSONAL, {"subject": MARKER})
        assert answer.status == 200
        access_lines(state, answer.request_id, 3)
        logs = "".join(path.read_text() for path in Path(state["run_dir"], "logs").glob("*.opa.log"))
        assert '"Decision Log"' not in logs  # off by default
        shown = trace(answer.request_id)
        assert shown.returncode == 0, shown.stderr
        hops = shown.stdout.split("\nhop ")[1:]
        assert len(hops) == 3 and all("decision logs off (engine.decision_logs)" in hop for hop in hops)
        assert [re.search(r"sent to   (\S+):", hop)[1] for hop in hops] == [re.search(r"received  by (\S+) ", hop)[1] for hop in hops]
        access = "".join(path.read_text() for path in Path(state["run_dir"], "logs").glob("*.access.log"))
        assert MARKER not in access and "eyJ" not in access  # neither the record nor its label token
    finally:
        deployment.stop(out=open("/dev/null", "w"))
