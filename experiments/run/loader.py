"""How a cell is deployed and loaded, for the matrix's runner (runner.py) and the capacity search
(capacity_run.py): deploy through the run's Target (complyroute/runtime/target.py) and send one
check record through the chain; Locust's load at a rate, open or closed loop, for a cell's warm-up
and duration, with the CPU of the machine, of Locust and of the deployment sampled every second;
and a clean stop on Ctrl-C or SIGTERM that stops Locust and the deployment and checks that no
process of theirs is left.
"""

from __future__ import annotations

import gzip
import os
import shutil
import signal
import subprocess
import sys
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

import psutil

from complyroute.client import send
from complyroute.policy.ruleset import RuleSet
from complyroute.runtime.local.target import LocalTarget
from complyroute.runtime.target import Target, TargetBusy
from complyroute.topology import manifest
from complyroute.topology.manifest import REPO

from experiments.design.matrix import BASELINE, Cell, Parameters
from experiments.design.targets import chain_probe
from experiments.load.mixes import BODY, check_record

LOCUSTFILE = Path(__file__).resolve().parents[1] / "load" / "locustfile.py"
# How long Locust lets requests in flight at the end finish (they were sent in the window).
STOP_TIMEOUT_S = 30
# Open loop: a request unanswered this long fails (status 0), so every scheduled request has
# its row once the schedule's user stops; Locust lets that user finish the rest of its
# schedule and this wait before it stops it.
ANSWER_TIMEOUT_S = STOP_TIMEOUT_S
OPEN_LOOP_STOP_TIMEOUT_S = ANSWER_TIMEOUT_S + 15
# Besides warm-up and duration: Locust's start, the stop timeout, and slack for a loaded machine.
LOCUST_DEADLINE_SLACK_S = OPEN_LOOP_STOP_TIMEOUT_S + 90
SAMPLE_INTERVAL_S = 1.0
SETTLE_S = 1.0  # pause between two loads on one deployment, so the first's last answers are not the next one's start
# Locust's run time starts before its first request (t0, where the window is counted from):
# a second more keeps the whole window under load.
RUN_TIME_MARGIN_S = 1


class CellFailed(RuntimeError):
    """A cell that could not be measured; recorded in its failed.json and retried on resume."""


class CpuSampler:
    """Cumulative CPU seconds of the machine, of Locust and of the deployment, every second;
    the deployment's also split by the kind of part (service, envoy, opa).

    The report divides their increase over the measured window by its length: how many of
    the cores the system under test, the load generator and anything else on the machine
    (other users of a shared machine) kept busy; and, divided by the achieved rate, the CPU
    each kind of part spent per record. With parts None (a deployment whose parts are not
    processes of this machine: pods) the deployment's columns stay empty, not 0.
    """

    KINDS = ("service", "envoy", "opa", "control")
    COLUMNS = ("t_ms", "machine_busy_s", "locust_s", "deployment_s", *(f"{kind}_s" for kind in KINDS))

    def __init__(self, path: Path, locust_pid: int, parts: list[tuple[int, str]] | None):
        self.file = path.open("w")
        self.file.write(",".join(self.COLUMNS) + "\n")
        self.locust = psutil.Process(locust_pid)
        self.measured = parts is not None
        self.parts: list[tuple[psutil.Process, str]] = []
        for pid, kind in parts or []:
            try:
                self.parts.append((psutil.Process(pid), kind))
            except psutil.NoSuchProcess:
                pass

    @staticmethod
    def cpu_seconds(process: psutil.Process) -> float:
        try:
            times = process.cpu_times()
        except psutil.Error:  # it exited: its share is no longer counted
            return 0.0
        return times.user + times.system

    def sample(self) -> None:
        machine = psutil.cpu_times()
        # Work done on the cores (guest time is already in user and nice; steal is the host's).
        busy = machine.user + machine.nice + machine.system + machine.irq + machine.softirq
        by_kind = dict.fromkeys(self.KINDS, 0.0)
        for process, kind in self.parts:
            by_kind[kind] += self.cpu_seconds(process)
        if self.measured:
            deployment = f"{sum(by_kind.values()):.2f}," + ",".join(f"{by_kind[kind]:.2f}" for kind in self.KINDS)
        else:
            deployment = "," * len(self.KINDS)
        self.file.write(f"{time.time() * 1000:.0f},{busy:.2f},{self.cpu_seconds(self.locust):.2f},{deployment}\n")

    def close(self) -> None:
        self.file.close()


