"""Each hop of one record: `python -m complyroute trace <request-id> [--run RUN_DIR]`.

Joins, by the record's id, what a local run folder holds about it:

- the access logs: each point's Envoy writes a JSON line per request into logs/<point>.access.log
  (proxy/envoy.py ACCESS_LOG_FIELDS): at a deciding listener, the sender and step it serves, the
  answer's status, which check answered (details), the compliant set and the instance the record
  was sent to, the revision of an allowed hop, a denial's code and revision, the time it took.
  Every hop a point took has one, whatever decided it (OPA, a compiled route, Envoy's own checks);
- the decision logs (engine.decision_logs "file"): each point's OPA writes every decision as a
  JSON line ("msg": "Decision Log") into its log, logs/<point>.opa.log, masked so the record
  and its label token never land there (policies/system/log). The input names the sender
  and step (the listener's context extensions), the labels and the record's id (headers: the
  entry assigns x-request-id before it asks OPA, later hops carry it on); the result is the
  decision; `bundles` names the revision of the rule set that made it;
- the audit lines (audit/<instance>.jsonl): what each instance that took the record received,
  from whom, decided by which point under which revision.

A hop the compiled engine decided ahead of time (an Envoy route standing for OPA's answer) has
no decision log line: its access log line and its audit line say which point decided it and
under which revision. Without decision logs, trace shows what the access and audit lines hold
(no labels as the point read them, no reasons of a denial).

On Kubernetes the Envoys write their access logs, and the OPAs their decision logs, to their
containers' output (kubectl logs); trace reads local runs only.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from complyroute.runtime.local import deployment, rendering
from complyroute.topology.plan import ACCESS_LOG_SUFFIX

# Where a decision's input carries the record's id: the entry's x-request-id, which every
# later hop carries on (x-complyroute-record-id beside it).
RECORD_ID_HEADERS = ("x-request-id", "x-complyroute-record-id")
BUNDLE = "complyroute"  # the bundle each point's OPA loads the rule set from (bundles.py)
ENVOY_DENIAL_STATUS = {403: 451}  # ext_authz has no 451: the policy answers 403, Envoy's mapper restores 451
TURN_ON = "set engine.decision_logs: file in the manifest and deploy again"
# An access log line's `details` when the next hop answered (the point let the record through).
VIA_UPSTREAM = "via_upstream"


class TraceError(RuntimeError):
    """No such record in the run, or nothing to trace it with; the message says what to do."""


@dataclass
class Decision:
    """One decision log line about the record."""

    point: str
    at: float  # seconds since the epoch
    sender: str | None
    step: str | None
    labels: dict
    result: dict
    revision: str | None


@dataclass
class Hop:
    """One hop of the record: the access log line of the listener that took it, the decision
    that let it go (or stopped it), if one was logged, and the audit line of the instance that
    received it, if any did."""

    point: str | None
    sender: str | None
    step: str | None
    at: float
    decision: Decision | None = None
    received: dict | None = None
    passage: dict | None = None

    @property
    def let_through(self) -> bool:
        """Whether the hop was allowed: by its decision, else by its access line (it was routed to an
        instance), else by the audit line of the instance that received it."""
        if self.decision:
            return bool(self.decision.result.get("allowed"))
        if self.passage:
            return bool(self.passage.get("destination"))
        return self.received is not None


def epoch_seconds(timestamp: str) -> float:
    """OPA's RFC 3339 timestamps (nanoseconds, trailing zeros trimmed, so not sortable as
    text) as seconds since the epoch; Python before 3.11 reads at most microseconds and no Z."""
    match = re.fullmatch(r"([^.]+?)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)", timestamp)
    if not match:
        raise ValueError(f"not an RFC 3339 timestamp: {timestamp!r}")
    whole, fraction, zone = match.groups()
    seconds = datetime.fromisoformat(whole + ("+00:00" if zone == "Z" else zone)).timestamp()
    return seconds + (float("0." + fraction) if fraction else 0.0)


def revision_of(entry: dict) -> str | None:
    """The revision that made a decision: the bundle's, as OPA logs it; else what the answer
    names (an allowed hop's x-complyroute-revision header, a denial body's "revision")."""
    bundled = ((entry.get("bundles") or {}).get(BUNDLE) or {}).get("revision")
    if bundled:
        return bundled
    result = entry.get("result") or {}
    if (result.get("headers") or {}).get("x-complyroute-revision"):
        return result["headers"]["x-complyroute-revision"]
    return denial_body(result).get("revision")


def denial_body(result: dict) -> dict:
    try:
        body = json.loads(result.get("body") or "{}")
    except (json.JSONDecodeError, TypeError):
        return {}
    return body if isinstance(body, dict) else {}


def decision_from(point: str, entry: dict, request_id: str, schema: tuple) -> Decision | None:
    """The decision a log entry holds if it is about the record `request_id`, else None.
    `schema`: the run's labels (rendering.run_labels), whose headers the input holds."""
    attributes = (entry.get("input") or {}).get("attributes") or {}
    headers = ((attributes.get("request") or {}).get("http") or {}).get("headers") or {}
    if request_id not in (headers.get(name) for name in RECORD_ID_HEADERS):
        return None
    context = attributes.get("contextExtensions") or attributes.get("context_extensions") or {}
    return Decision(
        point=point,
        at=epoch_seconds(entry["timestamp"]),
        sender=context.get("sender"),
        step=context.get("step") or headers.get("x-complyroute-step"),
        labels={label.name: headers.get(label.header) for label in schema},
        result=entry.get("result") or {},
        revision=revision_of(entry),
    )


