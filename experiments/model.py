"""A model of the testbed: the CPU each part costs per record, fed to a discrete-event simulation
(simpy) of the nodes, cores and processes a record passes through. The CPU per part is what the
run's own cells measured under load (costs_under_load), or, for a run whose cells cannot tell it,
what `make bench` measured one part at a time.

A record's path is taken from the topology's own placement (complyroute.plan.place): the entry,
every service of the chain in turn, the sidecar ingress before a service, the point deciding the
hop out of it. Each part it passes is a *visit*: a process (a Node service, a point's Envoy or its
OPA, the load generator) on a node, holding one of the process's threads and one of the node's
cores for its CPU cost, drawn from an exponential distribution around its mean (or that
mean exactly). A Node service has one thread, an Envoy its point's concurrency, and so has its
OPA (the deployment sets its GOMAXPROCS to it). Queues are FIFO. A node's processes also spend CPU whatever the rate
(timers, health checks, polling: the idle CPU the fit on the cells finds), which records wait
behind. After its CPU a visit adds a fixed delay, per kind
of part, for what CPU figures do not hold (loopback transfer, waking a process,
the ext_authz round trip): fitted on two cells of the run (below), zero for Envoy and the client.

Two machines:
- this one: every part on one node of the run's cores, with the load generator (Locust) on it
  too, its CPU per request taken from the run's cells; the run's load (RunLoad): its open loop's
  arrivals, constant or Poisson, so a cell past its capacity is saturated; or, for runs of the
  closed loop, that loop as Locust runs it (users of `user_rate` each, a constant-throughput
  wait, random phases), so a saturated cell settles at the rate it carries, judged by the
  runner's criterion (under 95% of the offered rate);
- the paper's testbed: the placement's gateway node and three service nodes, each of
  PAPER_CORES hardware threads (the gateway PAPER_GATEWAY_CORES), load from other machines, Poisson arrivals (an open loop: JMeter's
  thread count is not published). A cell whose busiest process or node would need more than its
  capacity is saturated and gets no RTT.

Calibration: the delay of a service visit is fitted on the run's baseline cell at its lowest rate
and chain length, the delay of an OPA visit on the central entity (envoy-opa) cell of the same
rate and length. Both cells are named in the output; every other cell is a prediction. The CPU
per part fitted on the cells is a measurement of CPU, not of RTT: it holds no latency.
"""

from __future__ import annotations

import json
import math
import random
import statistics
from dataclasses import asdict, dataclass
from functools import cache
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import simpy  # noqa: E402
from scipy.optimize import nnls  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.ticker import FuncFormatter, NullFormatter  # noqa: E402

from complyroute import manifest  # noqa: E402
from complyroute.plan import GATEWAY_SENDER, place  # noqa: E402

from . import capacity_report, stats  # noqa: E402
from .matrix import (BASELINE, BENCH_CSV, COMPILED_ENGINE, DEFAULT_ARRIVALS, DEFAULT_USER_RATE, ENGINES, LOAD_OF_OLDER_RUNS,  # noqa: E402
                     MAX_REPETITION_CV, MIN_ACHIEVED_SHARE, PAPER_NAMES, TOPOLOGIES)
from .reporting import (COLORS, SATURATED_MARK, arch, color, load_paper_reference, marked, ms, names,  # noqa: E402
                        percent, rate_text, render_html, render_markdown, save)

PAPER_GATEWAY_CORES = 56  # the paper's gateway node (section IV.c)
PAPER_CORES = 48  # its service nodes: 48 to 56 hardware threads, which ones had which unpublished; the smaller
PAPER_RATES = (100, 500, 1000)
PAPER_SERVICES = (5, 10, 25, 50)
ONE_NODE = "machine"
# bench.csv rows (by their process; CPU rows only) each part of a path costs. The plain-HTTP
# rows: every bench since be16c7d has them, and deployments before ceffbcb spoke plain HTTP.
BENCH_PROCESSES = {
    "service": "service-work",  # a service with its default work (WORK_ITERATIONS: services/config.js)
    "forwarding": "forwarding/envoy",  # a sidecar's ingress, the baseline's entry
    "decision_envoy": "envoy-opa/envoy",
    "decision_opa": "envoy-opa/opa",
    "compiled_envoy": "envoy-compiled/envoy",
}
CPU_UNIT = "ms CPU/request"
# Simulated seconds per cell of this machine: at 8 the model's own noise moved a cell's error by
# 2 points from one seed to the next (20261126-below-capacity-p800: DR_3 envoy-opa r20 n10 -24%
# to -25%); at 30 the mean error was the same (0.076) for seeds 1-3.
THIS_MACHINE_SECONDS = 30.0
IDLE_SLICE_MS = 1.0  # the idle CPU of a node's processes, as the simulation spends it: a core for this long at a time


class ModelError(Exception):
    """The run lacks what the model needs (its bench, its cells)."""


@dataclass(frozen=True)
class Costs:
    """ms of CPU per record of each part: from a run's raw/bench.csv, or fitted on its cells
    (under_load). `entry_opa` is the entry's decision, which also issues the record's label
    token; the bench measures one decision alone, so from a bench it is `decision_opa`."""

    service: float
    forwarding: float
    decision_envoy: float
    decision_opa: float
    compiled_envoy: float
    entry_opa: float

    @classmethod
    def from_bench(cls, path: Path) -> "Costs":
        if not path.exists():
            raise ModelError(f"no bench at {path}: the model needs a run measured with its bench (--bench-rounds > 0)")
        bench = pd.read_csv(path)
        cpu = bench[bench["unit"] == CPU_UNIT].set_index("process")["value"]
        missing = [process for process in BENCH_PROCESSES.values() if process not in cpu.index]
        if missing:
            raise ModelError(f"{path} has no row for {', '.join(missing)}")
        costs = {name: float(cpu[process]) for name, process in BENCH_PROCESSES.items()}
        return cls(**costs, entry_opa=costs["decision_opa"])

    @classmethod
    def one_of(cls, part: str) -> "Costs":
        """1 ms for `part`, 0 for every other: a path's CPU with these costs counts `part`'s visits."""
        return cls(**{name: float(name == part) for name in COST_PARTS})


