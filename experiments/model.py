"""A model of the testbed: `make bench`'s CPU costs per part, fed to a discrete-event simulation
(simpy) of the nodes, cores and processes a record passes through.

A record's path is taken from the topology's own placement (complyroute.plan.place): the entry,
every service of the chain in turn, the sidecar ingress before a service, the point deciding the
hop out of it. Each part it passes is a *visit*: a process (a Node service, a point's Envoy or its
OPA, the load generator) on a node, holding one of the process's threads and one of the node's
cores for its CPU cost, drawn from an exponential distribution around the bench's mean (or that
mean exactly). A Node service has one thread, an Envoy its point's concurrency, an OPA (Go) as
many as its node has cores. Queues are FIFO. After its CPU a visit adds a fixed delay, per kind
of part, for what the bench's CPU figures do not hold (loopback transfer, waking a process,
the ext_authz round trip): fitted on two cells of the run (below), zero for Envoy and the client.

Two machines:
- this one: every part on one node of the run's cores, with the load generator (Locust) on it
  too, its CPU per request taken from the run's cells; a closed loop as Locust runs it (users of
  `user_rate` each, a constant-throughput wait, random phases), so a saturated cell settles at
  the rate it carries, judged by the runner's criterion (under 95% of the offered rate);
- the paper's testbed: the placement's gateway node and three service nodes, each of
  PAPER_CORES hardware threads, load from other machines, Poisson arrivals (an open loop: JMeter's
  thread count is not published). A cell whose busiest process or node would need more than its
  capacity is saturated and gets no RTT.

Calibration: the delay of a service visit is fitted on the run's baseline cell at its lowest rate
and chain length, the delay of an OPA visit on the central entity (envoy-opa) cell of the same
rate and length. Both cells are named in the output; every other cell is a prediction.
"""

from __future__ import annotations

import json
import math
import random
import statistics
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import simpy

from complyroute import manifest
from complyroute.plan import GATEWAY_SENDER, place

from . import stats
from .matrix import BASELINE, COMPILED_ENGINE, ENGINES, MIN_ACHIEVED_SHARE, TOPOLOGIES

PAPER_CORES = 48  # the smallest of the paper's nodes (48-56 hardware threads)
PAPER_RATES = (100, 500, 1000)
PAPER_SERVICES = (5, 10, 25, 50)
ONE_NODE = "machine"
# bench.csv rows (by their process; CPU rows only) each part of a path costs. The plain-HTTP
# rows: every bench since be16c7d has them, and deployments before ceffbcb spoke plain HTTP.
BENCH_PROCESSES = {
    "service": "service-work",  # a service with the manifests' default work
    "forwarding": "forwarding/envoy",  # a sidecar's ingress, the baseline's entry
    "decision_envoy": "envoy-opa/envoy",
    "decision_opa": "envoy-opa/opa",
    "compiled_envoy": "envoy-compiled/envoy",
}
CPU_UNIT = "ms CPU/request"


class ModelError(Exception):
    """The run lacks what the model needs (its bench, its cells)."""


@dataclass(frozen=True)
class Costs:
    """ms of CPU per record of each part, from a run's raw/bench.csv."""

    service: float
    forwarding: float
    decision_envoy: float
    decision_opa: float
    compiled_envoy: float

    @classmethod
    def from_bench(cls, path: Path) -> "Costs":
        if not path.exists():
            raise ModelError(f"no bench at {path}: the model needs a run measured with its bench (--bench-rounds > 0)")
        bench = pd.read_csv(path)
        cpu = bench[bench["unit"] == CPU_UNIT].set_index("process")["value"]
        missing = [process for process in BENCH_PROCESSES.values() if process not in cpu.index]
        if missing:
            raise ModelError(f"{path} has no row for {', '.join(missing)}")
        return cls(**{name: float(cpu[process]) for name, process in BENCH_PROCESSES.items()})


@dataclass(frozen=True)
class Visit:
    """One part a record passes: `threads` None means as many as its node has cores."""

    process: str
    kind: str  # service, envoy, opa, client
    node: str
    cpu_ms: float
    threads: int | None = 1


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
        return [Visit(envoy, "envoy", point.node, costs.decision_envoy, point.concurrency),
                Visit(f"{point.name}/opa", "opa", point.node, costs.decision_opa, None)]

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


def capacity(path: list[Visit], cores: dict[str, int]) -> tuple[float, str]:
    """The highest rate (records/s) the path's busiest process or node carries, and its name."""
    process_demand: dict[str, float] = {}
    node_demand: dict[str, float] = {}
    threads: dict[str, int] = {}
    for v in path:
        process_demand[v.process] = process_demand.get(v.process, 0.0) + v.cpu_ms
        node_demand[v.node] = node_demand.get(v.node, 0.0) + v.cpu_ms
        threads[v.process] = min(v.threads or cores[v.node], cores[v.node])
    limits = {name: 1000 * threads[name] / demand for name, demand in process_demand.items() if demand > 0}
    limits.update({f"node {name}": 1000 * cores[name] / demand for name, demand in node_demand.items() if demand > 0})
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
    rtts: list[float] = field(default_factory=list, repr=False)


