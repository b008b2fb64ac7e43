"""`python -m experiments compare RUN_A RUN_B`: what changed from run A (before) to run B (after).

Per case both runs measured (topology, engine, rate, services; repetitions pooled, as in Table I):
the change in median RTT and in p95 of the delivered records, in CPU per record and in the rate
carried, each B − A with a 95% bootstrap confidence interval (scipy.stats.bootstrap, percentile
method, each run's samples resampled on their own):
- RTT: the delivered records' RTTs in the measured window;
- CPU per record: one sample per second of the window, the deployment's CPU that second (cpu.csv)
  divided by the records sent in it; the change is that of the mean;
- the rate carried: the records sent per second of the window; where a case is saturated in
  both runs it is its capacity, and the table says so.
A change whose interval excludes 0 is reported as a shift. Then the cost of enforcement per hop
before and after, per enforcing case whose baseline (same rate and services) both runs measured:
(the case's median RTT − the baseline's) / hops, and the same of the mean CPU per record, as
stats.enforcement_cost and stats.cpu_per_record define them, with the interval of their change
(the four samples resampled each on its own). Beside them, the bench of each run
(raw/bench.csv, ms of CPU per record of each part of a hop) before and after: it keeps only each
part's median over its rounds, so it has no interval.
"""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from scipy import stats as scipy_stats  # noqa: E402

from experiments.analysis import bench_sum, stats  # noqa: E402
from experiments.design.matrix import BASELINE, BENCH_CSV  # noqa: E402
from experiments.report.reporting import names, render_html, render_markdown, save  # noqa: E402

CONFIDENCE = 0.95
RESAMPLES = 999
MEASURES = {  # name: (title, unit)
    "median": ("median RTT", "ms"),
    "p95": ("p95 RTT", "ms"),
    "cpu_per_record": ("CPU per record", "ms"),
    "rate": ("rate carried", "req/s"),
}


class CompareError(Exception):
    """Runs that cannot be compared: missing, or without a case in common."""


def samples(run_dir: Path) -> dict[tuple, dict[str, np.ndarray]]:
    """Per case of a run: its delivered RTTs, and per second of its windows the CPU per record and
    the records sent, over its repetitions."""
    if not (run_dir / "metadata.json").exists():
        raise CompareError(f"no run at {run_dir} (no metadata.json)")
    per_case: dict[tuple, dict[str, list]] = {}
    for cell_json in sorted((run_dir / "raw").glob("*/cell.json")):
        meta = json.loads(cell_json.read_text())
        requests = stats.read_requests(cell_json.parent)
        start = requests["t_send_ms"].min() + meta["warmup_s"] * 1000
        measured = stats.in_window(requests, meta["warmup_s"], meta["duration_s"])
        cell = stats.identity(meta["cell"])
        case = tuple(cell[key] for key in stats.CASE)
        seconds = np.floor((measured["t_send_ms"].to_numpy() - start) / 1000).astype(int)
        sent = np.bincount(seconds, minlength=int(meta["duration_s"]))[: int(meta["duration_s"])]
        cpu = pd.read_csv(cell_json.parent / "cpu.csv")
        # The deployment's CPU in each whole second of the window, interpolated at its bounds.
        bounds = start + 1000 * np.arange(int(meta["duration_s"]) + 1)
        used = np.diff(np.interp(bounds, cpu["t_ms"], cpu["deployment_s"]))
        has_records = sent > 0
        found = per_case.setdefault(case, {"rtt": [], "cpu_per_record": [], "rate": []})
        found["rtt"].append(stats.delivered(measured)["rtt_ms"].to_numpy())
        found["cpu_per_record"].append(1000 * used[has_records] / sent[has_records])
        found["rate"].append(sent.astype(float))
    return {case: {name: np.concatenate(parts) for name, parts in found.items()} for case, found in per_case.items()}