COST_PARTS = tuple(Costs.__dataclass_fields__)
# cpu.csv's kinds of deployment part (stats.CPU_KINDS), each with the parts of a path whose CPU it holds
PARTS_OF_CPU_KIND = {
    "service": ("service",),
    "envoy": ("forwarding", "decision_envoy", "compiled_envoy"),
    "opa": ("decision_opa", "entry_opa"),
}


@dataclass(frozen=True)
class LoadCosts:
    """CPU per record of each part as a run's cells measured it, with what the fit rests on."""

    costs: Costs
    idle_ms_per_s: dict[str, float]  # per process of each kind, whatever the rate (timers, stats, polling)
    cells: int  # the cells not saturated the fit used
    from_bench: list[str]  # parts no such cell visited: the bench's figure stands


def idle_on_one_node(under_load: LoadCosts | None, topology: str, engine: str | None, services: int) -> dict[str, float]:
    """The idle CPU (ms/s) of a deployment's processes, all on this machine's one node; none from a bench."""
    if under_load is None:
        return {}
    running = processes(topology, engine, services)
    return {ONE_NODE: sum(ms_per_s * running[kind] for kind, ms_per_s in under_load.idle_ms_per_s.items())}


@cache  # a placement per call: the fit asks each case's many times
def visits(topology: str, engine: str | None, services: int) -> dict[str, int]:
    """How many times an allowed record visits each part, as placed."""
    return {part: round(sum(v.cpu_ms for v in record_path(topology, engine, services, Costs.one_of(part)))) for part in COST_PARTS}


@cache
def processes(topology: str, engine: str | None, services: int) -> dict[str, int]:
    """The deployment's processes of each CPU kind: its services, an Envoy per point, an OPA per
    deciding point. The baseline's engine, whatever a table calls it, is none (as in record_path)."""
    plan = place(manifest.load(topology, services=services, engine=None if topology == BASELINE else engine))
    return {"service": len(plan.services), "envoy": len(plan.points), "opa": sum(bool(point.deciding) for point in plan.points)}


def costs_under_load(cells: pd.DataFrame, bench: Costs) -> LoadCosts | None:
    """Each part's CPU per record, fitted on the cores each kind of part kept busy in the run's
    cells that are not saturated (stats.is_saturated; cpu.csv, by process): per kind, cores x 1000 = sum over its parts of
    achieved rate x visits x ms per visit, plus idle ms/s per process; non-negative least
    squares (scipy). What a part costs here, in a chain sharing the cores with Locust, is not
    what the bench measures one part at a time. None when the cells cannot tell a part's cost
    from its idle CPU: no CPU by kind (runs before 3116cf4), or fewer than two rates with a cell not saturated."""
    kinds = list(PARTS_OF_CPU_KIND)
    usable = cells[~cells["saturated"].astype(bool)]
    usable = usable.dropna(subset=[f"cpu_{kind}" for kind in kinds] + ["achieved_rate"])
    if usable["rate"].nunique() < 2:
        return None
    costs = asdict(bench)
    idle: dict[str, float] = {}
    unvisited: list[str] = []
    for kind, parts in PARTS_OF_CPU_KIND.items():
        rows, busy = [], []
        for cell in usable.itertuples():
            count = visits(cell.topology, cell.engine, int(cell.services))
            rows.append([cell.achieved_rate * count[part] for part in parts] + [processes(cell.topology, cell.engine, int(cell.services))[kind]])
            busy.append(1000 * getattr(cell, f"cpu_{kind}"))
        design = np.array(rows, dtype=float)
        fitted, _ = nnls(design, np.array(busy, dtype=float))
        for column, part in enumerate(parts):
            if design[:, column].any():
                costs[part] = float(fitted[column])
            else:
                unvisited.append(part)
        idle[kind] = float(fitted[-1])
    return LoadCosts(Costs(**costs), idle, len(usable), unvisited)


@dataclass(frozen=True)
class Visit:
    """One part a record passes, on `threads` threads of its process at most."""

    process: str
    kind: str  # service, envoy, opa, client
    node: str
    cpu_ms: float
    threads: int = 1


def record_path(topology: str, engine: str | None, services: int, costs: Costs) -> list[Visit]:
    """The parts an allowed record passes through a chain of `services`, in order, as placed.

    A decision through ext_authz is the point's Envoy then its OPA; the compiled engine decides
    later hops in Envoy alone, but the entry's listener is fed by clients and asks OPA under
    both engines (docs/architecture.md, Engines).
    """
    plan = place(manifest.load(topology, services=services, engine=None if topology == BASELINE else engine))
    deciding = {listener.sender: (point, listener) for point in plan.points for listener in point.deciding}
    forwarding = {(listener.upstream.address, listener.upstream.port): point for point in plan.points for listener in point.forwarding}

    def decision(point, listener) -> list[Visit]:
        envoy = f"{point.name}/envoy"
        if engine == COMPILED_ENGINE and not listener.from_client:
            return [Visit(envoy, "envoy", point.node, costs.compiled_envoy, point.concurrency)]
        opa = costs.entry_opa if listener.from_client else costs.decision_opa
        return [Visit(envoy, "envoy", point.node, costs.decision_envoy, point.concurrency),
                Visit(f"{point.name}/opa", "opa", point.node, opa, point.concurrency)]  # its GOMAXPROCS (deployment.py)

    path = decision(*deciding[GATEWAY_SENDER]) if GATEWAY_SENDER in deciding else []
    for process in sorted(plan.services, key=lambda s: s.instance.index):
        instance = process.instance
        proxy = forwarding.get((process.endpoint.address, process.endpoint.port))
        if proxy is not None:
            path.append(Visit(f"{proxy.name}/envoy", "envoy", proxy.node, costs.forwarding, proxy.concurrency))
        path.append(Visit(instance.id, "service", instance.node.name, costs.service))
        if instance.id in deciding:
            path += decision(*deciding[instance.id])
    return path