def simulate(path: list[Visit], cores: dict[str, int], rate: float, *, arrivals: str = "poisson", user_rate: float = 10.0,
             delays: dict[str, float] | None = None, service: str = "exponential", seconds: float = 10.0,
             warmup_share: float = 0.2, max_records: int = 4000, seed: int = 1) -> Prediction:
    """Records through `path` at `rate` per second; the first `warmup_share` of the time left out.

    arrivals: "poisson" or "constant" (open loops: a cell past its capacity is saturated and not
    simulated), or "closed" (Locust's loop: rate / user_rate users; saturated under 95% of the
    offered rate). service: "exponential" CPU times around each visit's mean, or "constant".
    The simulated time is `seconds`, shortened so that at most `max_records` are offered.
    """
    limit, bottleneck = capacity(path, cores)
    prediction = Prediction(rate, limit, bottleneck, saturated=rate >= limit)
    if prediction.saturated and arrivals != "closed":
        return prediction
    delays = delays or {}
    rng = random.Random(seed)
    env = simpy.Environment()
    nodes = {name: simpy.Resource(env, count) for name, count in cores.items()}
    threads = {v.process: simpy.Resource(env, min(v.threads or cores[v.node], cores[v.node])) for v in path}
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

    if arrivals == "closed":
        for _ in range(max(1, round(rate / user_rate))):
            env.process(user())
    else:
        env.process(open_loop())
    env.run(until=horizon)
    prediction.achieved_rate = sent_in_window / ((horizon - window_start) / 1000)
    prediction.saturated = prediction.saturated or prediction.achieved_rate < MIN_ACHIEVED_SHARE * rate
    measured = [(rtt, wait) for sent, rtt, wait in finished if sent >= window_start]
    if prediction.saturated or not measured:
        prediction.saturated = True
        return prediction
    rtts = sorted(rtt for rtt, _ in measured)
    prediction.rtts = rtts
    prediction.median = statistics.median(rtts)
    prediction.mean = statistics.fmean(rtts)
    prediction.p95 = rtts[min(len(rtts) - 1, math.ceil(0.95 * len(rtts)) - 1)]
    prediction.mean_wait = statistics.fmean(wait for _, wait in measured)
    return prediction


# ---- a run: calibration, this machine, the paper's testbed ---------------------------

@dataclass(frozen=True)
class Calibration:
    """The fixed delays per kind of visit (ms), and the cells they were fitted on."""

    delays: dict[str, float]
    cells: list[str]
    client_cpu_ms: float  # Locust's CPU per request here


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


def calibrate(cells: pd.DataFrame, table: pd.DataFrame, costs: Costs, cores: int, user_rate: float, seconds: float) -> Calibration:
    client_cpu_ms = float((cells["cpu_locust"] * 1000 / cells["achieved_rate"]).median())
    lowest = table.sort_values(["rate", "services"]).iloc[0]
    rate, services = int(lowest["rate"]), int(lowest["services"])
    one_node = {ONE_NODE: cores}

    def reference(topology: str, engine: str):
        row = table[(table["topology"] == topology) & (table["engine"] == engine) & (table["rate"] == rate) & (table["services"] == services)]
        return None if row.empty or bool(row["saturated"].iloc[0]) else row.iloc[0]

    delays: dict[str, float] = {}
    used = []
    for kind, topology, engine in (("service", BASELINE, stats.NO_ENGINE), ("opa", "central-entity", "envoy-opa")):
        row = reference(topology, engine)
        if row is None:
            continue  # without its calibration cell a kind's delay stays 0, and the output says so
        path = on_one_node(record_path(topology, None if engine == stats.NO_ENGINE else engine, services, costs), client_cpu_ms)
        delays[kind] = fit_delay(float(row["median"]), lambda d: simulate(path, one_node, rate, arrivals="closed", user_rate=user_rate,
                                                                           delays=d, seconds=seconds),
                                 sum(v.kind == kind for v in path), delays, kind)
        used.append(f"{topology} ({engine}) r{rate} n{services}")
    return Calibration(delays, used, client_cpu_ms)


def this_machine(run_dir: Path, seconds: float = 8.0) -> tuple[pd.DataFrame, Calibration, Costs]:
    """Per case of the run: measured and predicted median RTT, achieved rate, saturation; the
    model's error on the median where neither is saturated."""
    cells, table, meta = load_measured(run_dir)
    costs = Costs.from_bench(run_dir / "raw" / "bench.csv")
    parameters = meta["parameters"]
    cores = int(meta["machine"]["cores"])
    calibration = calibrate(cells, table, costs, cores, parameters["user_rate"], seconds)
    rows = []
    for case in table.itertuples():
        engine = None if case.topology == BASELINE else case.engine
        path = on_one_node(record_path(case.topology, engine, int(case.services), costs), calibration.client_cpu_ms)
        predicted = simulate(path, {ONE_NODE: cores}, case.rate, arrivals="closed", user_rate=parameters["user_rate"],
                             delays=calibration.delays, seconds=seconds)
        both_unsaturated = not case.saturated and not predicted.saturated
        rows.append({
            "topology": case.topology, "engine": case.engine, "rate": case.rate, "services": case.services,
            "measured_median": case.median, "predicted_median": predicted.median if not predicted.saturated else None,
            "error": (predicted.median / case.median - 1) if both_unsaturated else None,
            "measured_achieved": case.achieved_rate, "predicted_achieved": predicted.achieved_rate,
            "measured_saturated": bool(case.saturated), "predicted_saturated": predicted.saturated,
            "capacity": predicted.capacity, "bottleneck": predicted.bottleneck,
            "calibration": f"{case.topology} ({case.engine}) r{case.rate} n{case.services}" in calibration.cells,
        })
    return stats.order(pd.DataFrame(rows)), calibration, costs

