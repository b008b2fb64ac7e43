"""A capacity run: per (topology, engine, services) one deployment, inside which the offered
rate is stepped as capacity.search directs; each step is a short run of the matrix's open-loop
Locust load (loader.Loader.load, experiments/load/openloop.py: RTT from each record's intended send
time, sends that cannot be made on time counted as missed), judged by capacity.judge.

A run lives in <results>/<run-id>/ (capacity-<date>-<time> by default): metadata.json (the
parameters, commit, versions, machine, each search's outcome), raw/steps.csv (one row per
step; the closing baseline searches' in raw/closing-steps.csv), raw/<search>/step<k>_r<rate>/ (each
step's requests.csv.gz, cpu.csv, step.json, locust.log) and raw/<search>/deploy.log; report/capacity.md and capacity.html, built from
metadata.json and raw/steps.csv alone (report/capacity_report.py; `capacity --report RUN` rebuilds
them), with tables/capacity.csv and figures/capacity_latency.png (.svg).
"""

from __future__ import annotations

import csv
import json
import math
import sys
import time
from dataclasses import asdict
from pathlib import Path

import pandas as pd

from complyroute.runtime.target import DeployFailed, Target
from complyroute.topology import manifest

from experiments.analysis import stats
from experiments.design import matrix
from experiments.design.capacity import (CLOSING_STEPS_CSV, STEP_COLUMNS, STEPS_CSV, Parameters, capacity_text, judge, search,
                                         search_key)
from experiments.design.matrix import MAX_ERROR_RATE, MIN_ACHIEVED_SHARE, PRIME_SHARE, ParameterError, case_name
from experiments.design.targets import unmeasured
from experiments.run import metadata, sets
from experiments.run.loader import SETTLE_S, CellFailed, Loader, compress
from experiments.run.runner import RESULTS, write_json


