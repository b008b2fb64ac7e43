"""What a run's report opens with, computed from its data: which topology under which engine was
fastest at each rate and chain length (the median RTT with a 95% bootstrap interval; overlapping
intervals are ties; saturated cases named apart, never ranked), what enforcement costs under each
engine against the baseline, how far our order of the architectures agrees with the paper's
(Kendall's tau per rate), and the model's order on the paper's testbed beside ours.

Every number here is derived by the functions below from the run's tables (stats.py) and the
model (model_predict.py); the report only words them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats as scipy_stats

from experiments.analysis import bench_sum, stats
from experiments.analysis.model import ONE_NODE, Costs, capacity, costs_under_load, idle_on_one_node, on_one_node, record_path
from experiments.analysis.model_predict import THIS_MACHINE_SECONDS, RunLoad, calibrate, paper_testbed, predicted_w_avg
from experiments.design.matrix import BASELINE, BENCH_CSV, BENCH_DECISION_LOG, BENCH_OBSERVABILITY, ENGINES, PAPER_NAMES

CONFIDENCE = 0.95
RESAMPLES = 999
# Fixed, so that a report rebuilt from the same raw data is the same report (the sample report's test).
SEED = 20190708
# Resamples per batch: at most this many copies of a case's requests in memory at once.
BATCH = 50


# ---- the median and its interval ----------------------------------------------------------

def median_interval(repetitions: list[np.ndarray], seed: int = SEED) -> tuple[float, float, float]:
    """(median, low, high) of the repetitions' RTTs pooled, with a 95% percentile-bootstrap interval
    over the requests; with several repetitions, widened to cover the interval of a bootstrap over
    the repetitions too (each resample pools the repetitions it drew), since separate deployments
    differ more than requests within one."""
    pooled = np.concatenate(repetitions) if repetitions else np.array([])
    if len(pooled) == 0:
        return math.nan, math.nan, math.nan
    median = float(np.median(pooled))
    if len(pooled) < 2:
        return median, math.nan, math.nan
    rng = np.random.default_rng(seed)
    over_requests = scipy_stats.bootstrap((pooled,), np.median, confidence_level=CONFIDENCE, n_resamples=RESAMPLES,
                                          method="percentile", batch=BATCH, rng=rng).confidence_interval
    low, high = float(over_requests.low), float(over_requests.high)
    if len(repetitions) > 1:
        def pooled_median(drawn):
            return np.median(np.concatenate([repetitions[int(i)] for i in drawn]))
        over_repetitions = scipy_stats.bootstrap((np.arange(len(repetitions)),), pooled_median, vectorized=False,
                                                 confidence_level=CONFIDENCE, n_resamples=RESAMPLES, method="percentile",
                                                 rng=rng).confidence_interval
        low, high = min(low, float(over_repetitions.low)), max(high, float(over_repetitions.high))
    return median, low, high


def intervals(table: pd.DataFrame, requests: pd.DataFrame) -> pd.DataFrame:
    """Per case of Table I: its pooled median RTT, the interval, and what says whether it held
    (saturated, achieved and offered rate, p99)."""
    timed = stats.delivered(requests)
    by_case = {key: [group["rtt_ms"].to_numpy() for _, group in rows.groupby("repetition")]
               for key, rows in timed.groupby(stats.CASE, observed=True)}
    rows = []
    for case in table.itertuples():
        key = (case.topology, case.engine, case.rate, case.services)
        median, low, high = median_interval(by_case.get(key, []))
        rows.append({"topology": case.topology, "engine": case.engine, "rate": case.rate, "services": case.services,
                     "median": median, "low": low, "high": high, "repetitions": case.repetitions, "saturated": bool(case.saturated),
                     "achieved_rate": case.achieved_rate, "offered_rate": case.offered_rate, "p99": case.p99, "error_rate": case.error_rate})
    return stats.order(pd.DataFrame(rows), by=stats.CASE)


# ---- the ranking ------------------------------------------------------------------------

def ranking(cases: pd.DataFrame) -> pd.DataFrame:
    """Per rate and chain length, the enforcing cases that held, fastest first: rank 1 + the number
    whose whole interval lies below this one's (so overlapping intervals share a rank: a tie), and
    the cases it overlaps. Saturated cases get no rank."""
    enforcing = cases[cases["topology"] != BASELINE]
    frames = []
    for _, group in enforcing.groupby(["rate", "services"], sort=True):
        held = group[~group["saturated"]].sort_values("median")
        ranked = held.assign(
            rank=[1 + int((held["high"] < row.low).sum()) for row in held.itertuples()],
            tied_with=[[(other.topology, other.engine) for other in held.itertuples()
                        if other.Index != row.Index and other.low <= row.high and row.low <= other.high] for row in held.itertuples()],
        )
        frames.append(pd.concat([ranked, group[group["saturated"]].assign(rank=pd.NA, tied_with=[[] for _ in range(int(group["saturated"].sum()))])]))
    if not frames:
        return enforcing.assign(rank=pd.Series(dtype="Int64"), tied_with=pd.Series(dtype=object))
    result = pd.concat(frames, ignore_index=True)
    result["rank"] = result["rank"].astype("Int64")
    return result


# ---- the price of enforcement --------------------------------------------------------------

@dataclass(frozen=True)
class Price:
    engine: str
    cases: int  # cases with a baseline at the same rate and chain length
    ratio_median: float  # CPU per record / the baseline's, median over the cases
    ratio_low: float
    ratio_high: float
    lowest: tuple  # (topology, rate, services) of the lowest ratio
    highest: tuple
    extra_ms_median: float  # CPU per record beyond the baseline's, median over the cases
    per_hop_ms_median: float
    capacity_share: tuple[float, float] | None  # (lowest, highest) share of the baseline's searched capacity, where searched
    capacity_at: tuple[tuple, tuple] | None = None  # (topology, services) of the lowest and the highest share
    baseline_capped: bool = False  # a baseline's search held every step: its capacity is a floor, the shares at most
    held_nothing: tuple = ()  # (topology, services) of the searches that held no step: below any share


@dataclass(frozen=True)
class EvidenceCost:
    what: str  # the row's part: the deciding hop it is of, or the entry's decision
    ratio: float  # CPU with the evidence / the same process's without it
    target: float | None


def evidence_costs(bench_csv: Path) -> list[EvidenceCost]:
    """What the run's bench measured of the evidence a deployment keeps, each against the same
    process without it: a deciding hop's access log and hop counters (per engine), the entry's
    decision log. None for a run without a bench, or with a bench from before those rows."""
    if not bench_csv.exists():
        return []
    bench = bench_sum.read(bench_csv)
    rows = bench[(bench["part"].str.startswith(f"{BENCH_OBSERVABILITY} (") | (bench["part"] == BENCH_DECISION_LOG))
                 & bench["ratio"].notna()]
    return [EvidenceCost(row.part, float(row.ratio), None if pd.isna(row.target) else float(row.target)) for row in rows.itertuples()]


def price(cpu: pd.DataFrame, capacity: pd.DataFrame | None = None) -> list[Price]:
    """Per engine, the deployment's CPU per record against the baseline's at the same rate and chain
    length (stats.cpu_per_record), and, from capacity searches (capacity_report.capacity_table)
    where given, the share of the baseline's capacity."""
    prices = []
    for engine in ENGINES:
        rows = cpu[(cpu["engine"] == engine) & cpu["baseline_total_ms"].notna()]
        if rows.empty:
            continue
        ratio = rows["total_ms"] / rows["baseline_total_ms"]
        low_at, high_at = rows.loc[ratio.idxmin()], rows.loc[ratio.idxmax()]
        share, share_at, baseline_capped, held_nothing = None, None, False, ()
        if capacity is not None and not capacity.empty:
            of_engine = capacity[capacity["engine"] == engine]
            held_nothing = tuple((row.topology, int(row.services)) for row in of_engine[of_engine["capacity"].isna()].itertuples())
            searched = capacity[(capacity["engine"] == engine) & capacity["share_of_baseline"].notna()]
            if len(searched):
                shares = searched["share_of_baseline"].astype(float)
                share = (float(shares.min()), float(shares.max()))
                share_at = tuple((searched.loc[at, "topology"], int(searched.loc[at, "services"])) for at in (shares.idxmin(), shares.idxmax()))
                if "capped" in capacity:
                    baselines = capacity[(capacity["topology"] == BASELINE) & capacity["services"].isin(searched["services"])]
                    baseline_capped = bool(baselines["capped"].any())
        prices.append(Price(engine, len(rows), float(ratio.median()), float(ratio.min()), float(ratio.max()),
                            (low_at["topology"], int(low_at["rate"]), int(low_at["services"])),
                            (high_at["topology"], int(high_at["rate"]), int(high_at["services"])),
                            float((rows["total_ms"] - rows["baseline_total_ms"]).median()),
                            float(rows["enforcement_per_hop_ms"].median()), share, share_at, baseline_capped, held_nothing))
    return prices