class Loader:
    """A run's deployments and their load, one at a time, and what Ctrl-C has to stop."""

    def __init__(self, run_dir: Path, parameters: Parameters, out=sys.stdout, target: Target | None = None):
        self.run_dir = run_dir
        self.raw = run_dir / "raw"
        self.parameters = parameters
        # The rule set every cell deploys, made once for the run (completed, dated, its labels read).
        self.rule_set = RuleSet.of(parameters.policy)
        self.out = out
        self.target = target or LocalTarget()
        # What Ctrl-C has to stop: the Locust process, and the deployment the target started.
        self.locust: subprocess.Popen | None = None
        self.cpu_parts: list[tuple[int, str]] | None = []  # (pid, kind) of the deployed parts; None: not processes of this machine

    def locust_description(self) -> dict:
        """How Locust generated the load, for metadata.json."""
        if self.parameters.load == "open":
            return {"load": "open", "arrivals": self.parameters.arrivals, "user_class": "OpenLoopUser (FastHttpUser)",
                    "pacing": "one user walks the schedule and sends each record in a greenlet of its own at its intended time",
                    "max_in_flight": self.parameters.max_in_flight, "late_tolerance_ms": self.parameters.late_tolerance_ms,
                    "answer_timeout_s": ANSWER_TIMEOUT_S, "stop_timeout_s": OPEN_LOOP_STOP_TIMEOUT_S}
        return {"load": "closed", "stop_timeout_s": STOP_TIMEOUT_S, "user_class": "ClosedLoopUser (FastHttpUser)",
                "wait_time": "constant_throughput(user_rate) with a random phase per user"}

    @staticmethod
    def interrupt(signum, frame):
        raise KeyboardInterrupt

    def stop_cleanly(self, work: Callable[[], None], end: Callable[[str], None], name: str, resume: str | None = None) -> int | None:
        """Run `work` so that Ctrl-C and SIGTERM stop it cleanly (also when started where SIGINT
        is ignored: a background job of a script), and a busy target stops it before it starts
        anything. None when the work finished; else `end` has been told the outcome, a line
        says what is left (and how to resume), and the exit code is returned."""
        previous_handlers = {sig: signal.signal(sig, self.interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            work()
            return None
        except TargetBusy as error:
            end("stopped: another deployment is running")
            print(f"{name}: {error}" + (f"; resume with: {resume}" if resume else ""), file=self.out)
            return 2
        except KeyboardInterrupt:
            left = self.stop_everything()
            end("interrupted")
            if left:
                print(f"{name}: interrupted; processes {left} are still running: stop them by hand", file=self.out)
                return 1
            print(f"{name}: interrupted; Locust and the deployment are stopped and no process of theirs is left", file=self.out)
            if resume:
                print(f"{name}: resume with: {resume}", file=self.out)
            return 130
        finally:
            for sig, handler in previous_handlers.items():
                signal.signal(sig, handler)

    # ---- one deployment and its load ---------------------------------------------------

    def deploy(self, cell: Cell, log) -> dict:
        """Deploy through the same code as `make deploy` (target=k8s: as `make deploy target=k8s`),
        unless another deployment is there (TargetBusy: the run stops); it returns once every part
        is healthy and the entry is reached. One record through the whole chain then shows the
        chain works before it is loaded."""
        topology = self.manifest_of(cell)
        self.target.check_free(topology)
        state = self.target.deploy(topology, self.rule_set, log)
        state |= self.target.reach(topology, chain_probe(cell.services), log)
        self.cpu_parts = state["cpu_parts"]
        if cell.engine and state["engine"] != cell.engine:
            raise CellFailed(f"deployed with engine {state['engine']} instead of {cell.engine}")
        answer = send(state["entry_url"], check_record(self.parameters.mix), BODY, request_id=f"experiment-check-{cell.key}", timeout=30,
                      policies=self.rule_set.folder)
        hops = len(answer.body["path"]) if answer.status == 200 and answer.body else 0
        if hops != cell.services:
            raise CellFailed(f"the check record did not go through the {cell.services} services: {answer.summary()}")
        return state

    def manifest_of(self, cell: Cell) -> manifest.Topology:
        """The manifest a cell deploys: its topology at its chain length under its engine."""
        return manifest.load(cell.topology, services=cell.services, engine=cell.engine, overrides={"policy": self.parameters.policy})

    def load_of(self, cell: Cell) -> dict:
        """What generated a cell's load, as its cell.json records it: the loop and its settings."""
        if self.parameters.load == "open":
            return {"load": "open", "arrivals": self.parameters.arrivals, "max_in_flight": self.parameters.max_in_flight,
                    "late_tolerance_ms": self.parameters.late_tolerance_ms, "answer_timeout_s": ANSWER_TIMEOUT_S,
                    "seed": zlib.crc32(cell.key.encode())}  # the same cell draws the same Poisson schedule again
        return {"load": "closed", "user_rate": self.parameters.user_rate}

    def prime(self, cell: Cell, prime_dir: Path, state: dict, seconds: int | None = None) -> None:
        """`cell`'s load on a fresh deployment before the one measured (matrix.DEFAULT_PRIME_RECORDS):
        its requests and CPU are kept in prime_dir, not judged. `seconds` of it (default: a cell's
        warm-up and duration)."""
        prime_dir.mkdir()
        self.load(cell, prime_dir, state, lambda _: None, seconds)
        compress(prime_dir / "requests.csv")
        time.sleep(SETTLE_S)

    def load(self, cell: Cell, cell_dir: Path, state: dict, advance, seconds: int | None = None) -> dict:
        """Locust at `cell`'s rate for `seconds` (default: the warm-up and the duration), into cell_dir."""
        entry = urlsplit(state["entry_url"])
        users = self.parameters.users(cell.rate)
        load_seconds = (self.parameters.warmup + self.parameters.duration if seconds is None else seconds) + RUN_TIME_MARGIN_S
        settings = self.load_of(cell)
        if settings["load"] == "open":
            user_class, stop_timeout = "OpenLoopUser", OPEN_LOOP_STOP_TIMEOUT_S
            loop = ["--rate", str(cell.rate), "--arrivals", settings["arrivals"], "--schedule-seconds", str(load_seconds),
                    "--seed", str(settings["seed"]), "--max-in-flight", str(settings["max_in_flight"]),
                    "--late-tolerance-ms", f"{settings['late_tolerance_ms']:g}", "--answer-timeout", str(settings["answer_timeout_s"])]
        else:
            user_class, stop_timeout = "ClosedLoopUser", STOP_TIMEOUT_S
            loop = ["--user-rate", str(settings["user_rate"])]
        command = [
            sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless",
            "--host", f"{entry.scheme}://{entry.netloc}",
            "--users", str(users), "--spawn-rate", str(min(users, 100)),
            "--run-time", f"{load_seconds}s",
            "--stop-timeout", str(stop_timeout), "--only-summary", "--loglevel", "WARNING",
            "--exit-code-on-error", "0",
            "--requests-csv", str(cell_dir / "requests.csv"), "--mix", self.parameters.mix,
            "--services", str(cell.services), "--enforcing", "no" if cell.topology == BASELINE else "yes",
            *loop, user_class,
        ]
        deadline = time.monotonic() + load_seconds + LOCUST_DEADLINE_SLACK_S
        with (cell_dir / "locust.log").open("w") as log:
            started_ms = time.time() * 1000
            self.locust = subprocess.Popen(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                           start_new_session=True)  # its own group: stopped by us, not by a terminal's Ctrl-C
            sampler = CpuSampler(cell_dir / "cpu.csv", self.locust.pid, self.cpu_parts)
            started = time.monotonic()
            shown = 0.0
            try:
                while self.locust.poll() is None:
                    sampler.sample()
                    if time.monotonic() > deadline:
                        self.stop_locust()
                        raise CellFailed(f"Locust did not end within {load_seconds + LOCUST_DEADLINE_SLACK_S} s")
                    elapsed = min(time.monotonic() - started, load_seconds)
                    advance(elapsed - shown)
                    shown = elapsed
                    time.sleep(SAMPLE_INTERVAL_S)
            finally:
                sampler.close()
        exit_code = self.locust.returncode
        self.locust = None
        if not (cell_dir / "requests.csv").exists() or exit_code != 0:
            raise CellFailed(f"Locust exited with {exit_code}; see {cell_dir / 'locust.log'}")
        return {"command": command, "exit_code": exit_code, "started_at_ms": round(started_ms), "ended_at_ms": round(time.time() * 1000)}

    # ---- stopping -------------------------------------------------------------------

    def stop_locust(self) -> None:
        if self.locust is None or self.locust.poll() is not None:
            return
        for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
            try:
                os.killpg(self.locust.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.locust.wait(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                continue

    def undeploy(self, log) -> None:
        self.target.undeploy(log)

    def stop_everything(self) -> list[int]:
        """Stop Locust and this run's deployment; return the pids of any of theirs still alive."""
        locust = self.locust
        self.stop_locust()
        with open(os.devnull, "w") as quiet:
            try:
                self.undeploy(quiet)
            except (RuntimeError, OSError):
                pass  # what is left is found and reported below
        left = [locust.pid] if locust is not None and locust.poll() is None else []
        return sorted(set(left + self.target.left_over()))


def compress(path: Path) -> None:
    """requests.csv -> requests.csv.gz (written plain by Locust, whose CPU time is precious)."""
    with path.open("rb") as plain, gzip.open(path.with_name(path.name + ".gz"), "wb", compresslevel=6) as packed:
        shutil.copyfileobj(plain, packed)
    path.unlink()