def on_one_node(path: list[Visit], client_cpu_ms: float = 0.0) -> list[Visit]:
    """The path on a single machine: every part on one node, after the load generator's share."""
    moved = [Visit(v.process, v.kind, ONE_NODE, v.cpu_ms, v.threads) for v in path]
    return ([Visit("locust", "client", ONE_NODE, client_cpu_ms)] if client_cpu_ms > 0 else []) + moved


def capacity(path: list[Visit], cores: dict[str, int], idle: dict[str, float] | None = None) -> tuple[float, str]:
    """The highest rate (records/s) the path's busiest process or node carries, and its name;
    `idle`: ms of CPU per second a node's processes spend whatever the rate, which its records cannot use."""
    process_demand: dict[str, float] = {}
    node_demand: dict[str, float] = {}
    threads: dict[str, int] = {}
    for v in path:
        process_demand[v.process] = process_demand.get(v.process, 0.0) + v.cpu_ms
        node_demand[v.node] = node_demand.get(v.node, 0.0) + v.cpu_ms
        threads[v.process] = min(v.threads, cores[v.node])
    limits = {name: 1000 * threads[name] / demand for name, demand in process_demand.items() if demand > 0}
    idle = idle or {}
    limits.update({f"node {name}": (1000 * cores[name] - idle.get(name, 0.0)) / demand for name, demand in node_demand.items() if demand > 0})
    bottleneck = min(limits, key=limits.get)
    return limits[bottleneck], bottleneck


@dataclass
class Prediction:
    offered_rate: float
    capacity: float  # records/s of the bottleneck alone
    bottleneck: str
    saturated: bool
    achieved_rate: float | None = None
    median: float | None = None  # ms; None when saturated
    mean: float | None = None
    p95: float | None = None
    mean_wait: float | None = None  # ms a record spent queued for threads and cores


def simulate(path: list[Visit], cores: dict[str, int], rate: float, *, arrivals: str = "poisson", user_rate: float = 10.0,
             delays: dict[str, float] | None = None, idle: dict[str, float] | None = None, service: str = "exponential", seconds: float = 10.0,
             warmup_share: float = 0.2, max_records: int = 4000, seed: int = 1) -> Prediction:
    """Records through `path` at `rate` per second; the first `warmup_share` of the time left out.

    arrivals: "poisson" or "constant" (open loops: a cell past its capacity is saturated and not
    simulated), or "closed" (Locust's loop: rate / user_rate users; saturated under 95% of the
    offered rate). service: "exponential" CPU times around each visit's mean, or "constant".
    idle: ms of CPU per second each node's processes spend whatever the rate: taken from its cores
    in slices of IDLE_SLICE_MS, as timers and polling do. The simulated time is `seconds`,
    shortened so that at most `max_records` are offered.
    """
    limit, bottleneck = capacity(path, cores, idle)
    prediction = Prediction(rate, limit, bottleneck, saturated=rate >= limit)
    if prediction.saturated and arrivals != "closed":
        return prediction
    delays = delays or {}
    rng = random.Random(seed)
    env = simpy.Environment()
    nodes = {name: simpy.Resource(env, count) for name, count in cores.items()}
    threads = {v.process: simpy.Resource(env, min(v.threads, cores[v.node])) for v in path}
    horizon = 1000 * min(seconds, max_records / rate)  # ms
    window_start = warmup_share * horizon
    finished: list[tuple[float, float, float]] = []  # (send time, rtt, wait), all in ms
    sent_in_window = 0

    def cpu_time(mean: float) -> float:
        return rng.expovariate(1 / mean) if service == "exponential" else mean

    def record():
        nonlocal sent_in_window
        sent = env.now
        sent_in_window += sent >= window_start
        waited = 0.0
        for v in path:
            asked = env.now
            with threads[v.process].request() as thread:
                yield thread
                with nodes[v.node].request() as core:
                    yield core
                    waited += env.now - asked
                    yield env.timeout(cpu_time(v.cpu_ms))
            if delays.get(v.kind):
                yield env.timeout(delays[v.kind])
        finished.append((sent, env.now - sent, waited))

    def open_loop():
        gap = 1000 / rate
        while env.now < horizon:
            env.process(record())
            yield env.timeout(rng.expovariate(1 / gap) if arrivals == "poisson" else gap)

    def user():
        period = 1000 / user_rate
        yield env.timeout(rng.uniform(0, period))
        while env.now < horizon:
            started = env.now
            yield env.process(record())
            yield env.timeout(max(0.0, period - (env.now - started)))

    def background(node: str, ms_per_s: float):
        gap = IDLE_SLICE_MS * 1000 / ms_per_s  # one slice of CPU every `gap` ms
        yield env.timeout(rng.uniform(0, gap))
        while True:
            with nodes[node].request() as core:
                yield core
                yield env.timeout(IDLE_SLICE_MS)
            yield env.timeout(max(0.0, gap - IDLE_SLICE_MS))

    for node, ms_per_s in (idle or {}).items():
        if ms_per_s > 0:
            env.process(background(node, ms_per_s))
    if arrivals == "closed":
        for _ in range(max(1, round(rate / user_rate))):
            env.process(user())
    else:
        env.process(open_loop())
    env.run(until=horizon)
    prediction.achieved_rate = sent_in_window / ((horizon - window_start) / 1000)
    if arrivals == "closed":  # an open loop's arrivals do not slow down: below capacity it keeps its rate
        prediction.saturated = prediction.saturated or prediction.achieved_rate < MIN_ACHIEVED_SHARE * rate
    measured = [(rtt, wait) for sent, rtt, wait in finished if sent >= window_start]
    if prediction.saturated or not measured:
        prediction.saturated = True
        return prediction
    rtts = sorted(rtt for rtt, _ in measured)
    prediction.median = statistics.median(rtts)
    prediction.mean = statistics.fmean(rtts)
    prediction.p95 = rtts[min(len(rtts) - 1, math.ceil(0.95 * len(rtts)) - 1)]
    prediction.mean_wait = statistics.fmean(wait for _, wait in measured)
    return prediction