# ---- against the paper's order -------------------------------------------------------------

def order_values(w_avg: pd.Series, saturated: pd.Series) -> np.ndarray:
    """W Avg as ranked: a topology with a saturated chain length carried less than it was offered,
    so it ranks below every one that held, tied with the other saturated ones."""
    return np.where(saturated.to_numpy(dtype=bool), np.inf, w_avg.to_numpy(dtype=float))


def agreement(w_avg: pd.DataFrame, reference: dict) -> pd.DataFrame:
    """Per engine and rate, Kendall's tau-b between our order of the architectures by W Avg and the
    paper's (its published W Avg at that rate), over the architectures both have; NaN with fewer
    than two, or where either side ties them all."""
    rows = []
    for (engine, rate), group in w_avg[w_avg["topology"] != BASELINE].groupby(["engine", "rate"], sort=False):
        papers = [reference["w_avg_ms"].get(PAPER_NAMES[t], {}).get(str(rate)) for t in group["topology"]]
        both = group.assign(paper=papers).dropna(subset=["paper"])
        if both.empty:
            continue
        ours = order_values(both["w_avg"], both["any_saturated"])
        tau = (scipy_stats.kendalltau(ours, both["paper"].to_numpy()).statistic
               if len(both) >= 2 and len(set(ours)) > 1 else math.nan)
        rows.append({"engine": engine, "rate": rate, "architectures": len(both), "tau": tau,
                     "ours": order_text(both["topology"], ours), "paper": order_text(both["topology"], both["paper"].to_numpy()),
                     "saturated": [t for t, s in zip(both["topology"], both["any_saturated"]) if s]})
    frame = pd.DataFrame(rows, columns=["engine", "rate", "architectures", "tau", "ours", "paper", "saturated"])
    if frame.empty:
        return frame
    rank = {name: position for position, name in enumerate([*ENGINES, stats.NO_ENGINE])}
    return frame.sort_values(["rate", "engine"], key=lambda c: c.map(rank) if c.name == "engine" else c).reset_index(drop=True)


