"""Soak: a held rate through a supervised deployment while faults are injected on a schedule.

For each topology: deploy it (supervised: runtime/local/supervision.py), check one record goes through, run
Locust at the offered rate (the locustfile the matrix uses: one CSV row per request), and,
once the warm-up is over, inject a fault every `fault_every` seconds (complyroute/runtime/local/faults.py:
SIGKILL or SIGSTOP of a service, an Envoy, a router or an OPA; a rule-set reload), then stop
Locust, undeploy and audit the run folder with `python -m complyroute audit` (a process of
its own: the verdict does not come from the code that ran the load).

What it reports per topology (summary.json and report.md in results/soak-<time>/):

- accounting: Locust's own request count against the rows of requests.csv, and every row's
  outcome: answered as the record should be (200, or 451 for a record the rules deny),
  answered otherwise (by status code: 503 no decision, 502 the next hop failed under it, ...)
  or not answered (status 0: a connection error or a timeout).
- per fault: its kind and target, recovery_s (from the fault until the part's health check
  answers again; for a pause, the pause included), and the requests lost to it: those sent
  from its injection until the next fault that were not answered as they should be
  (requests lost before the first fault are counted apart).
- availability under the schedule: MTTR = mean recovery of the kill and pause faults (a
  reload is no failure; its losses are still counted), MTTF = the mean time from a recovery
  to the next fault (the schedule's interval less MTTR), A = MTTF / (MTTF + MTTR); beside it
  the share of requests of the measured window that were answered as they should be.
- the audit verdict: forbidden receptions and receptions without a decision must be 0.
- with `replicas` (every step's instance made N alike: a compliant set of N per hop), each
  step's balance over its instances and what each kill of a service instance lost, told apart
  (experiments/run/sets.py): the records inside the killed instance or on their way into it when it
  died, which nothing may retry, and any beyond them, which a replica that was up should have taken.

ICSOC 2020's reliability comparison of these topologies found that decentralised routing
loses more requests at equal crash probability. Here every topology gets the same schedule
(one fault per interval, on a part drawn from each kind in turn), so `lost per fault` is the
figure to set beside it; with a supervisor restarting parts within a second, what a crash
costs is bounded by the restart, whichever part it hits.
"""

from __future__ import annotations

import csv
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from complyroute.client import send
from complyroute.evidence import audit
from complyroute.policy.ruleset import RuleSet
from complyroute.runtime.local import deployment, faults, supervision
from complyroute.runtime.local.target import LocalTarget
from complyroute.topology import manifest
from complyroute.topology.manifest import REPO

from experiments.design.matrix import BASELINE, DEFAULT_USER_RATE, PAPER_NAMES
from experiments.design.matrix import ENFORCING as TOPOLOGIES
from experiments.design.targets import where_text
from experiments.load.mixes import ALLOWED_LABELS, BODY
from experiments.run import metadata, sets
from experiments.run.loader import LOCUSTFILE, STOP_TIMEOUT_S
from experiments.run.runner import RESULTS

DECENTRALISED = ("dynamic-router-3", "dynamic-router-6", "sidecar")
PART_KINDS = ("service", "envoy", "router", "opa")
FAILURES = ("kill", "pause")  # what counts towards MTTF and MTTR; a reload is no failure


class SoakError(RuntimeError):
    """A soak that could not run (a deployment already running, Locust failing)."""