# ---- a run: calibration, this machine, the paper's testbed ---------------------------

@dataclass(frozen=True)
class RunLoad:
    """How a run's load arrived, as `simulate` takes it: "constant" or "poisson" (an open loop),
    or "closed" (Locust users of `user_rate` req/s each)."""

    arrivals: str
    user_rate: float

    @classmethod
    def of(cls, parameters: dict) -> RunLoad:
        user_rate = float(parameters.get("user_rate", DEFAULT_USER_RATE))
        if parameters.get("load", LOAD_OF_OLDER_RUNS) == "open":
            return cls(parameters.get("arrivals", DEFAULT_ARRIVALS), user_rate)
        return cls("closed", user_rate)

    def describe(self) -> str:
        if self.arrivals == "closed":
            return (f"Locust's closed loop (users of {self.user_rate:g} req/s, constant-throughput waits); saturated as the runner "
                    "judges it (under 95% of the offered rate)")
        return f"the run's open loop ({self.arrivals} arrivals); saturated where the rate exceeds the capacity"


@dataclass(frozen=True)
class Calibration:
    """The fixed delays per kind of visit (ms), and the cells they were fitted on."""

    delays: dict[str, float]
    cells: list[str]
    client_cpu_ms: float  # Locust's CPU per request here
    load: RunLoad  # how the run's load arrived, which the model reproduces
    under_load: LoadCosts | None  # the parts' CPU fitted on the run's cells, which the model then uses; None: the bench's


def fit_delay(measured_median: float, simulate_with, count: int, fixed: dict[str, float], kind: str) -> float:
    """The delay per `kind` visit that brings the simulated median to the measured one: a fixed
    delay shifts a lightly loaded path's RTT almost rigidly, so two corrections suffice."""
    delay = 0.0
    for _ in range(2):
        simulated = simulate_with({**fixed, kind: delay}).median
        if simulated is None:
            raise ModelError(f"the calibration cell for {kind} visits is saturated in the model")
        delay = max(0.0, delay + (measured_median - simulated) / count)
    return delay


def load_measured(run_dir: Path) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    """(cells, Table I, metadata) of a run."""
    if not (run_dir / "metadata.json").exists():
        raise ModelError(f"no run at {run_dir} (no metadata.json)")
    meta = json.loads((run_dir / "metadata.json").read_text())
    cells, requests, _ = stats.load_run(run_dir)
    if cells.empty:
        raise ModelError(f"run {run_dir.name} has no finished cell")
    return cells, stats.pooled(cells, requests), meta


def calibrate(cells: pd.DataFrame, table: pd.DataFrame, costs: Costs, cores: int, load: RunLoad, seconds: float,
              under_load: LoadCosts | None = None) -> Calibration:
    """Locust's CPU per request, and the delays per service and per OPA visit fitted on the run's
    baseline and central entity (envoy-opa) at its lowest rate and chain length, where measured
    unsaturated; `costs` are the parts' CPU the model uses (under_load's, where fitted)."""
    client_cpu_ms = float((cells["cpu_locust"] * 1000 / cells["achieved_rate"]).median())
    lowest = table.sort_values(["rate", "services"]).iloc[0]
    rate, services = int(lowest["rate"]), int(lowest["services"])
    one_node = {ONE_NODE: cores}

    def reference(topology: str, engine: str):
        row = table[(table["topology"] == topology) & (table["engine"] == engine) & (table["rate"] == rate) & (table["services"] == services)]
        return None if row.empty or row.iloc[0]["saturated"] else row.iloc[0]

    delays: dict[str, float] = {}
    used = []
    for kind, topology, engine in (("service", BASELINE, stats.NO_ENGINE), ("opa", "central-entity", "envoy-opa")):
        row = reference(topology, engine)
        if row is None:
            continue  # without its calibration cell a kind's delay stays 0, and the output says so
        path = on_one_node(record_path(topology, engine, services, costs), client_cpu_ms)
        idle = idle_on_one_node(under_load, topology, engine, services)
        delays[kind] = fit_delay(float(row["median"]), lambda d: simulate(path, one_node, rate, arrivals=load.arrivals, user_rate=load.user_rate,
                                                                           delays=d, idle=idle, seconds=seconds),
                                 sum(v.kind == kind for v in path), delays, kind)
        used.append(f"{topology} ({engine}) r{rate} n{services}")
    return Calibration(delays, used, client_cpu_ms, load, under_load)