def decisions_of(run_dir: Path, request_id: str) -> list[Decision]:
    """Every logged decision about the record, by every point of the run."""
    found = []
    schema = rendering.run_labels(run_dir)
    for log in sorted((run_dir / "logs").glob("*.opa.log")):
        point = log.name.removesuffix(".opa.log")
        for raw in log.read_text(errors="replace").splitlines():
            if '"Decision Log"' not in raw or request_id not in raw:  # cheap before parsing
                continue
            try:
                entry = json.loads(raw)
            except json.JSONDecodeError:
                continue  # a line cut off by a stopped OPA
            if entry.get("msg") == "Decision Log" and (decision := decision_from(point, entry, request_id, schema)):
                found.append(decision)
    return found


def passages_of(run_dir: Path, request_id: str) -> list[dict]:
    """Every deciding listener's access log line about the record (a line naming a sender), with
    its time as seconds since the epoch (`at`)."""
    found = []
    for log in sorted((run_dir / "logs").glob(f"*{ACCESS_LOG_SUFFIX}")):
        for raw in log.read_text(errors="replace").splitlines():
            if request_id not in raw:  # cheap before parsing
                continue
            try:
                line = json.loads(raw)
            except json.JSONDecodeError:
                continue  # a line cut off by a stopped Envoy
            if line.get("record_id") == request_id and line.get("sender") and line.get("time"):
                found.append({**line, "at": epoch_seconds(line["time"])})
    return found


def audit_lines_of(run_dir: Path, request_id: str) -> list[dict]:
    """Every instance's audit line about the record."""
    lines = []
    for path in sorted((run_dir / "audit").glob("*.jsonl")):
        for raw in path.read_text(errors="replace").splitlines():
            if request_id not in raw:
                continue
            try:
                line = json.loads(raw)
            except json.JSONDecodeError:
                continue  # checking the chain is `complyroute audit`'s; this only reads
            if line.get("request_id") == request_id:
                lines.append(line)
    return lines


def _take(candidates: list, matches) -> object | None:
    """The first of `candidates` that `matches`, removed from them; None if none does."""
    found = next((candidate for candidate in candidates if matches(candidate)), None)
    if found is not None:
        candidates.remove(found)
    return found


def hops_of(decisions: list[Decision], lines: list[dict], passages: list[dict] = ()) -> list[Hop]:
    """The record's hops in the order they happened: each access log line of a deciding listener
    with the decision of the same point, sender and step, and each logged decision no access line
    accounts for as a hop of its own; each allowed hop with the audit line of the instance it let
    the record into (same point, sender and step), and each audit line no hop accounts for as a
    hop of its own."""
    unclaimed_decisions = sorted(decisions, key=lambda d: d.at)
    hops = []
    for passage in sorted(passages, key=lambda p: p["at"]):
        hop = Hop(passage["point"], passage.get("sender"), passage.get("step"), passage["at"], passage=passage)
        hop.decision = _take(unclaimed_decisions, lambda d: (d.point, d.sender, d.step) == (hop.point, hop.sender, hop.step))
        hops.append(hop)
    hops += [Hop(decision.point, decision.sender, decision.step, decision.at, decision) for decision in unclaimed_decisions]
    unclaimed = sorted(lines, key=lambda line: line.get("ts", 0))
    for hop in sorted(hops, key=lambda hop: hop.at):
        if hop.let_through:
            hop.received = _take(unclaimed, lambda line: (line.get("decided_by"), line.get("sender"), line.get("step"))
                                 == (hop.point, hop.sender, hop.step))
    hops += [Hop(line.get("decided_by"), line.get("sender"), line.get("step"), line.get("ts", 0) / 1000, received=line)
             for line in unclaimed]
    return sorted(hops, key=lambda hop: hop.at)


