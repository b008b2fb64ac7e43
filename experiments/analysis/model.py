"""A model of the testbed: the CPU each part costs per record, fed to a discrete-event simulation
(simpy) of the nodes, cores and processes a record passes through. The CPU per part is what the
run's own cells measured under load (costs_under_load), or, for a run whose cells cannot tell it,
what `make bench` measured one part at a time.

A record's path is taken from the topology's own placement (complyroute.topology.plan.place): the entry,
every service of the chain in turn, the sidecar ingress before a service, the point deciding the
hop out of it. Each part it passes is a *visit*: a process (a Node service, a point's Envoy or its
OPA, the load generator) on a node, holding one of the process's threads and one of the node's
cores for its CPU cost, drawn from an exponential distribution around its mean (or that
mean exactly). A Node service has one thread, an Envoy its point's concurrency, and an OPA one
(every point's GOMAXPROCS, complyroute/policy/policyfiles.py). Queues are FIFO. A node's processes also spend CPU whatever the rate
(timers, health checks, polling: the idle CPU the fit on the cells finds), which records wait
behind. After its CPU a visit adds a fixed delay, per kind
of part, for what CPU figures do not hold (loopback transfer, waking a process,
the ext_authz round trip): fitted on two cells of the run (below), zero for Envoy and the client.

model_predict.py puts it to a run (calibrated on its cells; this machine and the paper's testbed),
report/model_report.py writes its section of the report.
"""

from __future__ import annotations

import math
import random
import statistics
from dataclasses import asdict, dataclass
from functools import cache
from pathlib import Path

import numpy as np
import pandas as pd
import simpy
from scipy.optimize import nnls

from complyroute.policy import policyfiles
from complyroute.topology import manifest
from complyroute.topology.plan import GATEWAY_SENDER, place

from experiments.analysis import bench_sum
from experiments.design.matrix import BASELINE, COMPILED_ENGINE, MIN_ACHIEVED_SHARE


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
        bench = bench_sum.read(path)
        cpu = bench[bench["unit"] == CPU_UNIT].set_index("process")["value"]
        # A process's first CPU row is its part's own; later rows of the same process compare it
        # with something toggled in that one process (its access log and hop counters off).
        cpu = cpu[~cpu.index.duplicated(keep="first")]
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
                Visit(f"{point.name}/opa", "opa", point.node, opa, policyfiles.OPA_THREADS)]  # its GOMAXPROCS

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
