"""Faults on a schedule for a running local deployment: kill, pause, reload.

A schedule is a list of faults, each at a time (seconds after the schedule starts) on one
target, a part of the deployment by its name (state.json's parts):

- kill: SIGKILL to the part's process group. supervisord (supervision.py) starts it again;
  the part is back once its health check answers.
- pause: SIGSTOP to its process group, SIGCONT `seconds` later: alive but answering nothing
  meanwhile, which no supervisor notices (a hung process).
- reload: the rule set applied again (reload.reload_policy); the target is "policy".

Each fault is recorded with when it was injected, the part and its kind, and when the part
answered its health check again: recovery_s, from the fault to healthy (for a pause, including
the pause itself); for a kill also when the process had exited (died_at: a killed process
tears its memory down before the kernel closes its sockets, which still take bytes meanwhile;
on this machine that takes milliseconds), the new pid and when supervisord had started it
again (restart_s). The injector waits for a part to recover before the next fault falls due, so one
fault's recovery is never mixed up with the next's; a fault not recovered within the timeout
is recorded as not recovered (recovery_s None) and the schedule goes on.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import random
import select
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from complyroute.policy.ruleset import RuleSet
from complyroute.runtime.local import supervision

KINDS = ("kill", "pause", "reload")
POLICY = "policy"  # the target of a reload
POLL_S = 0.02  # between health checks while a part recovers


@dataclass(frozen=True)
class Fault:
    at: float  # seconds after the schedule's start
    kind: str  # kill | pause | reload
    target: str  # a part's name, or "policy" for a reload
    seconds: float = 0.0  # how long a pause lasts


@dataclass
class FaultRecord:
    kind: str
    target: str
    part_kind: str  # service | envoy | router | opa | control | policy
    scheduled_at: float  # seconds after the schedule's start
    injected_at: float  # Unix time (s) the signal was sent or the reload began
    died_at: float | None = None  # kill: Unix time (s) the process had exited, its sockets closed (None: not seen)
    pause_s: float = 0.0
    old_pid: int | None = None
    new_pid: int | None = None
    restart_s: float | None = None  # kill: until supervisord ran a new process
    recovery_s: float | None = None  # until the part's health check answered again (a reload: every point decides with it)
    healthy_at: float | None = None  # Unix time
    error: str | None = None
    detail: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def part_kind(state: dict, part: dict) -> str:
    """A part's kind as a fault schedule names it: an Envoy of a router point is a router."""
    if part["kind"] == "envoy" and "router" in part["name"].split("/", 1)[0]:
        return "router"
    return part["kind"]


def targets(state: dict, kinds: tuple[str, ...] = ("service", "envoy", "router", "opa")) -> list[str]:
    """The parts of a deployment a schedule may hit, by kind, in state.json's order."""
    return [part["name"] for part in state["parts"] if part_kind(state, part) in kinds]


def schedule(state: dict, duration: float, every: float, start: float | None = None, pause_s: float = 2.0,
             kinds: tuple[str, ...] = ("kill", "pause", "kill", "reload"), seed: int = 1,
             part_kinds: tuple[str, ...] = ("service", "envoy", "router", "opa")) -> list[Fault]:
    """A fault every `every` seconds from `start` (default: `every`) until `duration`: `kinds`
    in turn, each kill or pause on a part drawn (seeded) from those of `part_kinds`, kills and
    pauses each taking the kinds of part in turn so that every kind is killed and paused."""
    rng = random.Random(seed)
    by_kind: dict[str, list[str]] = {}
    for part in state["parts"]:
        kind = part_kind(state, part)
        if kind in part_kinds:
            by_kind.setdefault(kind, []).append(part["name"])
    part_kinds_present = [kind for kind in part_kinds if by_kind.get(kind)]
    faults, at, n = [], every if start is None else start, 0
    hits = {"kill": 0, "pause": 0}
    while at < duration:
        kind = kinds[n % len(kinds)]
        if kind == "reload":
            faults.append(Fault(at, "reload", POLICY))
        else:
            # Kills take the kinds of part in order, pauses from the last (an OPA first): each
            # fault kind meets every kind of part, even when they alternate.
            order = part_kinds_present if kind == "kill" else part_kinds_present[::-1]
            target = rng.choice(by_kind[order[hits[kind] % len(order)]])
            faults.append(Fault(at, kind, target, pause_s if kind == "pause" else 0.0))
            hits[kind] += 1
        at += every
        n += 1
    return faults


def _part(state: dict, name: str) -> dict:
    return next(part for part in state["parts"] if part["name"] == name)


def _healthy(part: dict) -> bool:
    return supervision.healthy(part["health_url"], timeout=0.5, tls=part.get("health_tls"))


def _current_pid(state: dict, name: str) -> int | None:
    info = (supervision.programs_info(state) or {}).get(name)
    return info["pid"] if info and info["statename"] in ("STARTING", "RUNNING") and info["pid"] else None


