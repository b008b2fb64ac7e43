"""Compliant sets measured (issue 27, item 6): manifests with replicas, and what a soak of them says.

- `load_manifest`: a topology's manifest with every step's instance given `replicas: N` (and,
  for the capacity search, the services' work), as `make deploy` would load it.
- `audit_index`: a deployment's audit lines by record id: which instance received each record
  and when (every instance writes its line before it works on or sends on a record).
- `balance`: per step, each instance's share of the step's records, from those lines.
- `classify_losses`: each request a kill of a service instance lost, told apart by what the
  audit lines and the answer say: *inside* (the killed instance had written its line for the
  record before it died: it was working on it or waiting for the next hop's answer, and nothing
  may retry a record once delivered), *on its way* (no line at the killed step; its last line at
  the step before, or at a first step the client's send, before the killed instance died; and
  the answer says the hop failed under it, HOP_FAILED: sent to the killed instance, unread), and
  *beyond*: every other loss, which a compliant replica that was up should have prevented.
  An instance died when its process had exited (the fault's died_at), not when the signal was
  sent: a killed process tears its memory down before the kernel closes its sockets, and until
  then they take a sender's bytes, which Envoy then cannot tell from a record delivered.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

from complyroute.topology import manifest

BALANCE_TOLERANCE = 0.10  # each of two replicas gets 50 % +- 10 % of its step's records (issue 27)
# What a record gets when the hop it was on failed under it: the point's own 503 when the
# instance's connection broke after the record was written to it (complyroute/proxy/replies.py),
# which every service before relays, or a service's 502 when its own send failed (services/src/routes.js).
HOP_FAILED = ("HOP_UNAVAILABLE", "NEXT_HOP_FAILED")
DETAILS = re.compile(r"\(([^\s()]+)")  # a point's reply puts Envoy's %RESPONSE_CODE_DETAILS% first in parentheses (proxy/replies.py)
INSIDE, ON_ITS_WAY, BEYOND = "inside the killed instance", "on its way into it", "beyond the in-flight"


def replicated_services(topology: str, services: int, replicas: int) -> list[dict]:
    """The service entries a count of `services` generates in `topology`'s manifest, each with
    `replicas`: read back from the manifest's own expansion, so nothing here restates it."""
    generated = manifest.load(topology, services=services).instances
    return [{"id": i.id, "step": i.step, "region": i.region, "certifications": list(i.certifications), "purposes": list(i.purposes),
             **({name: list(values) for name, values in i.attributes}), "replicas": replicas} for i in generated]


def load_manifest(topology: str, services: int, engine: str | None, replicas: int = 1, work_iterations: int | None = None,
                  overrides: dict | None = None) -> manifest.Topology:
    """`topology` at `services` steps, each step `replicas` instances alike, its services doing
    `work_iterations` (None: the manifest's)."""
    overrides = dict(overrides or {})
    if work_iterations is not None:
        overrides["workload"] = {"work_iterations": work_iterations}
    spec = services if replicas == 1 else replicated_services(topology, services, replicas)
    return manifest.load(topology, services=spec, engine=engine, overrides=overrides)


# ---- the audit lines ----------------------------------------------------------------------------

def audit_index(run_dir: Path) -> dict[str, list[tuple[float, str, str]]]:
    """Every audit line of a deployment by record id: (Unix time in s, instance, step), in time order."""
    index: dict[str, list[tuple[float, str, str]]] = {}
    for path in sorted((Path(run_dir) / "audit").glob("*.jsonl")):
        with path.open() as file:
            for raw in file:
                try:
                    line = json.loads(raw)
                    index.setdefault(line["request_id"], []).append((line["ts"] / 1000, line["instance"], line["step"]))
                except (ValueError, KeyError, TypeError):
                    continue  # a partial last line of a killed instance: the audit's own check reports the chain
    for lines in index.values():
        lines.sort()
    return index


def balance(index: dict[str, list[tuple[float, str, str]]]) -> dict[str, dict[str, float]]:
    """Per step, each instance's share of the records the step received."""
    counts: dict[str, Counter] = {}
    for lines in index.values():
        for _, instance, step in lines:
            counts.setdefault(step, Counter())[instance] += 1
    return {step: {instance: round(n / sum(by.values()), 4) for instance, n in sorted(by.items())} for step, by in sorted(counts.items())}


def balanced(shares: dict[str, dict[str, float]], tolerance: float = BALANCE_TOLERANCE) -> bool:
    """Whether every step's instances each got an even share within `tolerance` (of all the step's records)."""
    return bool(shares) and all(abs(share - 1 / len(by)) <= tolerance for by in shares.values() for share in by.values())


# ---- what a kill of a service instance lost --------------------------------------------------------

