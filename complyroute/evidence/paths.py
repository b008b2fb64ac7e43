"""What the lines of one record say of its path: every instance's lines of a run joined by record id.

Each line agrees with the token it was written under, so only the join sees a record relabelled
or re-sent under its real id: lines of one record disagreeing on labels or digest, a record
received twice at one step, a path whose lines name no gateway as a sender (it did not start at
the entry), a line whose sender is not the previous hop's receiver (it holds no line of the
record, or it sends records on to another step).
"""

from __future__ import annotations

import json
from collections import Counter

from complyroute.evidence.auditlog import Line, Problem, hashable

# What the join of a record's lines can find (path_findings), in the order it looks: lines
# disagreeing on the labels, on the digest; received twice at one step; no line sent by a
# gateway; a line whose sender holds no line of the record.
PATH_FINDINGS = ("labels", "digest", "twice", "entry", "sender")


def describe_paths(paths: Counter, records: int) -> str:
    """The path findings as a verdict prints them: "path findings 3 in 4 records (labels 1, twice 1, sender 1)"."""
    kinds = ", ".join(f"{kind} {paths[kind]}" for kind in PATH_FINDINGS if paths[kind])
    return f"path findings {paths.total()} in {records} records" + (f" ({kinds})" if kinds else "")


def gateways_of(points: dict[str, dict]) -> set[str]:
    """The senders no point delivers to: the catalog's gateways, the senders of a record's first hop.

    Every instance of an enforcing run receives its records from a point (its lines are
    otherwise receptions without a decision), so a sender no point names as a destination is
    where records come from outside: the entry's clients.
    """
    senders = {sender for point in points.values() for sender in point["senders"]}
    return senders - {instance for point in points.values() for instance in point["destinations"]}


def next_steps_of(state: dict) -> dict[str, str]:
    """{instance: the step it sends records on to ("" at the last step)}, from the services'
    configuration the run's state.json keeps."""
    services = (part.get("env") or {} for part in state.get("parts", []))
    return {env["INSTANCE_ID"]: env.get("NEXT_STEP", "") for env in services if "INSTANCE_ID" in env}


def records_of(lines: list[Line]) -> dict[str, list[Line]]:
    """Every line by the id of the record it was written for. A service writes a string id on
    every line; a line without one names no record, and is in no path (its chain link and its
    decision are still checked)."""
    records: dict[str, list[Line]] = {}
    for line in lines:
        request_id = line.entry.get("request_id")
        if isinstance(request_id, str):
            records.setdefault(request_id, []).append(line)
    return records


def path_findings(request_id: str, lines: list[Line], gateways: set[str], next_steps: dict[str, str]) -> list[Problem]:
    """What the lines of one record, written by the instances it reached, say of its path.

    Each line agrees with the token it was written under; a record sent on again under its
    real id with another (forged) token leaves lines that are each allowed, and only their
    join tells. A path cut short (denied at a later hop, or its next hop failed) is a whole
    path as far as it goes: nothing is asked of the lines that are not there.
    """
    findings = []
    entries = [line.entry for line in lines]
    for kind in ("labels", "digest"):
        values = [entry.get(kind) for entry in entries]
        if values.count(values[0]) < len(values):
            findings.append(path_problem(kind, request_id, lines, f"its lines disagree on the {kind}: " + "; ".join(
                f"{value} at {', '.join(where)}" for value, where in grouped(lines, kind).items())))

    steps = [hashable(entry.get("step")) for entry in entries]
    if len(set(steps)) < len(steps):
        for step in dict.fromkeys(steps):
            received = [line for line, at in zip(lines, steps) if at == step]
            if len(received) > 1:
                findings.append(path_problem("twice", request_id, received, f"received {len(received)} times at step {received[0].entry.get('step')}: " + ", ".join(
                    line.instance for line in by_time(received))))

    # The path starts where a gateway sent the record (the entry decided that hop); every
    # later hop's sender is an instance that received the record itself, so holds a line of
    # it, and sends records on to this line's step (the step is checked here because where one
    # point decides every hop, the central entity, the decision check cannot tell which step it
    # decides a sender's hops into).
    senders = [hashable(entry.get("sender")) for entry in entries]
    receivers = [line.instance for line in lines]
    start = None
    if not any(sender in gateways for sender in senders):
        # Where the record came in: a line whose sender holds no line of it, the earliest of them;
        # by time alone, another process's clock could put a later hop first.
        unsent = [line for line, sender in zip(lines, senders) if sender not in receivers]
        start = by_time(unsent or lines)[0]
        findings.append(path_problem("entry", request_id, [start],
                                     f"no line of it was sent by a gateway ({', '.join(sorted(gateways)) or 'none in this run'}): "
                                     f"its earliest, at {start.instance}, was sent by {start.entry.get('sender')}"))
    for line, sender in zip(lines, senders):
        if sender in gateways or line is start:  # the start of a path not from the entry is reported once, above
            continue
        # A line's own instance is no sender of it: it needs another line of that instance.
        if sender not in receivers or (sender == line.instance and receivers.count(sender) == 1):
            findings.append(path_problem("sender", request_id, [line],
                                         f"{line.instance} received it from {line.entry.get('sender')}, which holds no line of it: not the previous hop's receiver"))
        elif sender in next_steps and next_steps[sender] != line.entry.get("step"):
            findings.append(path_problem("sender", request_id, [line], f"{line.instance} received it at step {line.entry.get('step')} from {sender}, "
                                         f"which sends records on to step {next_steps[sender] or '(none: the last)'}: not the previous hop's receiver"))
    return findings


def path_problem(kind: str, request_id: str, lines: list[Line], detail: str) -> Problem:
    return Problem(kind, ", ".join(line.where for line in by_time(lines)), f"request {request_id}: {detail}")


def grouped(lines: list[Line], name: str) -> dict[str, list[str]]:
    """{a field's value as JSON: where the lines holding it are}, in order of time."""
    groups: dict[str, list[str]] = {}
    for line in by_time(lines):
        groups.setdefault(json.dumps(line.entry.get(name), sort_keys=True), []).append(line.where)
    return groups


def by_time(lines: list[Line]) -> list[Line]:
    """In order of reception ("ts", when the instance received the record, by its own process's
    clock: receptions milliseconds apart at two instances may come in either order)."""
    return sorted(lines, key=reception_time)


def reception_time(line: Line) -> float:
    ts = line.entry.get("ts")
    return ts if isinstance(ts, (int, float)) else float("inf")  # a line without a time: last