@dataclass
class Parameters:
    topologies: list[str] = field(default_factory=lambda: list(TOPOLOGIES))
    engine: str = "envoy-opa"
    services: int = 5
    rate: int = 50  # requests per second offered
    duration: int = 60  # measured seconds, after the warm-up; the faults fall in them
    warmup: int = 5
    fault_every: float = 6.0
    pause_s: float = 2.0
    seed: int = 1
    mix: str = "allowed"
    user_rate: float = DEFAULT_USER_RATE
    restart: bool = True  # False: faults on an unsupervised deployment (a killed part stays down)
    replicas: int = 1  # instances of every step, alike (sets.load_manifest): the compliant set of each hop
    fault_kinds: list[str] = field(default_factory=lambda: ["kill", "pause", "kill", "reload"])  # in turn
    fault_parts: list[str] = field(default_factory=lambda: ["service", "envoy", "router", "opa"])  # kinds of part hit, in turn

    def __post_init__(self):
        if not 1 <= self.replicas <= manifest.MAX_REPLICAS:
            raise SoakError(f"--replicas must be from 1 to {manifest.MAX_REPLICAS}, got {self.replicas}")
        if not self.fault_kinds or set(self.fault_kinds) - set(faults.KINDS):
            raise SoakError(f"--fault-kinds {' '.join(self.fault_kinds)}: give one or more of {' '.join(faults.KINDS)}")
        if not self.fault_parts or set(self.fault_parts) - set(PART_KINDS):
            raise SoakError(f"--fault-parts {' '.join(self.fault_parts)}: give one or more of {' '.join(PART_KINDS)}")

    @property
    def users(self) -> int:
        return max(1, -(-self.rate // int(self.user_rate)))


QUICK = dict(topologies=["dynamic-router-3"], services=5, rate=20, duration=16, warmup=3, fault_every=3.0, pause_s=1.5, mix="mixed")


# ---- one topology ----------------------------------------------------------------------------


def locust_command(state: dict, folder: Path, parameters: Parameters) -> list[str]:
    entry = urlsplit(state["entry_url"])
    users = parameters.users
    return [
        sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless", "--host", f"{entry.scheme}://{entry.netloc}",
        "--users", str(users), "--spawn-rate", str(min(users, 100)), "--run-time", f"{parameters.warmup + parameters.duration + 1}s",
        "--stop-timeout", str(STOP_TIMEOUT_S), "--only-summary", "--loglevel", "WARNING", "--exit-code-on-error", "0",
        "--csv", str(folder / "locust"), "--requests-csv", str(folder / "requests.csv"), "--mix", parameters.mix,
        "--user-rate", str(parameters.user_rate), "--services", str(parameters.services),
        "--enforcing", "no" if state["topology"].startswith(BASELINE) else "yes",
        "ClosedLoopUser",  # a held rate per user, so Locust's own count of requests checks the rows
    ]


def run_topology(topology: str, folder: Path, parameters: Parameters, out=sys.stdout) -> dict:
    """Deploy, load, inject, undeploy, audit, analyse one topology; its summary (also summary.json)."""
    folder.mkdir(parents=True, exist_ok=True)
    if deployment.running():
        raise SoakError("another deployment is running: `make undeploy` it first")
    locust = None
    load_at_start = [round(load, 2) for load in os.getloadavg()]  # the machine is shared: what else ran is part of the figures
    with (folder / "deploy.log").open("w") as log:
        try:
            topology_manifest = sets.load_manifest(topology, parameters.services, parameters.engine, parameters.replicas)
            rule_set = RuleSet.of(topology_manifest.policy)  # what it deploys, and what a reload fault applies again
            state = deployment.deploy(topology_manifest, rule_set, out=log, restart=parameters.restart)
            answer = send(state["entry_url"], ALLOWED_LABELS, BODY, request_id="soak-check", timeout=30)
            if answer.status != 200 or len(answer.body["path"]) != parameters.services:
                raise SoakError(f"the check record did not go through the {parameters.services} services: {answer.summary()}")
            schedule = faults.schedule(state, parameters.warmup + parameters.duration - parameters.fault_every / 2,
                                       parameters.fault_every, start=parameters.warmup + 1, pause_s=parameters.pause_s,
                                       seed=parameters.seed, kinds=tuple(parameters.fault_kinds), part_kinds=tuple(parameters.fault_parts))
            (folder / "schedule.json").write_text(json.dumps([asdict(f) for f in schedule], indent=1))
            with (folder / "locust.log").open("w") as locust_log:
                locust = subprocess.Popen(locust_command(state, folder, parameters), cwd=REPO, stdout=locust_log,
                                          stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
                started = time.time()
                (folder / "faults.jsonl").unlink(missing_ok=True)
                records = faults.run(deployment.read_state(), schedule, rule_set=rule_set, log=folder / "faults.jsonl", out=out)
                try:
                    locust.wait(timeout=parameters.warmup + parameters.duration + STOP_TIMEOUT_S + 90)
                except subprocess.TimeoutExpired:
                    raise SoakError(f"Locust did not end; see {folder / 'locust.log'}") from None
            if locust.returncode != 0 or not (folder / "requests.csv").exists():
                raise SoakError(f"Locust exited with {locust.returncode}; see {folder / 'locust.log'}")
            restarts = supervision.restarts(deployment.read_state())
            load_at_end = [round(load, 2) for load in os.getloadavg()]
        finally:
            if locust is not None and locust.poll() is None:
                os.killpg(locust.pid, signal.SIGKILL)
                locust.wait()
            if deployment.read_state():
                deployment.stop(out=log)
    run_dir = Path(state["run_dir"])
    checked = subprocess.run([sys.executable, "-m", "complyroute", "audit", str(run_dir)], cwd=REPO, capture_output=True, text=True)
    (folder / "audit.txt").write_text(checked.stdout + checked.stderr)
    verdict = audit.audit_run(run_dir)
    summary = analyse(folder, records, started, parameters)
    summary.update(sets_of(folder, run_dir, records, topology_manifest))
    summary.update({
        "topology": topology, "folder": folder.name, "load_average": {"at_start": load_at_start, "at_end": load_at_end},
        "paper_name": PAPER_NAMES.get(topology, topology), "run_dir": str(run_dir), "parts": len(state["parts"]),
        "parts_by_kind": parts_by_kind(state),
        "restarts": {name: n for name, n in restarts.items() if n},
        "audit": {"exit_code": checked.returncode, "lines": verdict.lines, "forbidden": verdict.forbidden,
                  "undecided": verdict.undecided, "broken_chains": verdict.broken_chains, "clean": verdict.clean},
    })
    (folder / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary


def parts_by_kind(state: dict) -> dict[str, int]:
    counts: dict[str, int] = {}
    for part in state["parts"]:
        kind = faults.part_kind(state, part)
        counts[kind] = counts.get(kind, 0) + 1
    return counts


def lost_if_every_part_crashed_once(summary: dict) -> tuple[float | None, list[str]]:
    """Requests lost if every part the schedule may hit crashed once: per kind of part, its
    number of parts times the mean measured loss of a kill of that kind. What equal crash
    probability per part costs a topology, given what one crash of each kind cost here; None
    when a kind of part that the topology has was never killed (listed)."""
    kills = {name.split(" ", 1)[1]: group["lost_mean"] for name, group in summary["by_kind_and_part"].items() if name.startswith("kill ")}
    kinds = [kind for kind in ("service", "envoy", "router", "opa") if summary["parts_by_kind"].get(kind)]
    missing = [kind for kind in kinds if kind not in kills]
    if missing:
        return None, missing
    return round(sum(summary["parts_by_kind"][kind] * kills[kind] for kind in kinds), 1), []


def read_requests(path: Path) -> list[dict]:
    with path.open() as file:
        return [{"t": float(row["t_send_ms"]) / 1000, "rtt": float(row["rtt_ms"]) / 1000, "status": int(row["status"]),
                 "expected": int(row["expected"]), "request_id": row.get("request_id", ""), "code": row.get("code", ""),
                 "message": row.get("message", "")}
                for row in csv.DictReader(file)]


def sets_of(folder: Path, run_dir: Path, records: list[faults.FaultRecord], topology: manifest.Topology) -> dict:
    """Each step's balance over its instances, and the losses of every kill of a service
    instance told apart (sets.classify_losses), from the deployment's audit lines."""
    index = sets.audit_index(run_dir)
    injected = sorted(records, key=lambda r: r.injected_at)
    # A kill whose exit was not seen (died_at None: not within the recovery timeout) counts from its signal.
    kills = [{"target": r.target, "injected_at": r.injected_at, "died_at": r.died_at or r.injected_at,
              "until": injected[n + 1].injected_at if n + 1 < len(injected) else float("inf")}
             for n, r in enumerate(injected) if r.kind == "kill" and r.part_kind == "service" and not r.error]
    step_of = {i.id: i.step for i in topology.instances}
    losses = sets.classify_losses(read_requests(folder / "requests.csv"), kills, index, topology.steps, step_of)
    shares = sets.balance(index)
    return {"replicas_of_step": {step: len(topology.instances_of(step)) for step in topology.steps}, "service_kills": losses,
            "balance": shares, "balanced": sets.balanced(shares) if all(len(by) > 1 for by in shares.values()) else None}


def locust_count(folder: Path) -> int | None:
    """The number of requests Locust itself counted: its final summary's Aggregated line in
    locust.log (its stats CSV is last written before the requests in flight at the stop end)."""
    try:
        match = re.search(r"^\s+Aggregated\s+(\d+)\s", (folder / "locust.log").read_text(), re.MULTILINE)
    except FileNotFoundError:
        return None
    return int(match.group(1)) if match else None


def outcome(row: dict) -> str:
    if row["status"] == row["expected"]:
        return "as expected"
    if row["status"] == 0:
        return "connection error or timeout"
    return f"status {row['status']}"


def analyse(folder: Path, records: list[faults.FaultRecord], started: float, parameters: Parameters) -> dict:
    rows = read_requests(folder / "requests.csv")
    outcomes: dict[str, int] = {}
    for row in rows:
        outcomes[outcome(row)] = outcomes.get(outcome(row), 0) + 1
    counted = locust_count(folder)
    injected = sorted(records, key=lambda r: r.injected_at)
    per_fault = []
    for index, record in enumerate(injected):
        end = injected[index + 1].injected_at if index + 1 < len(injected) else float("inf")
        # A request is lost to the fault under way when its answer (or its error) came back.
        lost = [row for row in rows if record.injected_at <= row["t"] + row["rtt"] < end and row["status"] != row["expected"]]
        per_fault.append({
            "kind": record.kind, "target": record.target, "part_kind": record.part_kind, "at_s": round(record.injected_at - started, 2),
            "restart_s": record.restart_s, "recovery_s": record.recovery_s, "error": record.error, "lost": len(lost),
            # From the fault until the last request it lost ended.
            "outage_s": round(max(r["t"] + r["rtt"] for r in lost) - record.injected_at, 3) if lost else 0.0,
        })
    first = injected[0].injected_at if injected else float("inf")
    lost_before = sum(1 for row in rows if row["t"] + row["rtt"] < first and row["status"] != row["expected"])
    failures = [f for f in per_fault if f["kind"] in FAILURES]
    recovered = [f["recovery_s"] for f in failures if f["recovery_s"] is not None]
    mttr = statistics.mean(recovered) if recovered else None
    mttf = parameters.fault_every - mttr if mttr is not None else None
    measured = [row for row in rows if started + parameters.warmup <= row["t"] < started + parameters.warmup + parameters.duration]

    def by(key: str) -> dict:
        groups: dict[str, list[dict]] = {}
        for fault in per_fault:
            groups.setdefault(fault[key] if key == "kind" else f"{fault['kind']} {fault['part_kind']}", []).append(fault)
        return {name: {"faults": len(group), "lost_mean": round(statistics.mean(f["lost"] for f in group), 1),
                       "recovery_s_mean": _mean(f["recovery_s"] for f in group), "outage_s_mean": _mean(f["outage_s"] for f in group)}
                for name, group in sorted(groups.items())}

    return {
        "parameters": asdict(parameters), "started_at": started,
        "requests": len(rows), "locust_request_count": counted, "all_accounted": counted == len(rows), "outcomes": outcomes,
        "lost_before_first_fault": lost_before,
        "faults": per_fault, "by_kind": by("kind"), "by_kind_and_part": by("part"),
        "lost_per_fault": round(sum(f["lost"] for f in per_fault) / len(per_fault), 2) if per_fault else None,
        "lost_per_failure": round(sum(f["lost"] for f in failures) / len(failures), 2) if failures else None,
        "max_restart_s": max((f["restart_s"] for f in per_fault if f["restart_s"] is not None), default=None),
        "mttr_s": round(mttr, 3) if mttr is not None else None, "mttf_s": round(mttf, 3) if mttf is not None else None,
        "availability": round(mttf / (mttf + mttr), 4) if mttr is not None else None,
        "answered_as_expected_share": round(sum(r["status"] == r["expected"] for r in measured) / len(measured), 4) if measured else None,
        "achieved_rate": round(len(measured) / parameters.duration, 1),
    }


def _mean(values) -> float | None:
    values = [v for v in values if v is not None]
    return round(statistics.mean(values), 3) if values else None


# ---- every topology, and the report ----------------------------------------------------------


def report(summaries: list[dict], parameters: Parameters) -> str:
    faulted = f"{'/'.join(parameters.fault_kinds)} of {'/'.join(parameters.fault_parts)}"
    lines = [f"# Soak: {parameters.rate} req/s, {parameters.services} services, faults ({faulted}) every {parameters.fault_every:g} s "
             f"for {parameters.duration} s (pauses {parameters.pause_s:g} s){'' if parameters.restart else ', restarts OFF'}", "",
             "Rows: topology, engine, instances per step. " + where_text(LocalTarget().describe()), "",
             "| topology | requests | all accounted | as expected | lost before faults | faults | lost per fault | lost per kill/pause | "
             "max restart (s) | MTTR (s) | MTTF (s) | availability | answered as expected | audit |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for s in summaries:
        audit_text = f"{s['audit']['forbidden']} forbidden, {s['audit']['undecided']} undecided: {'clean' if s['audit']['clean'] else 'FAILED'}"
        lines.append(f"| {sets.cell_name(s)} | {s['requests']} | {'yes' if s['all_accounted'] else 'NO'} ({s['locust_request_count']}) | "
                     f"{s['outcomes'].get('as expected', 0)} | {s['lost_before_first_fault']} | {len(s['faults'])} | {s['lost_per_fault']} | "
                     f"{s['lost_per_failure']} | {s['max_restart_s']} | {s['mttr_s']} | {s['mttf_s']} | {s['availability']} | "
                     f"{s['answered_as_expected_share']} | {audit_text} |")
    lines += ["", "Outcomes other than as expected, per topology, and the machine's load average (1, 5, 15 min) at the start and "
              "the end of its load (the machine is shared):", ""]
    for s in summaries:
        others = {k: v for k, v in s["outcomes"].items() if k != "as expected"}
        load = s.get("load_average")  # soaks recorded before it have none
        lines.append(f"- {sets.cell_name(s)}: {others or 'none'}" + (f"; load {load['at_start']} -> {load['at_end']}" if load else ""))
    lines += ["", "Lost requests and recovery by fault and kind of part (mean per fault):", "",
              "| topology | fault | faults | lost | recovery (s) | outage (s) |", "|---|---|---|---|---|---|"]
    for s in summaries:
        for name, g in s["by_kind_and_part"].items():
            lines.append(f"| {sets.cell_name(s)} | {name} | {g['faults']} | {g['lost_mean']} | {g['recovery_s_mean']} | {g['outage_s_mean']} |")
    lines += sets.report_lines(summaries)
    lines += ["", "## Beside ICSOC 2020", "",
              "ICSOC 2020 compared these topologies' reliability and found that decentralised routing loses more requests "
              "at equal crash probability. Here a supervisor restarts a killed part within about a second, every topology "
              "gets the same schedule (one fault per interval, each kind of part in turn), and so different mixes of parts "
              "are hit: compare like with like. Lost per kill, by kind of part, and the requests lost if every part crashed "
              "once (equal crash probability per part: parts of each kind times the loss of one kill of that kind):", "",
              "| topology | parts (service/envoy/router/opa) | " + " | ".join(f"kill {k}" for k in ("service", "envoy", "router", "opa"))
              + " | every part crashing once |", "|---|---|---|---|---|---|---|"]
    for s in summaries:
        kills = {name.split(" ", 1)[1]: group["lost_mean"] for name, group in s["by_kind_and_part"].items() if name.startswith("kill ")}
        counts = "/".join(str(s["parts_by_kind"].get(k, 0)) for k in ("service", "envoy", "router", "opa"))
        total, missing = lost_if_every_part_crashed_once(s)
        lines.append(f"| {sets.cell_name(s)} | {counts} | " + " | ".join(str(kills.get(k, "-")) for k in ("service", "envoy", "router", "opa"))
                     + f" | {total if total is not None else 'not measured: no kill of ' + ', '.join(missing)} |")
    totals = {s["topology"]: lost_if_every_part_crashed_once(s)[0] for s in summaries}
    if totals.get("central-entity") is not None and any(totals.get(t) is not None for t in DECENTRALISED):
        more = [PAPER_NAMES[t] for t in DECENTRALISED if totals.get(t) is not None and totals[t] > totals["central-entity"]]
        measured = [PAPER_NAMES[t] for t in DECENTRALISED if totals.get(t) is not None]
        lines += ["", f"At equal crash probability per part, decentralised topologies losing more than CE: {', '.join(more) or 'none'} "
                  f"of {', '.join(measured)}" + (" (consistent with the claim)." if more and len(more) == len(measured) else ".")]
    lines += ["", "A single run per topology with few faults of each kind: the figures show orders of magnitude, "
              "not a significant difference."]
    return "\n".join(lines) + "\n"


def report_folder(folder: Path) -> Path:
    """report.md of a soak folder, from every topology's summary.json in it (cells added by --run-id included)."""
    summaries = [json.loads(path.read_text()) for path in sorted(folder.glob("*/summary.json"), key=lambda p: p.stat().st_mtime)]
    parameters = Parameters(**{k: v for k, v in json.loads((folder / "parameters.json").read_text()).items() if k != "target"})
    (folder / "report.md").write_text(report(summaries, parameters))
    return folder / "report.md"


def run(parameters: Parameters, results: Path = RESULTS, out=sys.stdout, run_id: str | None = None) -> tuple[Path, list[dict]]:
    """Soak each topology into results/<run_id> (default soak-<time>); a run id that exists gains
    these cells (one folder per topology, engine and replicas) and its report all of them."""
    folder = results / (run_id or f"soak-{time.strftime('%Y%m%d-%H%M%S')}")
    folder.mkdir(parents=True, exist_ok=True)
    if not (folder / "parameters.json").exists():
        (folder / "parameters.json").write_text(json.dumps({**asdict(parameters), "target": LocalTarget().describe()}, indent=1))
    taken = metadata.describe()  # each session's commit, versions and machine (a run id may gather several)
    with (folder / "sessions.jsonl").open("a") as sessions:
        sessions.write(json.dumps({**taken, "parameters": asdict(parameters)}) + "\n")
    summaries = []
    for topology in parameters.topologies:
        print(f"soak: {topology} ({parameters.engine}, {parameters.replicas} per step): {parameters.rate} req/s for "
              f"{parameters.warmup}+{parameters.duration} s, a fault every {parameters.fault_every:g} s", file=out, flush=True)
        cell = folder / f"{topology}_{parameters.engine}_r{parameters.replicas}"
        if cell.exists():
            raise SoakError(f"{cell} exists: this run already soaked {topology} under {parameters.engine} with {parameters.replicas} per step")
        summary = run_topology(topology, cell, parameters, out)
        summaries.append(summary)
        print(f"soak: {topology}: {summary['requests']} requests ({'all accounted' if summary['all_accounted'] else 'NOT all accounted'}), "
              f"lost per fault {summary['lost_per_fault']}, MTTR {summary['mttr_s']} s, availability {summary['availability']}, "
              f"audit {'clean' if summary['audit']['clean'] else 'FAILED'}", file=out, flush=True)
    print(f"soak: report {report_folder(folder)}", file=out)
    return folder, summaries