def this_machine(run_dir: Path, seconds: float = THIS_MACHINE_SECONDS) -> tuple[pd.DataFrame, Calibration, Costs]:
    """Per case of the run: measured and predicted median RTT, achieved rate, saturation; the
    model's error on the median where neither is saturated. The parts' CPU is what the run's
    cells measured (costs_under_load) where they tell it, else the bench's; the costs used are
    returned."""
    cells, table, meta = load_measured(run_dir)
    bench = Costs.from_bench(run_dir / "raw" / BENCH_CSV)
    parameters = meta["parameters"]
    cores = int(meta["machine"]["cores"])
    load = RunLoad.of(parameters)
    under_load = costs_under_load(cells, bench)
    costs = under_load.costs if under_load else bench
    calibration = calibrate(cells, table, costs, cores, load, seconds, under_load)
    spread = stats.repetition_spread(cells).set_index(stats.CASE)
    rows = []
    for case in table.itertuples():
        measured_saturated = bool(case.saturated)
        repeated = spread.loc[(case.topology, case.engine, case.rate, case.services)]
        path = on_one_node(record_path(case.topology, case.engine, int(case.services), costs), calibration.client_cpu_ms)
        predicted = simulate(path, {ONE_NODE: cores}, case.rate, arrivals=load.arrivals, user_rate=load.user_rate,
                             delays=calibration.delays, idle=idle_on_one_node(under_load, case.topology, case.engine, int(case.services)),
                             seconds=seconds)
        both_unsaturated = not measured_saturated and not predicted.saturated
        rows.append({
            "topology": case.topology, "engine": case.engine, "rate": case.rate, "services": case.services,
            "measured_median": case.median, "repetitions": int(repeated["repetitions"]), "measured_cv": repeated["cv"],
            "predicted_median": predicted.median,
            "error": (predicted.median / case.median - 1) if both_unsaturated else None,
            "measured_achieved": case.achieved_rate, "predicted_achieved": predicted.achieved_rate,
            "measured_saturated": measured_saturated, "predicted_saturated": predicted.saturated,
            "capacity": predicted.capacity, "bottleneck": predicted.bottleneck,
            "calibration": f"{case.topology} ({case.engine}) r{case.rate} n{case.services}" in calibration.cells,
        })
    return stats.order(pd.DataFrame(rows)), calibration, costs



def against_capacity_searches(capacity_runs: list[Path], costs: Costs, calibration: Calibration, cores: int) -> pd.DataFrame:
    """Per search of the capacity runs: the capacity it found (the highest rate held) beside the
    model's, the rate at which this machine's busiest process or node, idle CPU and Locust
    included, is fully used: an upper bound of what a search can hold, a p99 bound below it."""
    check_capacity_runs(capacity_runs)
    rows = []
    for run_dir in capacity_runs:
        meta = json.loads((run_dir / "metadata.json").read_text())
        searched = capacity_report.capacity_table(capacity_report.read_steps(run_dir), meta["parameters"]["gap"])
        for search in searched.itertuples():
            path = on_one_node(record_path(search.topology, search.engine, int(search.services), costs), calibration.client_cpu_ms)
            limit, bottleneck = capacity(path, {ONE_NODE: cores}, idle_on_one_node(calibration.under_load, search.topology, search.engine,
                                                                                   int(search.services)))
            found = None if pd.isna(search.capacity) or search.capped else int(search.capacity)
            rows.append({"run": run_dir.name, "topology": search.topology, "engine": search.engine, "services": int(search.services),
                         "searched": found, "predicted": limit, "bottleneck": bottleneck,
                         "error": limit / found - 1 if found else None})
    return stats.order(pd.DataFrame(rows), by=["services", "topology", "engine"])


def check_capacity_runs(capacity_runs: list[Path]) -> None:
    for run_dir in capacity_runs:
        if not (run_dir / "raw" / capacity_report.STEPS_CSV).exists():
            raise ModelError(f"{run_dir} is not a capacity run with steps (no raw/{capacity_report.STEPS_CSV})")