def classify_loss(row: dict, lines: list[tuple[float, str, str]], killed: str, killed_at: float, died_at: float, steps: list[str],
                  step_of: dict[str, str]) -> str:
    """Why one request lost to the kill of `killed` (the signal at `killed_at`, its process seen
    exited at `died_at`) was lost: INSIDE, ON_ITS_WAY or BEYOND.

    `row`: its requests.csv row (t and rtt in s, status, code); `lines`: its audit lines;
    `steps`: the chain's steps in order; `step_of`: each instance's step."""
    if row["t"] + row["rtt"] < killed_at:
        return BEYOND  # answered before the kill: not lost to it
    # Every hop waits for the next one's answer, so the killed instance held every record it had
    # received and not yet answered, whichever later steps the record reached.
    if any(instance == killed and ts <= died_at for ts, instance, _ in lines):
        return INSIDE
    position = steps.index(step_of[killed])
    if row["code"] in HOP_FAILED and not any(steps.index(step) >= position for _, _, step in lines):
        before = [ts for ts, _, step in lines if steps.index(step) == position - 1]
        sent_at = max(before) if before else (row["t"] if position == 0 else None)
        if sent_at is not None and sent_at <= died_at:
            return ON_ITS_WAY
    return BEYOND


def answer_name(row: dict) -> str:
    """An answer as the report counts it: status, code, and why Envoy could not deliver when a
    point says (its message's %RESPONSE_CODE_DETAILS%, the first word in parentheses: no_healthy_upstream, ...)."""
    said = DETAILS.search(row.get("message") or "")
    detail = said.group(1) if said else ""
    return f"{row['status']} {row['code'] or '-'}" + (f" ({detail})" if detail else "")


def classify_losses(rows: list[dict], kills: list[dict], index: dict, steps: list[str], step_of: dict[str, str]) -> dict:
    """Per kill of a service instance (each with target, injected_at, died_at and until, the next
    fault's injection), the requests answered otherwise than expected within it, by class, with the
    statuses and codes of those BEYOND. Rows need request_id (requests.csv's)."""
    per_kill = []
    for kill in kills:
        counts = {INSIDE: 0, ON_ITS_WAY: 0, BEYOND: 0}
        beyond: Counter = Counter()
        for row in rows:
            if row["status"] == row["expected"] or not kill["injected_at"] <= row["t"] + row["rtt"] < kill["until"]:
                continue
            kind = classify_loss(row, index.get(row["request_id"], []), kill["target"], kill["injected_at"], kill["died_at"], steps, step_of)
            counts[kind] += 1
            if kind == BEYOND:
                beyond[answer_name(row)] += 1
        per_kill.append({"target": kill["target"], "injected_at": kill["injected_at"], "died_after_s": round(kill["died_at"] - kill["injected_at"], 4),
                         **counts, "beyond_answers": dict(beyond)})
    return {"kills": len(per_kill), "per_kill": per_kill,
            **{kind: sum(k[kind] for k in per_kill) for kind in (INSIDE, ON_ITS_WAY, BEYOND)},
            "beyond_answers": dict(sum((Counter(k["beyond_answers"]) for k in per_kill), Counter()))}


# ---- the soak report's section ----------------------------------------------------------------------

def cell_name(summary: dict) -> str:
    """A topology's row: its paper name, engine and instances per step."""
    p = summary["parameters"]
    return f"{summary['paper_name']} {p['engine']} ×{p.get('replicas', 1)}"


def report_lines(summaries: list[dict]) -> list[str]:
    """What each kill of a service instance lost, told apart (classify_losses), and each step's balance."""
    lines = ["", "## Kills of service instances: what they lost", "",
             "An instance died when its process had exited, its sockets closed (until then they take a sender's bytes), "
             "not when the signal was sent. Inside: the killed instance had written the record's audit line before it died "
             "(it was working on it or waiting for the next hop's answer). On its way: no line at the killed step, its last "
             "line at the step before written before it died (a first step: sent by the client before it), and the answer "
             f"says the hop failed under it ({' or '.join(HOP_FAILED)}). Neither may be retried (delivered). Beyond: every "
             "other loss, which a replica that was up should have taken.", "",
             "| topology | service kills | died after the signal (ms, max) | lost | inside | on its way | beyond | lost beyond per kill | answers beyond | balance (share per instance) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for s in summaries:
        k = s.get("service_kills")
        if not k:
            continue
        lost = k[INSIDE] + k[ON_ITS_WAY] + k[BEYOND]
        spread = "; ".join(f"{step}: {'/'.join(f'{share:.1%}' for share in by.values())}" for step, by in s["balance"].items()
                           if len(by) > 1) or "one instance per step"
        verdict = "" if s["balanced"] is None else f" ({'within' if s['balanced'] else 'NOT within'} ±{BALANCE_TOLERANCE:.0%})"
        died = max((kill["died_after_s"] for kill in k["per_kill"]), default=None)
        lines.append(f"| {cell_name(s)} | {k['kills']} | {'-' if died is None else round(died * 1000, 1)} | {lost} | {k[INSIDE]} | {k[ON_ITS_WAY]} | {k[BEYOND]} | "
                     f"{round(k[BEYOND] / k['kills'], 2) if k['kills'] else '-'} | {k['beyond_answers'] or 'none'} | {spread}{verdict} |")
    return lines