def _kill(pid: int, timeout: float) -> float | None:
    """SIGKILL to `pid`'s process group; when its process had exited (Unix time), waiting at most `timeout` s.

    The wait runs at real-time priority where allowed (root, CAP_SYS_NICE): on a loaded machine a
    thread woken at the exit can otherwise wait tens of milliseconds for a core, and the exit it
    stamps comes late by as much. It blocks meanwhile, so it takes no core from anyone."""
    exited = os.pidfd_open(pid)  # readable once the process has exited, after the kernel closed its files
    thread = threading.get_native_id()
    policy, param = os.sched_getscheduler(thread), os.sched_getparam(thread)
    with contextlib.suppress(PermissionError):
        os.sched_setscheduler(thread, os.SCHED_FIFO, os.sched_param(1))
    try:
        os.killpg(pid, signal.SIGKILL)
        poller = select.poll()
        poller.register(exited, select.POLLIN)
        return time.time() if poller.poll(timeout * 1000) else None
    finally:
        os.sched_setscheduler(thread, policy, param)
        os.close(exited)


def inject(state: dict, fault: Fault, start: float, recovery_timeout: float = 30.0,
           rule_set: RuleSet | None = None, out=sys.stdout) -> FaultRecord:
    """Inject one fault now and wait for its target to recover; its record. `rule_set`: what a
    reload fault applies (the deployed one, made once by whoever deployed it)."""
    if fault.kind == "reload":
        from complyroute.runtime.local import reload

        if rule_set is None:
            raise ValueError("a reload fault needs the rule set it applies")
        record = FaultRecord("reload", POLICY, "policy", round(fault.at, 3), time.time())
        try:
            result = reload.reload_policy(rule_set, out=open(os.devnull, "w"), timeout=recovery_timeout)
            record.recovery_s = result["seconds"]
            record.healthy_at = time.time()
            record.detail = {"revision": result["revision"]}
        except Exception as error:  # a failed reload is a finding, not the end of the schedule
            record.error = f"{type(error).__name__}: {error}"
        return record
    part = _part(state, fault.target)
    record = FaultRecord(fault.kind, fault.target, part_kind(state, part), round(fault.at, 3), 0.0, pause_s=fault.seconds)
    pid = _current_pid(state, fault.target)
    record.old_pid = pid
    if not pid:
        record.injected_at = time.time()
        record.error = "the part was not running when the fault fell due"
        return record
    began = time.monotonic()
    record.injected_at = time.time()
    try:
        if fault.kind == "kill":
            record.died_at = _kill(pid, recovery_timeout)
        elif fault.kind == "pause":
            os.killpg(pid, signal.SIGSTOP)
            time.sleep(fault.seconds)
            os.killpg(pid, signal.SIGCONT)
        else:
            raise ValueError(f"unknown fault kind {fault.kind!r} (kinds: {', '.join(KINDS)})")
    except ProcessLookupError:
        record.error = "the part's process was gone before the fault"
        return record
    deadline = began + fault.seconds + recovery_timeout
    while time.monotonic() < deadline:
        if fault.kind == "kill" and record.new_pid is None:
            new = _current_pid(state, fault.target)
            if new and new != pid:
                record.new_pid, record.restart_s = new, round(time.monotonic() - began, 3)
        if (fault.kind == "pause" or record.new_pid) and _healthy(part):
            record.recovery_s = round(time.monotonic() - began, 3)
            record.healthy_at = time.time()
            break
        time.sleep(POLL_S)
    else:
        record.error = f"not healthy again within {recovery_timeout:.0f} s"
    return record


def run(state: dict, faults: list[Fault], recovery_timeout: float = 30.0, rule_set: RuleSet | None = None,
        log: Path | None = None, stop: threading.Event | None = None, out=sys.stdout) -> list[FaultRecord]:
    """Inject every fault at its time (a fault falls due no earlier than the previous one's
    recovery); one JSON line per fault into `log` as it is recorded. `stop` ends the schedule
    early; `rule_set`: what a reload fault applies."""
    start = time.monotonic()
    records = []
    for fault in faults:
        wait = start + fault.at - time.monotonic()
        if stop is not None:
            if stop.wait(max(0.0, wait)):
                break
        elif wait > 0:
            time.sleep(wait)
        record = inject(state, fault, start, recovery_timeout, rule_set, out)
        records.append(record)
        recovered = f"recovered in {record.recovery_s:.2f} s" if record.recovery_s is not None else f"NOT RECOVERED: {record.error}"
        print(f"faults: t={time.monotonic() - start:6.1f} s {record.kind:<6} {record.target:<28} {recovered}", file=out, flush=True)
        if log is not None:
            with log.open("a") as lines:
                lines.write(json.dumps(record.to_json()) + "\n")
    return records
