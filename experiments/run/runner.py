"""Run the matrix: for each cell deploy, check, load with Locust, collect, tear down.

A run lives in results/<run-id>/: metadata.json (parameters, commit, versions, machine,
sessions), raw/<cell>/ per cell, raw/bench.csv (`make bench`'s measurement, taken by every
session before its cells). A cell is finished once its cell.json is written; a resumed run
skips finished cells and redoes any other. A cell is deployed and loaded as loader.py does
it: Ctrl-C (or SIGTERM) stops Locust and the deployment (a bench stops its own processes),
checks that none of their processes is left, and the run says how to resume. Where the cells
deploy is the run's Target (design/targets.py: processes on this machine, or the current kubectl
context: complyroute/runtime/target.py), recorded in metadata.json.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

from tqdm import tqdm

from complyroute.policy.ruleset import RuleSet
from complyroute.runtime.target import DeployFailed
from complyroute.topology import manifest
from complyroute.topology.manifest import REPO

from experiments.analysis import stats
from experiments.design.capacity import KEPT_CAPACITY, command_for
from experiments.design.matrix import BENCH_CSV, Cell, Parameters, case_name
from experiments.design.targets import unmeasured
from experiments.run import metadata
from experiments.run.loader import RUN_TIME_MARGIN_S, SETTLE_S, CellFailed, Loader, compress

RESULTS = REPO / "experiments" / "results"
BENCH_LOG = "bench.log"  # in raw/: what the bench printed, every session's


def new_run_id(profile: str) -> str:
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{profile}"


def overhead_estimate(cell: Cell) -> float:
    """Seconds a cell spends besides its load (deploy, check, Locust start, teardown).

    Measured on the 2-core machine (see README): about 1.5 s plus 0.4 s per service, most of
    it the services' start; waiting for slow answers at the end of a saturated cell adds up to
    6 s more. Only the progress bar uses it; its ETA corrects itself as cells finish.
    """
    return 1.5 + 0.4 * cell.services


def cell_estimate(cell: Cell, parameters: Parameters) -> float:
    priming = parameters.prime_seconds(cell.rate) + RUN_TIME_MARGIN_S + SETTLE_S if parameters.prime else 0
    return overhead_estimate(cell) + priming + parameters.warmup + parameters.duration + RUN_TIME_MARGIN_S


# What a cell leaves on disk, measured on local run folders here (mixed regions, 8 services): a
# run folder's configuration, credentials and bundles, about 0.14 MB a service; per record and
# service, its audit line (about 450 bytes) and the access log lines of the points its hop
# crossed (about 480 bytes each; a sidecar topology's hop crosses two listeners, counted for every
# topology); and the cell's raw results, about 150 bytes a record (experiments/sample: 1.7 MB).
RUN_FOLDER_BYTES_PER_SERVICE = 140_000
HOP_BYTES = 450 + 2 * 480
RECORD_BYTES = 150
# The bench's time a record and round, its paced rounds (10 ms a record) and policy rows included:
# 3 rounds of 1,000 records took 228 s here (benchsum-20261129, a quiet machine).
BENCH_SECONDS_PER_RECORD_ROUND = 228 / 3000


def cell_disk_estimate(cell: Cell, parameters: Parameters) -> int:
    """Bytes a cell writes (its deployment's run folder and its raw results), estimated."""
    records = cell.rate * (parameters.warmup + parameters.duration) + (parameters.prime if parameters.prime else 0)
    return cell.services * RUN_FOLDER_BYTES_PER_SERVICE + records * (cell.services * HOP_BYTES + RECORD_BYTES)


def dry_run(parameters: Parameters, out) -> None:
    """What a run of `parameters` would do, without doing it: its matrix, how long it would take
    here and what it would write, estimated as the progress bar estimates a cell."""
    cells = parameters.cells()
    seconds = sum(cell_estimate(cell, parameters) for cell in cells)
    bench_seconds = BENCH_SECONDS_PER_RECORD_ROUND * parameters.bench_records * parameters.bench_rounds
    disk = sum(cell_disk_estimate(cell, parameters) for cell in cells)
    cases = list(dict.fromkeys(case_name(cell.topology, cell.engine) for cell in cells))
    print(f"dry run of profile {parameters.profile}: nothing is deployed or written", file=out)
    print(f"  cases ({len(cases)}): {', '.join(cases)}", file=out)
    print(f"  rates {' '.join(map(str, parameters.rates))} req/s; chain lengths {' '.join(map(str, parameters.services))} services; "
          f"{parameters.repetitions} repetition(s); {parameters.warmup} s warm-up + {parameters.duration} s measured a cell; "
          f"{parameters.load_label}, mix {parameters.mix}, rule set {parameters.policy}", file=out)
    print(f"  {len(cells)} cells, about {seconds / 3600:.1f} h here, and the bench first "
          f"({parameters.bench_rounds} rounds of {parameters.bench_records} records: about {bench_seconds / 60:.0f} min)", file=out)
    print(f"  disk: at most about {disk / 1e9:.1f} GB (run folders under runs/ and raw results; a saturated cell delivers fewer "
          f"records), the largest cell {max(cell_disk_estimate(cell, parameters) for cell in cells) / 1e9:.2f} GB", file=out)


def finished(cell_dir: Path) -> bool:
    return (cell_dir / "cell.json").exists()


def finished_cell(raw: Path, cell: Cell) -> bool:
    """Whether the cell's results are in raw/, under its key or, in a run recorded before
    engines, under the key it had then."""
    return any(finished(raw / name) for name in cell.folder_names)


def write_json(path: Path, data: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2))
    tmp.replace(path)