def order_text(topologies, values) -> list[str]:
    """The topologies that held, fastest first (ties keep the experiments' order); a saturated one
    (an infinite value) has no place in it: saturated() names them."""
    return [t for value, t in sorted(zip(values, topologies), key=lambda pair: pair[0]) if np.isfinite(value)]


def saturated(topologies, values) -> list[str]:
    return [t for t, value in zip(topologies, values) if not np.isfinite(value)]


# ---- the model's order on the paper's testbed ----------------------------------------------

@dataclass(frozen=True)
class ModelOrder:
    """At one rate, per engine: the architectures fastest first as measured here, as the model predicts
    them on the paper's testbed (same chain lengths, this run's CPU per part), and as the paper
    published them; Kendall's tau of the model's against each; the reason, in one line."""

    engine: str
    rate: int
    ours: list[str]  # held, fastest first
    ours_saturated: list[str]
    model: list[str]
    model_saturated: list[str]
    paper: list[str]
    tau_model_ours: float
    tau_model_paper: float
    reason: str


def model_orders(run_dir, cells: pd.DataFrame, table: pd.DataFrame, meta: dict, reference: dict) -> list[ModelOrder]:
    """The model (model_predict.py) calibrated on the run, predicting W Avg on the paper's testbed at
    the run's rates and chain lengths; raises ModelError when the run lacks what it needs (its bench)."""
    parameters = meta["parameters"]
    cores = int(meta["machine"]["cores"])
    bench = Costs.from_bench(run_dir / "raw" / BENCH_CSV)
    under_load = costs_under_load(cells, bench)
    costs = under_load.costs if under_load else bench
    calibration = calibrate(cells, table, costs, cores, RunLoad.of(parameters), THIS_MACHINE_SECONDS, under_load)
    rates = sorted(int(r) for r in table["rate"].unique())
    services = sorted(int(n) for n in table["services"].unique())
    predictions = paper_testbed(costs, calibration, rates=rates, services=services)
    predicted = predicted_w_avg(predictions)
    ours = stats.w_avg(table)
    longest = max(services)

    def load_here(topology: str, engine: str, rate: int) -> tuple[float, str]:
        """The share of its capacity the busiest process or the node is at here, at the longest chain."""
        path = on_one_node(record_path(topology, engine, longest, costs), calibration.client_cpu_ms)
        limit, bottleneck = capacity(path, {ONE_NODE: cores}, idle_on_one_node(under_load, topology, engine, longest))
        return rate / limit, bottleneck

    def load_there(topology: str, engine: str, rate: int) -> tuple[float, str]:
        row = predictions[(predictions["topology"] == topology) & (predictions["engine"] == engine) & (predictions["rate"] == rate)
                          & (predictions["services"] == longest)].iloc[0]
        return rate / row["capacity"], row["bottleneck"]

    orders = []
    for engine in [e for e in ENGINES if e in set(table["engine"])]:
        for rate in rates:
            here = ours[(ours["engine"] == engine) & (ours["rate"] == rate)]
            there = predicted[(predicted["engine"] == engine) & (predicted["rate"] == rate)].set_index("topology").loc[here["topology"]]
            papers = np.array([reference["w_avg_ms"].get(PAPER_NAMES[t], {}).get(str(rate), math.nan) for t in here["topology"]], dtype=float)
            our_values = order_values(here["w_avg"], here["any_saturated"])
            model_values = order_values(there["w_avg"].fillna(0), there["saturated"])
            topologies = list(here["topology"])
            known = ~np.isnan(papers)
            tau_ours = kendall(model_values, our_values)
            tau_paper = kendall(model_values[known], papers[known])
            loads = {t: (load_here(t, engine, rate), load_there(t, engine, rate)) for t in topologies}
            orders.append(ModelOrder(engine, rate, order_text(topologies, our_values), saturated(topologies, our_values),
                                     order_text(topologies, model_values), saturated(topologies, model_values), order_text([t for t, k in zip(topologies, known) if k], papers[known]), tau_ours, tau_paper,
                                     reason(tau_ours, tau_paper, loads, cores, longest)))
    return orders