def saturated_cases(run_dir: Path) -> dict[tuple, bool]:
    cells, requests, _ = stats.load_run(run_dir)
    table = stats.pooled(cells, requests)
    return {tuple(row[key] for key in stats.CASE): bool(row["saturated"]) for _, row in table.iterrows()}


def change(before: np.ndarray, after: np.ndarray, statistic, seed: int) -> dict:
    """statistic(after) − statistic(before), with its bootstrap confidence interval."""
    estimate = statistic(after, axis=-1) - statistic(before, axis=-1)
    if len(before) < 2 or len(after) < 2:
        return {"before": statistic(before, axis=-1), "after": statistic(after, axis=-1), "change": estimate,
                "low": float("nan"), "high": float("nan")}
    interval = scipy_stats.bootstrap((before, after), lambda a, b, axis: statistic(b, axis=axis) - statistic(a, axis=axis),
                                     vectorized=True, n_resamples=RESAMPLES, confidence_level=CONFIDENCE, method="percentile",
                                     batch=100, rng=np.random.default_rng(seed)).confidence_interval
    return {"before": statistic(before, axis=-1), "after": statistic(after, axis=-1), "change": estimate,
            "low": interval.low, "high": interval.high}


def p95(values: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.percentile(values, 95, axis=axis)


STATISTICS = {"median": ("rtt", np.median), "p95": ("rtt", p95), "cpu_per_record": ("cpu_per_record", np.mean), "rate": ("rate", np.mean)}


def compare(run_a: Path, run_b: Path, seed: int = 1) -> pd.DataFrame:
    """One row per case common to both runs and measure: before, after, change, its interval, and
    whether the interval excludes 0."""
    before, after = samples(run_a), samples(run_b)
    common = [case for case in before if case in after]
    if not common:
        raise CompareError(f"runs {run_a.name} and {run_b.name} have no case (topology, engine, rate, services) in common")
    saturated_a, saturated_b = saturated_cases(run_a), saturated_cases(run_b)
    rows = []
    for case in common:
        for measure, (sample, statistic) in STATISTICS.items():
            result = change(before[case][sample], after[case][sample], statistic, seed)
            rows.append({**dict(zip(stats.CASE, case)), "measure": measure, **{k: float(v) for k, v in result.items()},
                         "saturated_a": saturated_a.get(case, False), "saturated_b": saturated_b.get(case, False)})
    table = pd.DataFrame(rows)
    table["relative"] = table["change"] / table["before"]
    table["shift"] = (table["low"] > 0) | (table["high"] < 0)
    table["capacity"] = (table["measure"] == "rate") & table["saturated_a"] & table["saturated_b"]
    table["measure_rank"] = table["measure"].map({name: rank for rank, name in enumerate(MEASURES)})
    return stats.order(table, by=[*stats.CASE, "measure_rank"]).drop(columns="measure_rank")


PER_HOP = {"rtt_per_hop": ("rtt", np.median), "cpu_per_hop": ("cpu_per_record", np.mean)}  # name: (sample, statistic)


def per_hop(run_a: Path, run_b: Path, seed: int = 1) -> pd.DataFrame:
    """Per enforcing case common to both runs with its baseline in both: the enforcement cost per
    hop (RTT and CPU) in A and in B, the change and its bootstrap interval."""
    before, after = samples(run_a), samples(run_b)
    rows = []
    for case in (case for case in before if case in after and case[0] != BASELINE):
        baseline = (BASELINE, stats.NO_ENGINE, case[2], case[3])
        if baseline not in before or baseline not in after:
            continue
        hops = case[3]  # every hop into a service is decided (stats.enforcement_cost)
        for name, (sample, statistic) in PER_HOP.items():
            def cost(enforcing, reference, axis=-1):
                return (statistic(enforcing, axis=axis) - statistic(reference, axis=axis)) / hops
            data = (before[case][sample], before[baseline][sample], after[case][sample], after[baseline][sample])
            interval = scipy_stats.bootstrap(data, lambda a, a0, b, b0, axis: cost(b, b0, axis) - cost(a, a0, axis), vectorized=True,
                                             n_resamples=RESAMPLES, confidence_level=CONFIDENCE, method="percentile", batch=100,
                                             rng=np.random.default_rng(seed)).confidence_interval
            cost_a, cost_b = cost(*data[:2]), cost(*data[2:])
            rows.append({**dict(zip(stats.CASE, case)), "measure": name, "before": cost_a, "after": cost_b, "change": cost_b - cost_a,
                         "low": interval.low, "high": interval.high, "shift": interval.low > 0 or interval.high < 0,
                         "measure_rank": list(PER_HOP).index(name)})
    return stats.order(pd.DataFrame(rows), by=[*stats.CASE, "measure_rank"]).drop(columns="measure_rank") if rows else pd.DataFrame()


def bench_before_after(run_a: Path, run_b: Path) -> pd.DataFrame:
    """The bench rows (ms of CPU per record) both runs measured, before and after."""
    paths = [run / "raw" / BENCH_CSV for run in (run_a, run_b)]
    if not all(path.exists() for path in paths):
        return pd.DataFrame()
    a, b = (bench_sum.read(path)[["part", "value", "unit"]] for path in paths)
    both = a.merge(b, on=["part", "unit"], suffixes=("_a", "_b"))
    both["change"] = both["value_b"] - both["value_a"]
    both["ratio"] = both["value_b"] / both["value_a"]
    return both


# ---- the document ---------------------------------------------------------------------------

def interval_text(row) -> str:
    digits = 1 if row.measure == "rate" else 3
    if np.isnan(row.low):
        return f"{row.change:+.{digits}f} (too few samples)"
    return f"{row.change:+.{digits}f} [{row.low:+.{digits}f}, {row.high:+.{digits}f}]"


def view(table: pd.DataFrame) -> pd.DataFrame:
    """One row per case, a column per measure: before → after, change [95% CI], and a mark where it shifted."""
    rows = []
    for case, group in table.groupby(stats.CASE, sort=False):
        first = group.iloc[0]
        row = {"case": names(group.iloc[:1])[0], "rate": case[2], "services": case[3],
               "saturated (A, B)": f"{'yes' if first['saturated_a'] else 'no'}, {'yes' if first['saturated_b'] else 'no'}"}
        for measure in group.itertuples():
            title, unit = MEASURES[measure.measure]
            digits = 1 if measure.measure == "rate" else 3
            row[f"{title} A → B ({unit})"] = (f"{measure.before:.{digits}f} → {measure.after:.{digits}f}"
                                             + (" (capacity)" if measure.capacity else ""))
            row[f"{title} change [95% CI]"] = interval_text(measure) + (" ✱" if measure.shift else "")
        rows.append(row)
    return pd.DataFrame(rows)


def figure(table: pd.DataFrame, figures_dir: Path) -> Path:
    """Each measure's change relative to run A, per case, with its interval; 0 marked."""
    cases = list(dict.fromkeys(zip(*(table[key] for key in stats.CASE))))
    labels = [f"{name} r{case[2]} n{case[3]}" for case, name in
              zip(cases, names(pd.DataFrame(cases, columns=stats.CASE)))]
    fig, axes = plt.subplots(1, len(MEASURES), figsize=(3.2 * len(MEASURES) + 2, 0.35 * len(cases) + 1.6), sharey=True,
                             layout="constrained")
    for ax, (measure, (title, _)) in zip(axes, MEASURES.items()):
        rows = table[table["measure"] == measure].set_index(stats.CASE).loc[cases]
        centre = 100 * rows["relative"].to_numpy()
        low, high = 100 * rows["low"].to_numpy() / rows["before"].to_numpy(), 100 * rows["high"].to_numpy() / rows["before"].to_numpy()
        positions = np.arange(len(cases))
        shifted = rows["shift"].to_numpy()
        for chosen, colour in ((shifted, "#c44e52"), (~shifted, "#4c72b0")):
            ax.errorbar(centre[chosen], positions[chosen], xerr=[(centre - low)[chosen], (high - centre)[chosen]], fmt="o",
                        color=colour, markersize=4, capsize=3)
        ax.axvline(0, color="black", linewidth=0.8)
        ax.set_title(f"{title}, B vs A (%)", fontsize=9)
        ax.grid(axis="x", alpha=0.3)
    axes[0].set_yticks(range(len(cases)), labels, fontsize=7)
    axes[0].invert_yaxis()
    fig.suptitle(f"change with its {CONFIDENCE:.0%} bootstrap interval (red: the interval excludes 0)", fontsize=9)
    return save(fig, figures_dir, "compare")


def build(run_a: Path, run_b: Path, out_dir: Path) -> dict:
    """compare.md, compare.html, compare.csv and the figure of runs A and B, in out_dir."""
    table = compare(run_a, run_b)
    hops = per_hop(run_a, run_b)
    bench = bench_before_after(run_a, run_b)
    (out_dir / "figures").mkdir(parents=True, exist_ok=True)
    table.to_csv(out_dir / "compare.csv", index=False)
    shifts = table[table["shift"]]
    blocks = [
        ("h1", f"{run_b.name} against {run_a.name}"),
        ("p", f"A (before): `{run_a}`; B (after): `{run_b}`. Per case both measured (repetitions pooled): B − A with its "
              f"{CONFIDENCE:.0%} bootstrap confidence interval ({RESAMPLES} resamples, percentile). ✱: the interval excludes 0, a "
              f"shift. Capacity: the rate carried where the case is saturated in both runs. CPU per record: the mean over the "
              f"window's seconds of the deployment's CPU that second over the records sent in it. A saturated case's RTT "
              "describes an overloaded system: read its capacity."),
        ("table", view(table)),
        ("list", [f"{len(table.groupby(stats.CASE))} cases in common; {len(shifts)} of {len(table)} changes are shifts"]
         + [f"{name} r{row.rate} n{row.services}: {MEASURES[row.measure][0]} {interval_text(row)} ({row.relative:+.0%})"
            for name, row in zip(names(shifts), shifts.itertuples())]),
        ("figure", figure(table, out_dir / "figures"), "Each measure's change relative to A, with its interval."),
    ]
    if not hops.empty:
        blocks += [("h2", "The cost of enforcement per hop, before and after"),
                   ("p", "(the case's median RTT − the baseline's) / hops, and the same of the mean CPU per record, in ms; "
                         f"the change with its {CONFIDENCE:.0%} bootstrap interval (✱: it excludes 0)."),
                   ("table", pd.DataFrame({
                       "case": names(hops), "rate": hops["rate"], "services": hops["services"],
                       "per hop": hops["measure"].map({"rtt_per_hop": "RTT (ms)", "cpu_per_hop": "CPU (ms)"}),
                       "A → B": [f"{a:.3f} → {b:.3f}" for a, b in zip(hops["before"], hops["after"])],
                       "change [95% CI]": [interval_text(row) + (" ✱" if row.shift else "") for row in hops.itertuples()]}))]
    if not bench.empty:
        blocks += [("h2", "The bench before and after (ms of CPU per record of each part of a hop)"),
                   ("p", "Each run's `raw/bench.csv`: the median of each part over the bench's rounds, so no interval; "
                         "read ratios of a few tenths as this machine's noise (experiments/README.md)."),
                   ("table", pd.DataFrame({"part": bench["part"], "unit": bench["unit"], "A": bench["value_a"].map("{:.3f}".format),
                                           "B": bench["value_b"].map("{:.3f}".format), "B − A": bench["change"].map("{:+.3f}".format),
                                           "B ÷ A": bench["ratio"].map("{:.2f}×".format)}))]
    paths = {"markdown": out_dir / "compare.md", "html": out_dir / "compare.html"}
    paths["markdown"].write_text(render_markdown(blocks, out_dir))
    paths["html"].write_text(render_html(blocks, f"{run_b.name} against {run_a.name}"))
    return paths