def describe_decision(result: dict) -> list[str]:
    """A decision as lines: where an allowed hop goes, or a denial's status, code, message and
    each reason."""
    if result.get("allowed"):
        return [f"allowed -> {(result.get('headers') or {}).get('x-complyroute-destination', '(no destination named)')}"]
    body = denial_body(result)
    status = ENVOY_DENIAL_STATUS.get(result.get("http_status"), result.get("http_status"))
    described = [f"denied {status} {body.get('code')}: {body.get('message')}"]
    for reason in body.get("reasons") or []:
        where = f" ({reason['instance']})" if reason.get("instance") else ""
        described.append(f"reason {reason.get('code')}{where}: {reason.get('message')}")
    return described


def labels_text(labels: dict) -> str:
    return ", ".join(f"{name} {value if value is not None else '(none)'}" for name, value in sorted(labels.items()))


def describe_passage(passage: dict) -> str:
    """What a listener's access log line says of its answer, when no decision log line does."""
    status = passage.get("status")
    if passage.get("destination"):
        return f"allowed -> {passage['destination']}"
    if passage.get("denial_code"):
        return f"denied {status} {passage['denial_code']} (its reasons are in the decision log)"
    return f"refused {status} by the point's Envoy ({passage.get('details')})"


def print_hop(number: int, hop: Hop, engine: str, out, decision_logs: bool = True) -> None:
    print(f"hop {number}: {hop.point} decides {hop.sender} -> {hop.step}", file=out)
    passage = hop.passage or {}
    if hop.decision:
        print(f"  labels    {labels_text(hop.decision.labels)}", file=out)
        first, *reasons = describe_decision(hop.decision.result)
        print(f"  decision  {first}", file=out)
        for reason in reasons:
            print(f"            {reason}", file=out)
        revision = hop.decision.revision
    else:
        decided = describe_passage(passage) if passage else f"allowed -> {hop.received.get('instance')}"
        if not hop.let_through:
            how = ""
        elif not decision_logs:
            how = ", decision logs off (engine.decision_logs): no labels as the point read them"
        elif engine == "envoy-compiled":
            how = f", decided ahead of time by {hop.point}: a route of the compiled engine, no decision log line"
        else:
            how = f", by {hop.point}, which logged no decision for it"
        print(f"  decision  {decided}{how}", file=out)
        revision = passage.get("revision") or passage.get("denial_revision")
        if not revision and hop.received:
            revision = f"{hop.received.get('revision')} (the audit line's)"
    if passage.get("instance"):
        print(f"  sent to   {passage['instance']}: {passage.get('status')} {passage.get('details')}, "
              f"{passage.get('duration_ms')} ms at the point", file=out)
    print(f"  revision  {revision or '(not named)'}", file=out)
    if hop.received:
        line = hop.received
        print(f"  received  by {line.get('instance')} ({line.get('step')}): {labels_text(line.get('labels') or {})}, "
              f"digest {line.get('digest')}, revision {line.get('revision')}", file=out)
    elif hop.let_through:
        print("  received  no audit line of the destination", file=out)


def trace(run_dir: Path, request_id: str, out=sys.stdout) -> int:
    state = deployment.read_state(run_dir)
    if state is None:
        raise TraceError(f"{run_dir} is not a run folder (no state.json): name one under runs/ with --run")
    decision_logs = state.get("decision_logs", "off") == "file"
    if not decision_logs and not any((run_dir / "logs").glob(f"*{ACCESS_LOG_SUFFIX}")):
        raise TraceError(f"run {run_dir.name} has no decision logs (engine.decision_logs is off) and no access logs "
                         f"(deployed before points wrote them): {TURN_ON}")
    hops = hops_of(decisions_of(run_dir, request_id) if decision_logs else [], audit_lines_of(run_dir, request_id),
                   passages_of(run_dir, request_id))
    if not hops:
        raise TraceError(f"no decision and no audit line of record {request_id} in run {run_dir.name}: "
                         f"its id is the x-request-id of the entry's answer")
    engine = state.get("engine", "?")
    print(f"record {request_id} in run {run_dir.name} ({state.get('topology')}, engine {engine})", file=out)
    for number, hop in enumerate(hops, 1):
        print_hop(number, hop, engine, out, decision_logs)
    return 0


def default_run() -> Path:
    """runs/current, else the newest run folder."""
    if deployment.current_link().exists():
        return deployment.current_link()
    runs = [p for p in deployment.runs_root().iterdir() if (p / "state.json").is_file() and not p.is_symlink()] if deployment.runs_root().is_dir() else []
    if not runs:
        raise TraceError("no run folder under runs/: deploy first, or name one with --run")
    return max(runs, key=lambda p: (p / "state.json").stat().st_mtime)


def main(request_id: str, run_dir: Path | None = None, out=None) -> int:
    return trace(Path(run_dir or default_run()).resolve(), request_id, out or sys.stdout)