class CapacityRunner(Loader):
    """A run's deployment, open-loop load, CPU sampling and clean stop (loader.py), stepping the
    rate of one deployment instead of running one cell per deployment."""

    def __init__(self, run_dir: Path, parameters: Parameters, out=sys.stdout, target: Target | None = None):
        load = matrix.Parameters(profile="capacity", topologies=parameters.topologies, rates=[parameters.start_rate],
                                 services=parameters.services, repetitions=1, duration=parameters.step_seconds,
                                 warmup=parameters.step_warmup, mix=parameters.mix, load="open", arrivals="constant",
                                 max_in_flight=parameters.max_in_flight, late_tolerance_ms=parameters.late_tolerance_ms,
                                 engines=parameters.engines, bench_rounds=0, prime=0)  # a search primes once, not per step
        super().__init__(run_dir, load, out, target)
        self.capacity = parameters
        self.steps_csv = self.raw / STEPS_CSV
        self.closing_steps_csv = self.raw / CLOSING_STEPS_CSV

    def start(self) -> None:
        if (self.run_dir / "metadata.json").exists():
            raise ParameterError(f"{self.run_dir} already holds a run; name a new one with --run-id")
        self.raw.mkdir(parents=True, exist_ok=True)
        taken = metadata.describe()
        write_json(self.run_dir / "metadata.json", {
            "run_id": self.run_dir.name, "kind": "capacity", "created_at": taken["taken_at"], "parameters": asdict(self.capacity),
            "held": {"min_achieved_share": MIN_ACHIEVED_SHARE, "max_errors_and_missed_share": MAX_ERROR_RATE,
                     "p99_bound_ms": self.capacity.p99_bound_ms},
            "target": self.target.describe(), "unmeasured": unmeasured(self.target),
            "git": taken["git"], "versions": taken["versions"], "machine": taken["machine"], "locust": self.locust_description(),
            "searches": [], "outcome": "running"})
        closing = any(closing for *_, closing in self.capacity.searches())
        for steps_csv in (self.steps_csv, self.closing_steps_csv) if closing else (self.steps_csv,):
            with steps_csv.open("w", newline="") as file:
                csv.writer(file).writerow(STEP_COLUMNS)

    def manifest_of(self, cell: matrix.Cell) -> manifest.Topology:
        """The cell's manifest with the run's replicas of every step and its services' work."""
        return sets.load_manifest(cell.topology, cell.services, cell.engine, self.capacity.replicas, self.capacity.work_iterations,
                                  overrides={"policy": self.parameters.policy})

    def update_metadata(self, **changes) -> None:
        path = self.run_dir / "metadata.json"
        meta = json.loads(path.read_text())
        if "search" in changes:
            meta["searches"].append(changes.pop("search"))
        meta.update(changes)
        write_json(path, meta)

    def run(self) -> int:
        self.start()
        print(f"capacity: run {self.run_dir.name}: {len(self.capacity.searches())} searches; steps in {self.steps_csv}", file=self.out,
              flush=True)

        def search_all() -> None:
            for topology, engine, services, closing in self.capacity.searches():
                self.run_search(topology, engine, services, closing)

        def end(outcome: str) -> None:
            self.update_metadata(outcome=outcome, ended_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
            if outcome == "interrupted":
                build_report(self.run_dir)  # the searches done so far

        stopped = self.stop_cleanly(search_all, end, "capacity")
        if stopped is not None:
            return stopped
        self.update_metadata(outcome="finished", ended_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
        paths = build_report(self.run_dir)
        print(f"capacity: report: {paths['html']}\ncapacity: report: {paths['markdown']}", file=self.out)
        return 0

    def run_search(self, topology: str, engine: str | None, services: int, closing: bool = False) -> None:
        """One search in a deployment of its own; `closing`: the baseline's second search at this
        chain length, its steps in closing-steps.csv."""
        key = search_key(topology, engine, services, closing)
        folder = self.raw / key
        folder.mkdir(parents=True)
        name = f"{case_name(topology, engine)} {services} services{' (closing)' if closing else ''}"
        steps_csv = self.closing_steps_csv if closing else self.steps_csv
        started = time.monotonic()
        index = 0
        with (folder / "deploy.log").open("w") as log:
            try:
                state = self.deploy(matrix.Cell(topology, engine, self.capacity.start_rate, services, 0), log)
                deployed_s = round(time.monotonic() - started, 1)
                primed_at = self.prime_search(topology, engine, services, folder, state) if self.capacity.prime else None

                def step(rate: int) -> bool:
                    nonlocal index
                    index += 1
                    if index > 1:
                        time.sleep(SETTLE_S)
                    return self.run_step(topology, engine, services, index, rate, folder, state, name, steps_csv)

                result = search(step, self.capacity.start_rate, self.capacity.max_rate, self.capacity.gap,
                                max_steps=self.capacity.max_steps, confirmations=self.capacity.confirmations)
            except (DeployFailed, manifest.ManifestError, CellFailed) as error:
                self.undeploy(log)
                self.update_metadata(search={"topology": topology, "engine": engine, "services": services, "closing": closing,
                                             "error": str(error), "steps": index})
                print(f"capacity: {name}: FAILED: {str(error).splitlines()[0]}", file=self.out, flush=True)
                return
            self.undeploy(log)
        self.update_metadata(search={"topology": topology, "engine": engine, "services": services, "closing": closing,
                                     "capacity": result.capacity,
                                     "capped": result.capped, "lowest_failed": result.lowest_failed,
                                     "first_failed": result.first_failed, "converged": result.converged, "steps": len(result.steps),
                                     "primed_at_rate": primed_at, "deploy_s": deployed_s, "seconds": round(time.monotonic() - started, 1)})
        print(f"capacity: {name}: {capacity_text(result)} req/s ({len(result.steps)} steps, "
              f"{time.monotonic() - started:.0f} s)", file=self.out, flush=True)

    def prime_search(self, topology: str, engine: str | None, services: int, folder: Path, state: dict) -> int:
        """One step's load at PRIME_SHARE of the start rate on the fresh deployment, before the
        search's first step: its requests are kept (prime_r<rate>/), not judged. Returns its rate."""
        rate = max(1, round(self.capacity.start_rate * PRIME_SHARE))
        self.prime(matrix.Cell(topology, engine, rate, services, 0), folder / f"prime_r{rate}", state)
        return rate

    def run_step(self, topology: str, engine: str | None, services: int, index: int, rate: int, folder: Path, state: dict,
                 name: str, steps_csv: Path) -> bool:
        cell = matrix.Cell(topology, engine, rate, services, index)
        step_dir = folder / f"step{index:02d}_r{rate}"
        step_dir.mkdir()
        started_at = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        record = {"search": {"topology": topology, "engine": engine, "services": services}, "step": index, "offered_rate": rate,
                  "users": 1, "warmup_s": self.capacity.step_warmup, "duration_s": self.capacity.step_seconds,
                  "mix": self.capacity.mix, **self.load_of(cell)}
        record["locust"] = self.load(cell, step_dir, state, lambda seconds: None)
        compress(step_dir / "requests.csv")
        write_json(step_dir / "step.json", record)
        requests = stats.read_requests(step_dir)
        summary = stats.cell_statistics(requests, record)
        start = requests["t_intended_ms"].min() + record["warmup_s"] * 1000
        cpu = stats.cpu_cores(pd.read_csv(step_dir / "cpu.csv"), start, start + record["duration_s"] * 1000)
        held, reasons = judge(rate, summary["achieved_rate"], summary["scheduled"], summary["errors"], summary["missed"],
                              summary["p99"], self.capacity.p99_bound_ms)
        row = {
            "topology": topology, "engine": engine or stats.NO_ENGINE, "services": services, "step": index, "offered_rate": rate,
            "scheduled": summary["scheduled"], "sent": summary["requests"], "achieved_rate": round(summary["achieved_rate"], 2),
            "achieved_share": round(summary["achieved_rate"] / rate, 4), "errors": summary["errors"], "missed": summary["missed"],
            "loss_share": round((summary["errors"] + summary["missed"]) / summary["scheduled"], 4) if summary["scheduled"] else 1.0,
            "p50_ms": rounded(summary["median"]), "p95_ms": rounded(summary["p95"]), "p99_ms": rounded(summary["p99"]),
            "held": held, "why_not": "; ".join(reasons),
            "cpu_machine": rounded(cpu["cpu_machine"], 2), "cpu_locust": rounded(cpu["cpu_locust"], 2),
            "cpu_deployment": rounded(cpu["cpu_deployment"], 2), "started_at": started_at,
        }
        with steps_csv.open("a", newline="") as file:
            csv.writer(file).writerow([row[column] for column in STEP_COLUMNS])
        print(f"capacity: {name} step {index}: {rate} req/s: achieved {row['achieved_rate']:.1f} ({row['achieved_share']:.1%}), "
              f"errors+missed {row['loss_share']:.1%}, p50 {summary['median']:.0f} ms, p99 {summary['p99']:.0f} ms, "
              f"cores busy {cpu['cpu_machine']:.2f}: {'held' if held else 'NOT held: ' + row['why_not']}", file=self.out, flush=True)
        return held


def rounded(value: float, digits: int = 1):
    return "" if value is None or (isinstance(value, float) and math.isnan(value)) else round(float(value), digits)


def run(parameters: Parameters, results: Path = RESULTS, run_id: str | None = None, out=sys.stdout,
        target: Target | None = None) -> tuple[int, Path]:
    run_dir = results / (run_id or f"capacity-{time.strftime('%Y%m%d-%H%M%S')}")
    return CapacityRunner(run_dir, parameters, out, target).run(), run_dir


def build_report(run_dir: Path) -> dict:
    from experiments.report.capacity_report import build  # matplotlib only when a report is made

    return build(run_dir)
