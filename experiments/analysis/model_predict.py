"""The model (model.py) put to a run: calibrated on the run's cells, then predicting each of its
cases on this machine and every case on the paper's testbed.

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
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from experiments.analysis import stats
from experiments.analysis.model import ONE_NODE, Costs, LoadCosts, ModelError, costs_under_load, idle_on_one_node, on_one_node, record_path, simulate
from experiments.design.matrix import BASELINE, BENCH_CSV, DEFAULT_ARRIVALS, DEFAULT_USER_RATE, ENGINES, LOAD_OF_OLDER_RUNS, TOPOLOGIES


PAPER_GATEWAY_CORES = 56  # the paper's gateway node (section IV.c)

PAPER_CORES = 48  # its service nodes: 48 to 56 hardware threads, which ones had which unpublished; the smaller

PAPER_RATES = (100, 500, 1000)

PAPER_SERVICES = (5, 10, 25, 50)

# Simulated seconds per cell of this machine: at 8 the model's own noise moved a cell's error by
# 2 points from one seed to the next (20261126-below-capacity-p800: DR_3 envoy-opa r20 n10 -24%
# to -25%); at 30 the mean error was the same (0.076) for seeds 1-3.
THIS_MACHINE_SECONDS = 30.0


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