def capacity_view(table: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame({
        "case": names(table), "services": table["services"], "capacity run": table["run"],
        "searched (req/s)": table["searched"].map(lambda v: "–" if pd.isna(v) else f"{v:.0f}"),
        "predicted (req/s)": table["predicted"].map(lambda v: f"{v:.0f}"),
        "the model's bottleneck": table["bottleneck"],
        "error": table["error"].map(lambda v: "–" if pd.isna(v) else percent(v)),
    })


def capacity_summary(table: pd.DataFrame) -> str:
    compared = table[table["error"].notna()]
    within = compared[compared["error"].abs() <= TOLERANCE]
    others = [f"{engine_text(row)} n{row.services} {row.error:+.0%}" for row in compared.drop(within.index).itertuples()]
    return (f"{len(within)} of the {len(compared)} searches that found a capacity are within {TOLERANCE:.0%} of the model's"
            + (f"; the others: {', '.join(others)}" if others else ""))


def paper_testbed(costs: Costs, calibration: Calibration, cores: int = PAPER_CORES, rates=PAPER_RATES, services=PAPER_SERVICES,
                  max_records: int = 2000) -> pd.DataFrame:
    """Per topology, engine, rate and chain length: the prediction on the paper's nodes (the
    placement's gateway node and service nodes of `cores` each), Poisson arrivals, no load generator on
    them, this machine's per-part CPU and fitted delays."""
    rows = []
    for topology in TOPOLOGIES:
        for engine in ([stats.NO_ENGINE] if topology == BASELINE else ENGINES):
            for count in services:
                path = record_path(topology, engine, count, costs)
                nodes = {v.node: PAPER_GATEWAY_CORES if v.node == "gateway" else cores for v in path}
                for rate in rates:
                    predicted = simulate(path, nodes, rate, delays=calibration.delays, max_records=max_records)
                    rows.append({"topology": topology, "engine": engine, "rate": rate, "services": count,
                                 "median": predicted.median, "p95": predicted.p95, "saturated": predicted.saturated,
                                 "capacity": predicted.capacity, "bottleneck": predicted.bottleneck})
    return stats.order(pd.DataFrame(rows))


def predicted_w_avg(predictions: pd.DataFrame) -> pd.DataFrame:
    """W Avg per topology, engine and rate over the predicted medians (the paper's formula);
    none where a chain length of it is saturated."""
    grouped = predictions.assign(per_service=predictions["median"] / predictions["services"]).groupby(["topology", "engine", "rate"])
    result = grouped.agg(w_avg=("per_service", "mean"), saturated=("saturated", "any")).reset_index()
    result.loc[result["saturated"], "w_avg"] = float("nan")
    return stats.order(result)


# ---- the report section -----------------------------------------------------------------

TOLERANCE = 0.25  # the error on the median RTT of an unsaturated cell the model aims at


def validation_view(validation: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame({
        "case": names(validation), "rate": validation["rate"], "services": validation["services"],
        "median measured (ms)": [marked(ms(v), s) for v, s in zip(validation["measured_median"], validation["measured_saturated"])],
        "its repetitions' CV": [f"{percent(cv)} of {n}" if pd.notna(cv) else f"– ({n})" for cv, n in zip(validation["measured_cv"], validation["repetitions"])],
        "median predicted (ms)": [SATURATED_MARK if s else ms(v) for v, s in zip(validation["predicted_median"], validation["predicted_saturated"])],
        "error": [("calibrated " if c else "") + percent(e) if pd.notna(e) else "–" for e, c in zip(validation["error"], validation["calibration"])],
        "achieved measured (req/s)": validation["measured_achieved"].map(rate_text),
        "achieved predicted (req/s)": validation["predicted_achieved"].map(rate_text),
        "capacity predicted (req/s)": validation["capacity"].map(rate_text),
    })


def paper_view(w_avg: pd.DataFrame, predictions: pd.DataFrame, reference: dict) -> pd.DataFrame:
    """Per topology and rate: the paper's W Avg, ours predicted under each engine, or, where a
    chain length saturates, the first such length and the process that limits it."""
    rows = []
    for (topology, rate), group in w_avg.groupby(["topology", "rate"], sort=False):
        row = {"Arch.": arch(topology), "rate": rate,
               "paper W Avg (ms)": ms(reference["w_avg_ms"].get(PAPER_NAMES.get(topology, ""), {}).get(str(rate), float("nan")))}
        for engine_row in group.itertuples():
            label = "predicted W Avg (ms)" if engine_row.engine == stats.NO_ENGINE else f"predicted W Avg, {engine_row.engine} (ms)"
            if engine_row.saturated:
                cases = predictions[(predictions["topology"] == topology) & (predictions["engine"] == engine_row.engine)
                                    & (predictions["rate"] == rate) & predictions["saturated"]].sort_values("services")
                first = cases.iloc[0]
                row[label] = f"saturated from n={first['services']} ({first['bottleneck']}: {first['capacity']:.0f} req/s)"
            else:
                row[label] = ms(engine_row.w_avg)
        rows.append(row)
    return pd.DataFrame(rows).fillna("–")


def figure(validation: pd.DataFrame, predictions: pd.DataFrame, figures_dir: Path) -> Path:
    """Left: predicted against measured median RTT of the cells neither saturated, with the
    tolerance band. Right: predicted median RTT on the paper's testbed against chain length,
    per rate, envoy-opa solid and compiled dashed; saturated lengths left out."""

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 5))
    both = validation[validation["error"].notna()]
    for row in both.itertuples():
        left.scatter(row.measured_median, row.predicted_median, color=color(row.topology, row.engine), edgecolor="black",
                     marker="s" if row.calibration else "o", s=45, zorder=3)
        left.annotate(f"{arch(row.topology)} n{row.services}", (row.measured_median, row.predicted_median), fontsize=7,
                      xytext=(4, 2), textcoords="offset points")
    span = [min(both["measured_median"].min(), both["predicted_median"].min()) * 0.7,
            max(both["measured_median"].max(), both["predicted_median"].max()) * 1.3] if len(both) else [1, 100]
    left.plot(span, span, color="black", linewidth=0.8)
    left.fill_between(span, [v * (1 - TOLERANCE) for v in span], [v * (1 + TOLERANCE) for v in span], color="#999", alpha=0.2,
                      label=f"±{TOLERANCE:.0%}")
    left.set(xscale="log", yscale="log", xlabel="measured median RTT (ms)", ylabel="predicted median RTT (ms)",
             title="This machine: cells neither saturated\n(squares: the calibration cells)")
    left.legend(loc="upper left", fontsize=8)
    styles = {"envoy-opa": "-", "envoy-compiled": "--", stats.NO_ENGINE: ":"}
    markers = {100: "o", 500: "^", 1000: "s"}
    for (topology, engine, rate), group in predictions.groupby(["topology", "engine", "rate"], sort=False):
        shown = group[~group["saturated"]]
        if len(shown):
            right.plot(shown["services"], shown["median"], linestyle=styles[engine], marker=markers.get(rate, "o"),
                       color=color(topology, engine) if engine != COMPILED_ENGINE else COLORS[topology], alpha=0.9, markersize=4)
    right.set(xscale="log", yscale="log", xlabel="services in the chain", ylabel="predicted median RTT (ms)",
              title="The paper's testbed: cells not saturated\n(○ 100, △ 500, □ 1000 req/s)")
    right.set_xticks(PAPER_SERVICES, [str(n) for n in PAPER_SERVICES])
    handles = [Line2D([], [], color=COLORS[t], label=arch(t)) for t in TOPOLOGIES]
    handles += [Line2D([], [], color="black", linestyle=styles[e], label=e) for e in styles]
    right.legend(handles=handles, fontsize=7, loc="upper left")
    for ax in (left, right):
        ax.grid(alpha=0.3, which="both")
        for axis in (ax.xaxis, ax.yaxis):  # plain numbers, major ticks only: a log axis's minor labels overlap
            axis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
            axis.set_minor_formatter(NullFormatter())
    return save(fig, figures_dir, "model")


