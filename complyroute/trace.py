"""Each hop of one record: `python -m complyroute trace <request-id>`.

Joins, by the record's id, what the run folder holds about it:

- the decision logs (engine.decision_logs "file"): each OPA writes every decision as a JSON
  line into its log (logs/<point>.opa.log, "msg": "Decision Log"), masked so the record
  never lands there (policies/system/log). The input names the sender, the step and the
  labels, the result the decision, the entry the bundle revision that made it;
- the audit lines (audit/<instance>.jsonl): what each instance that took the record received,
  from whom, decided by which point under which revision.

A hop the compiled engine decided ahead of time (an Envoy route standing for OPA's answer) has
no decision log line: its audit line says who decided it and under which revision.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from . import deployment

RECORD_ID_HEADERS = ("x-request-id", "x-complyroute-record-id")


class TraceError(RuntimeError):
    """No such record in the run, or nothing to trace it with; the message says what to do."""


@dataclass
class Decision:
    point: str
    at: str
    sender: str | None
    step: str | None
    labels: dict
    result: dict
    revision: str | None


def decisions_of(run_dir: Path, request_id: str) -> list[Decision]:
    found = []
    for log in sorted((run_dir / "logs").glob("*.opa.log")):
        point = log.name.removesuffix(".opa.log")
        for raw in log.read_text(errors="replace").splitlines():
            if '"Decision Log"' not in raw or request_id not in raw:
                continue
            try:
                entry = json.loads(raw)
            except json.JSONDecodeError:
                continue
            attributes = (entry.get("input") or {}).get("attributes") or {}
            headers = ((attributes.get("request") or {}).get("http") or {}).get("headers") or {}
            if request_id not in (headers.get(name) for name in RECORD_ID_HEADERS):
                continue
            context = attributes.get("contextExtensions") or {}
            found.append(Decision(
                point=point, at=entry.get("timestamp", ""), sender=context.get("sender"),
                step=context.get("step") or headers.get("x-complyroute-step"),
                labels={name: headers.get(f"x-data-{name}") for name in ("region", "category", "consent")},
                result=entry.get("result") or {},
                revision=((entry.get("bundles") or {}).get("complyroute") or {}).get("revision"),
            ))
    return sorted(found, key=lambda d: d.at)


def audit_lines_of(run_dir: Path, request_id: str) -> list[dict]:
    lines = []
    for path in sorted((run_dir / "audit").glob("*.jsonl")):
        for raw in path.read_text(errors="replace").splitlines():
            if request_id in raw:
                entry = json.loads(raw)
                if entry.get("request_id") == request_id:
                    lines.append(entry)
    return sorted(lines, key=lambda line: line.get("ts", 0))


def describe_decision(result: dict) -> list[str]:
    if result.get("allowed"):
        return [f"allowed -> {result.get('headers', {}).get('x-complyroute-destination')}"]
    try:
        body = json.loads(result.get("body") or "{}")
    except json.JSONDecodeError:
        body = {}
    status = {403: 451}.get(result.get("http_status"), result.get("http_status"))
    described = [f"denied {status} {body.get('code')}: {body.get('message')}"]
    described += [f"  reason {r.get('code')}{' (' + r['instance'] + ')' if r.get('instance') else ''}: {r.get('message')}"
                  for r in body.get("reasons") or []]
    return described


def labels_text(labels: dict) -> str:
    return ", ".join(f"{name} {labels.get(name) if labels.get(name) is not None else '(none)'}" for name in ("region", "category", "consent"))


def trace(run_dir: Path, request_id: str, out=sys.stdout) -> int:
    decisions, lines = decisions_of(run_dir, request_id), audit_lines_of(run_dir, request_id)
    state = deployment.read_state(run_dir) or {}
    if not decisions and not lines:
        hint = "" if state.get("decision_logs") == "file" else (
            " (this run's decision logs are off: set engine.decision_logs: file in its manifest to log every decision)")
        raise TraceError(f"no decision and no audit line of record {request_id} in {run_dir}{hint}")
    print(f"record {request_id} in {run_dir.name} ({state.get('topology', '?')}, engine {state.get('engine', '?')})", file=out)
    received = {(line.get("decided_by"), line.get("sender")): line for line in lines}
    shown = set()
    hop = 0
    for decision in decisions:
        hop += 1
        print(f"hop {hop}: {decision.point} decides {decision.sender} -> {decision.step}  ({decision.at})", file=out)
        print(f"  labels    {labels_text(decision.labels)}", file=out)
        for text in describe_decision(decision.result):
            print(f"  decision  {text}", file=out)
        print(f"  revision  {decision.revision or '(no bundle)'}", file=out)
        line = received.get((decision.point, decision.sender)) if decision.result.get("allowed") else None
        if line:
            shown.add(id(line))
            print_received(line, out)
    for line in lines:
        if id(line) in shown:
            continue
        hop += 1
        print(f"hop {hop}: {line.get('decided_by')} decides {line.get('sender')} -> {line.get('step')} "
              f"(no decision log line: decided ahead of time by the compiled engine's route, or decision logs off)", file=out)
        print(f"  revision  {line.get('revision')}", file=out)
        print_received(line, out)
    return 0


def print_received(line: dict, out) -> None:
    print(f"  received  by {line.get('instance')} ({line.get('step')}): {labels_text(line.get('labels') or {})}, "
          f"digest {line.get('digest')}, revision {line.get('revision')}", file=out)


def main(request_id: str, run_dir: Path | None = None, out=None) -> int:
    out = out or sys.stdout
    if run_dir is None:
        runs = sorted((p for p in deployment.RUNS.iterdir() if (p / "state.json").is_file() and not p.is_symlink()),
                      key=lambda p: p.stat().st_mtime) if deployment.RUNS.is_dir() else []
        run_dir = deployment.CURRENT if deployment.CURRENT.exists() else (runs[-1] if runs else None)
        if run_dir is None:
            raise TraceError("no run folder under runs/: deploy first, or name one with --run")
    return trace(Path(run_dir).resolve(), request_id, out)