class Runner(Loader):
    """A matrix's run: its sessions (metadata.json), the bench of each, its cells in turn, resumable."""

    # ---- the run --------------------------------------------------------------------

    def start_session(self) -> dict:
        path = self.run_dir / "metadata.json"
        taken = metadata.describe()
        where = self.target.describe()
        added = 0
        if path.exists():
            meta = json.loads(path.read_text())
            added = self.parameters.repetitions - meta["parameters"]["repetitions"]
            if added > 0:  # resumed with more repetitions (matrix.conflicts): the run has them from now on
                meta["parameters"]["repetitions"] = self.parameters.repetitions
        else:
            meta = {"run_id": self.run_dir.name, "created_at": taken["taken_at"], "parameters": self.parameters.to_json(),
                    "target": where, "unmeasured": unmeasured(self.target),
                    "git": taken["git"], "versions": taken["versions"], "machine": taken["machine"],
                    "locust": self.locust_description(),
                    "sessions": []}
        # Every session records what it ran with: a resumed run may have changed machine, tools or cluster.
        meta["sessions"].append({"started_at": taken["taken_at"], "git": taken["git"], "versions": taken["versions"],
                                 "load_average_at_start": taken["machine"]["load_average_at_start"], "target": where,
                                 **({"repetitions_added": added} if added > 0 else {})})
        write_json(path, meta)
        return meta

    def end_session(self, outcome: str, cells_run: int) -> None:
        path = self.run_dir / "metadata.json"
        meta = json.loads(path.read_text())
        meta["sessions"][-1].update({"ended_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "outcome": outcome, "cells_run": cells_run})
        write_json(path, meta)

    def run(self) -> int:
        self.raw.mkdir(parents=True, exist_ok=True)
        self.start_session()
        cells = self.parameters.cells()
        pending = [cell for cell in cells if not finished_cell(self.raw, cell)]
        report_html = self.run_dir / "report" / "report.html"
        print(f"experiments: run {self.run_dir.name}: {len(cells)} cells, {len(cells) - len(pending)} already finished, "
              f"{len(pending)} to run", file=self.out)
        print(f"experiments: raw data in {self.raw}", file=self.out)
        print(f"experiments: the report will be {report_html} (and report.md beside it)", file=self.out)
        done = 0

        def measure() -> None:
            nonlocal done
            if pending:
                self.measure_bench()
            with tqdm(total=sum(cell_estimate(c, self.parameters) for c in pending), unit="s", file=sys.stderr,
                      bar_format="{desc} |{bar}| {percentage:3.0f}% [{elapsed} elapsed, ETA {remaining}]",
                      dynamic_ncols=True, disable=not pending) as progress:
                for index, cell in enumerate(pending, 1):
                    progress.set_description(f"cell {index}/{len(pending)}: {cell.label}")
                    self.run_cell(cell, progress)
                    done += 1

        results = "" if self.run_dir.parent == RESULTS else f" --results {self.run_dir.parent}"
        stopped = self.stop_cleanly(measure, lambda outcome: self.end_session(outcome, done), "experiments",
                                    resume=f"python -m experiments{results} run --run-id {self.run_dir.name}")
        if stopped is not None:
            return stopped
        self.end_session("finished", done)
        failed = sorted(p.parent.name for p in self.raw.glob("*/failed.json"))
        if failed:
            print(f"experiments: {len(failed)} cells failed ({', '.join(failed)}); `--run-id {self.run_dir.name}` retries them", file=self.out)
        from experiments.report.report import build  # matplotlib only when a report is made

        paths = build(self.run_dir)
        print(f"experiments: report: {paths['html']}\nexperiments: report: {paths['markdown']}", file=self.out)
        if not (self.run_dir / KEPT_CAPACITY).is_dir():
            print("experiments: the price of enforcement as a share of the baseline's capacity needs a capacity run: "
                  f"python -m experiments{results} {command_for(self.parameters).removeprefix('python -m experiments ')}, then "
                  f"python -m experiments{results} report {self.run_dir.name} --capacity CAPACITY_RUN", file=self.out)
        return 0

    def measure_bench(self) -> None:
        """`make bench`'s measurement, once per session before its cells, into raw/bench.csv:
        what each part of a hop costs beside its floor, with the code and on the machine the
        cells then run with. An earlier session's bench.csv is kept as bench-session<k>.csv.
        A bench that fails is recorded and the cells run all the same: it is not what they measure."""
        path = self.run_dir / "metadata.json"
        meta = json.loads(path.read_text())
        skipped = "--bench-rounds 0" if self.parameters.bench_rounds == 0 else (
            None if self.target.runs_here else f"target {self.target.name}: the bench measures processes of this machine, "
                                                 "and the cells' parts do not run as such")
        if skipped:
            meta["sessions"][-1]["bench"] = {"skipped": skipped}
            write_json(path, meta)
            print(f"experiments: no bench ({skipped})", file=self.out)
            return
        self.target.check_free(None)  # a deployment's processes would share the cores the bench measures
        csv_file = self.raw / BENCH_CSV
        for number, session in enumerate(meta["sessions"][:-1], 1):
            if session.get("bench", {}).get("csv") == BENCH_CSV and csv_file.exists():
                kept = f"bench-session{number}.csv"
                csv_file.replace(self.raw / kept)
                session["bench"]["csv"] = kept
        size = {"records": self.parameters.bench_records, "rounds": self.parameters.bench_rounds}
        print(f"experiments: measuring what each part of a hop costs ({size['rounds']} rounds of {size['records']} records per part; "
              f"its output: {self.raw / BENCH_LOG})", file=self.out, flush=True)
        started = time.monotonic()
        with (self.raw / BENCH_LOG).open("a") as log:
            print(f"---- session {len(meta['sessions'])}, {time.strftime('%Y-%m-%dT%H:%M:%S%z')}", file=log, flush=True)
            try:
                from experiments.run import bench  # imported here: a bench that cannot even load is a failed bench

                rows = bench.run(RuleSet.of("policies"), out_file=csv_file, out=log, **size)  # the bench measures the shipped rule set
            except Exception as error:  # whatever stops the bench, the cells still run
                meta["sessions"][-1]["bench"] = {**size, "error": f"{type(error).__name__}: {error}"}
                write_json(path, meta)
                print(f"experiments: the bench failed ({str(error).splitlines()[0]}); see {self.raw / BENCH_LOG}", file=self.out)
                return
        seconds = round(time.monotonic() - started, 1)
        not_met = [row.part for row in rows if row.verdict == "NOT MET"]
        meta["sessions"][-1]["bench"] = {"csv": BENCH_CSV, **size, "seconds": seconds, "targets_not_met": not_met}
        write_json(path, meta)
        print(f"experiments: bench measured in {seconds:.0f} s: {csv_file}"
              + (f"; targets not met: {', '.join(not_met)}" if not_met else "; every target met"), file=self.out)

    # ---- one cell -------------------------------------------------------------------

    def run_cell(self, cell: Cell, progress: tqdm) -> None:
        for name in cell.folder_names:  # what an interrupted or failed attempt left
            if (self.raw / name).exists():
                shutil.rmtree(self.raw / name)
        cell_dir = self.raw / cell.key
        cell_dir.mkdir(parents=True)
        estimate = cell_estimate(cell, self.parameters)
        shown = 0.0

        def advance(seconds: float) -> None:
            nonlocal shown
            step = max(0.0, min(seconds, estimate - shown))
            progress.update(step)
            shown += step

        started = time.monotonic()
        timings = {}
        record = {"cell": vars(cell), "offered_rate": cell.rate, "users": self.parameters.users(cell.rate),
                  "warmup_s": self.parameters.warmup, "duration_s": self.parameters.duration, "mix": self.parameters.mix,
                  **self.load_of(cell)}
        with (cell_dir / "deploy.log").open("w") as log:
            try:
                state = self.deploy(cell, log)
                timings["deploy_s"] = round(time.monotonic() - started, 2)
                record["deployment"] = {key: value for key, value in state.items() if key not in ("entry_url", "cpu_parts")}
                advance(overhead_estimate(cell) * 0.7)
                if self.parameters.prime:
                    seconds = self.parameters.prime_seconds(cell.rate)
                    self.prime(cell, cell_dir / "prime", state, seconds)
                    record["primed"] = {"rate": cell.rate, "seconds": seconds}
                    advance(seconds + RUN_TIME_MARGIN_S + SETTLE_S)
                load_started = time.monotonic()
                record["locust"] = self.load(cell, cell_dir, state, advance)
                timings["load_s"] = round(time.monotonic() - load_started, 2)
            except (DeployFailed, manifest.ManifestError, CellFailed) as error:
                self.undeploy(log)
                write_json(cell_dir / "failed.json", {**record, "error": str(error), "at": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
                advance(estimate)
                tqdm.write(f"{cell.label}: FAILED: {str(error).splitlines()[0]}", file=self.out)
                return
            teardown_started = time.monotonic()
            self.undeploy(log)
        timings["teardown_s"] = round(time.monotonic() - teardown_started, 2)
        timings["total_s"] = round(time.monotonic() - started, 2)
        compress(cell_dir / "requests.csv")
        record.update({"timings": timings, "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
        write_json(cell_dir / "cell.json", record)
        advance(estimate)
        summary = stats.summarize_cell(cell_dir)
        if self.parameters.load == "open":  # Poisson arrivals schedule a little more or less than the offered rate
            sent = (f"sent {summary['achieved_rate']:.1f} of {summary['scheduled'] / self.parameters.duration:.1f} req/s scheduled "
                    f"({cell.rate} offered, {summary['missed']} missed)")
        else:
            sent = f"achieved {summary['achieved_rate']:.1f} of {cell.rate} req/s"
        tqdm.write(
            f"{cell.label}: {sent}, median RTT {summary['median']:.1f} ms, errors {summary['error_rate']:.1%}"
            f"{'  SATURATED' if summary['saturated'] else ''}",
            file=self.out,
        )