def summary(validation: pd.DataFrame) -> list[str]:
    """What the validation says, from its numbers."""
    predicted = validation[validation["error"].notna() & ~validation["calibration"]]
    within = predicted[predicted["error"].abs() <= TOLERANCE]
    lines = [f"{len(within)} of the {len(predicted)} cells neither measured nor predicted saturated (calibration cells apart) are "
             f"within {TOLERANCE:.0%} on the median RTT"
             + (f"; the others: " + ", ".join(f"{case_text(row)} {row.error:+.0%}" for row in predicted.drop(within.index).itertuples())
                if len(within) < len(predicted) else "")]
    lines.append(measurement_spread(predicted))
    agree = (validation["measured_saturated"] == validation["predicted_saturated"]).sum()
    lines.append(f"saturation: the model agrees with the measurement on {agree} of {len(validation)} cells"
                 + "".join(f"; {case_text(row)}: measured {'saturated' if row.measured_saturated else 'unsaturated'}, predicted "
                           f"{'saturated' if row.predicted_saturated else 'unsaturated'}"
                           for row in validation[validation["measured_saturated"] != validation["predicted_saturated"]].itertuples()))
    saturated = validation[validation["measured_saturated"] & validation["predicted_saturated"] & validation["predicted_achieved"].notna()]
    if len(saturated):  # an open loop's saturated cells are not simulated: no rate to compare
        ratio = (saturated["measured_achieved"] / saturated["predicted_achieved"]).median()
        lines.append(f"in the {len(saturated)} cells both saturated, the rate measured is {ratio:.2f}× the rate predicted (median)")
    return lines


def measurement_spread(compared: pd.DataFrame) -> str:
    """How far the compared cases' medians move between repetitions (separate deployments),
    which the model's error includes: its floor."""
    cv = compared["measured_cv"].dropna()
    if cv.empty:
        return ("one repetition per case: how far a case's median moves from one deployment to the next is not measured here, "
                "and the errors above include it (`run --run-id RUN --repetitions 2` adds a repetition)")
    return (f"the measurement's own spread: the medians of the compared cases' {compared['repetitions'].min()}"
            f"{'' if compared['repetitions'].nunique() == 1 else '+'} repetitions have a coefficient of variation of "
            f"{percent(cv.median())} (median; at most {percent(cv.max())}, {int((cv > MAX_REPETITION_CV).sum())} of "
            f"{len(cv)} above {MAX_REPETITION_CV:.0%}): the errors above include it")


def engine_text(row) -> str:
    """"CE (compiled)", "SA (envoy-opa)", "baseline"."""
    engine = "" if row.engine == stats.NO_ENGINE else f" ({'compiled' if row.engine == COMPILED_ENGINE else row.engine})"
    return f"{arch(row.topology)}{engine}"


def case_text(row) -> str:
    return f"{engine_text(row)} r{row.rate} n{row.services}"


def costs_view(used: Costs, bench: Costs, under_load: LoadCosts | None) -> pd.DataFrame:
    """Per part: the bench's CPU per record and, where the run's cells gave it, theirs; the model uses the latter."""
    view = pd.DataFrame({"part": list(COST_PARTS),
                         "bench row (process)": [BENCH_PROCESSES.get(part, f"{BENCH_PROCESSES['decision_opa']} (one decision)") for part in COST_PARTS],
                         "bench (ms CPU per record)": [f"{getattr(bench, part):.3f}" for part in COST_PARTS]})
    if under_load:
        view["under this run's load (ms CPU per record)"] = [
            "– (no cell visits it: the bench's)" if part in under_load.from_bench else f"{getattr(used, part):.3f}" for part in COST_PARTS]
    return view


def costs_source(under_load: LoadCosts | None) -> str:
    if under_load is None:
        return ("the model uses the bench's CPU per part: this run's cells cannot tell a part's CPU per record from its idle CPU "
                "(no CPU by kind of process, or fewer than two rates with a cell not saturated)")
    idle = ", ".join(f"{kind} {ms_per_s:.1f}" for kind, ms_per_s in under_load.idle_ms_per_s.items())
    return (f"the model uses the CPU per part under this run's load: the cores each kind of process kept busy in the "
            f"{under_load.cells} cells not saturated, fitted (non-negative least squares) as achieved rate × visits × ms per "
            f"visit, plus idle ms of CPU per second per process ({idle})")