def kendall(first: np.ndarray, second: np.ndarray) -> float:
    if len(first) < 2 or len(set(first)) < 2 or len(set(second)) < 2:
        return math.nan
    return float(scipy_stats.kendalltau(first, second).statistic)


def part_text(bottleneck: str, cores: int) -> str:
    """The model's bottleneck as a reader names it: a process, or a node's cores ("node machine": this machine's)."""
    if bottleneck == f"node {ONE_NODE}":
        return f"this machine's {cores} cores"
    return f"the {bottleneck.removeprefix('node ')} node's cores" if bottleneck.startswith("node ") else bottleneck


def reason(tau_ours: float, tau_paper: float, loads: dict, cores: int, longest: int) -> str:
    """Why the model's order on the paper's testbed is or is not ours, from its numbers: the most
    loaded topology here and there (the share of its bottleneck's capacity at this rate)."""
    here = max(loads, key=lambda t: loads[t][0][0])
    (share_here, bottleneck_here), (share_there, bottleneck_there) = loads[here]
    load = (f"the most loaded here, {PAPER_NAMES.get(here, here)} at {longest} services, uses {share_here:.0%} of what "
            f"{part_text(bottleneck_here, cores)} can carry (every process shares {cores} cores), on the paper's nodes {share_there:.0%} "
            f"of {part_text(bottleneck_there, cores)}")
    with_ours = "" if math.isnan(tau_ours) else f", τ {tau_ours:+.2f} with ours"
    if math.isnan(tau_paper):
        if not math.isnan(tau_ours):
            return f"the paper has no order here to compare; τ between the model's order and ours {tau_ours:+.2f}; {load}"
        return f"too few architectures ranked to compare the orders; {load}"
    if tau_paper <= 0:
        return (f"our parts' costs, not the machine: even on the paper's nodes the model orders the architectures unlike the paper "
                f"(τ {tau_paper:+.2f} with the paper's{with_ours}); {load}")
    if math.isnan(tau_ours) or tau_paper > tau_ours:
        return f"the machine: on the paper's nodes the model's order comes near the paper's (τ {tau_paper:+.2f}{with_ours}); {load}"
    return f"both agree in part: τ {tau_paper:+.2f} with the paper's{with_ours}; {load}"