def build_report(run_dir: Path, paper_cores: int = PAPER_CORES, seconds: float = THIS_MACHINE_SECONDS, paper_rates=PAPER_RATES,
                 paper_services=PAPER_SERVICES, capacity_runs: list[Path] = ()) -> dict:
    """The model's section of a run's report: report/model.md and model.html, its tables and
    figure; with capacity runs, their searches' capacities beside the model's."""
    check_capacity_runs(capacity_runs)  # before minutes of simulation
    validation, calibration, costs = this_machine(run_dir, seconds=seconds)
    predictions = paper_testbed(costs, calibration, cores=paper_cores, rates=paper_rates, services=paper_services)
    w_avg = predicted_w_avg(predictions)
    report_dir = run_dir / "report"
    (report_dir / "tables").mkdir(parents=True, exist_ok=True)
    (report_dir / "figures").mkdir(parents=True, exist_ok=True)
    validation.to_csv(report_dir / "tables" / "model_this_machine.csv", index=False)
    predictions.to_csv(report_dir / "tables" / "model_paper_testbed.csv", index=False)
    w_avg.to_csv(report_dir / "tables" / "model_w_avg.csv", index=False)
    plot = figure(validation, predictions, report_dir / "figures")
    delays = ", ".join(f"{kind} {delay:.2f} ms" for kind, delay in calibration.delays.items()) or "none (no calibration cell)"
    blocks = [
        ("h1", f"Model of the testbed: {run_dir.name}"),
        ("p", "The CPU each part costs per record (below) fed to a discrete-event simulation (simpy): a record "
              "visits the parts its topology's placement lays out, each holding a thread of its process (a service 1, an Envoy and "
              "its OPA (GOMAXPROCS) their point's concurrency) and a core of its node for an exponentially distributed CPU "
              "time around that figure, then a fixed delay per kind of part for what CPU does not hold (loopback, waking a "
              "process, the ext_authz round trip). `experiments/model.py` says how."),
        ("h2", "Costs and calibration"),
        ("table", costs_view(costs, Costs.from_bench(run_dir / "raw" / BENCH_CSV), calibration.under_load)),
        ("list", [costs_source(calibration.under_load),
                  f"delays fitted per visit: {delays}; on {', '.join(calibration.cells) or 'no cell'} (their errors are ~0 by construction)",
                  f"Locust's CPU per request here (median over the run's cells), a visit before the entry: {calibration.client_cpu_ms:.2f} ms",
                  f"this machine: every part on one node of the run's cores; {calibration.load.describe()}"]),
        ("h2", "This machine: predicted against measured"),
        ("table", validation_view(validation)),
        ("list", summary(validation)),
        ("figure", plot, "Left: predicted against measured median RTT of the cells neither saturated. Right: the paper's testbed."),
        *capacity_blocks(capacity_runs, costs, calibration, int(json.loads((run_dir / "metadata.json").read_text())["machine"]["cores"]),
                         report_dir / "tables"),
        ("h2", f"The paper's testbed: a gateway node of {PAPER_GATEWAY_CORES} and three service nodes of {paper_cores} hardware threads"),
        ("p", "Poisson arrivals (the paper's JMeter thread count is not published), no load generator on the nodes, this machine's CPU "
              "per part and fitted delays. A cell whose busiest process or node would need more than its capacity is saturated and "
              "has no RTT; a W Avg with any saturated chain length has none either. The paper's W Avg is that of its one engine, "
              "whose architecture is envoy-opa's."),
        ("table", paper_view(w_avg, predictions, load_paper_reference())),
        ("list", paper_reading(predictions, w_avg, load_paper_reference(), costs)),
    ]
    paths = {"markdown": report_dir / "model.md", "html": report_dir / "model.html"}
    paths["markdown"].write_text(render_markdown(blocks, report_dir))
    paths["html"].write_text(render_html(blocks, f"complyroute model {run_dir.name}"))
    return paths


def capacity_blocks(capacity_runs: list[Path], costs: Costs, calibration: Calibration, cores: int, tables_dir: Path) -> list[tuple]:
    if not capacity_runs:
        return []
    table = against_capacity_searches(capacity_runs, costs, calibration, cores)
    table.to_csv(tables_dir / "model_capacity.csv", index=False)
    return [
        ("h2", "This machine: capacity predicted against the capacity searches"),
        ("p", "A search's capacity is the highest rate it held (at least 95% sent, at most 1% errors, p99 within its bound); the "
              "model's is the rate at which the busiest process or the node (this run's CPU per part, its idle CPU and Locust's "
              "included) is fully used, an upper bound of what a search can hold. A search capped at its highest rate has no "
              "capacity to compare."),
        ("table", capacity_view(table)),
        ("list", [capacity_summary(table)]),
    ]


def paper_reading(predictions: pd.DataFrame, w_avg: pd.DataFrame, reference: dict, costs: Costs) -> list[str]:
    """Where the predictions on the paper's testbed part from its Table I, and why, from the numbers."""
    limits = predictions.groupby(["topology", "engine", "services"], sort=False).first().reset_index()
    lines = []
    for topology in ("central-entity", "sidecar", BASELINE):
        for engine in ([stats.NO_ENGINE] if topology == BASELINE else ("envoy-opa",)):
            rows = limits[(limits["topology"] == topology) & (limits["engine"] == engine)]
            lines.append(f"{arch(topology)}{'' if engine == stats.NO_ENGINE else f' ({engine})'}: capacity "
                         + ", ".join(f"n={row.services} {row.capacity:.0f} req/s ({row.bottleneck})" for row in rows.itertuples()))
    central = limits[(limits["topology"] == "central-entity") & (limits["engine"] == "envoy-opa")].sort_values("services").iloc[0]
    lines += [
        f"a Node service is one thread: at {costs.service:.2f} ms of CPU per service visit (this machine's, not scaled to the "
        f"paper's Xeons) a service carries at most {1000 / costs.service:.0f} req/s, so no chain carries 1000 req/s, whatever the "
        "topology, while the paper's sidecars still answered there (its W Avg 55 ms): what its services did per record is not "
        "published; ours check a label token, write a hash-chained audit line and run 100 work iterations each",
        f"our central entity and the entry are one point (2 Envoy threads, its OPA's GOMAXPROCS 2) deciding every hop of every "
        f"record: at 5 services its {central['bottleneck']} limits it to {central['capacity']:.0f} req/s, and it saturates first as "
        "the chain grows, as the paper's central entity did (a Node.js service of its own; its RTT grew to seconds at 25 and 50 "
        "services); dynamic routers (1 thread each) saturate at long chains too, sidecars only at their own parts",
    ]
    ours = w_avg[(w_avg["engine"] == "envoy-opa") & ~w_avg["saturated"]]
    both = [(row, reference["w_avg_ms"][PAPER_NAMES[row.topology]][str(row.rate)]) for row in ours.itertuples()
            if str(row.rate) in reference["w_avg_ms"].get(PAPER_NAMES[row.topology], {})]
    if both:
        lines.append("where both have a W Avg (envoy-opa): " + ", ".join(f"{arch(row.topology)} at {row.rate} req/s {row.w_avg:.1f} ms "
                                                                       f"against {paper:.1f} ({row.w_avg / paper:.2f}×)" for row, paper in both)
                     + "; elsewhere the paper's W Avg grows with the rate (CE to 728 ms, DR_3 to 242 ms at 1000 req/s) where ours "
                       "has a saturated chain length: a bottleneck in both (ours named above; the paper does not "
                       "break its own down), queueing without bound in our open loop, while the paper's closed JMeter loop keeps "
                       "its RTTs finite (Little's law)")
    return lines
