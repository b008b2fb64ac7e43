"""A run's report: derived tables (report/tables/*.csv), figures (report/figures/*.png, .svg)
and report.md / report.html (self-contained: the figures embedded).

The report is built only from results/<run-id>/ (metadata.json and raw/), so it can be
rebuilt at any time: `python -m experiments report <run-id>`.
"""

from __future__ import annotations

import base64
import html
import json
import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib import cbook  # noqa: E402
from matplotlib.colors import to_rgb  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402
from matplotlib.ticker import FuncFormatter  # noqa: E402

from . import changeability, stats  # noqa: E402
from .targets import run_paragraphs  # noqa: E402
from .matrix import (BASELINE, BENCH_CSV, COMPILED_ENGINE, ENFORCING, ENGINE_NAMES, ENGINES, MAX_ERROR_RATE, MAX_REPETITION_CV,  # noqa: E402
                     MIN_ACHIEVED_SHARE, P99_BOUND_MS, PAPER_NAMES, PRIME_MIN_SECONDS, PROFILES, TOPOLOGIES, Parameters, case_name)

PAPER_REFERENCE = Path(__file__).resolve().parent / "paper_reference.json"
# A colour per topology in the experiments' order, the reference grey; a topology added to the
# manifests takes the next one.
PALETTE = ("#d62728", "#ff7f0e", "#bcbd22", "#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf")
COLORS = {**dict(zip(ENFORCING, PALETTE)), BASELINE: "#7f7f7f"}
# The compiled engine's boxes and bars: its topology's colour this much lighter, drawn right
# after the same topology's envoy-opa ones, so each pair reads as one topology.
COMPILED_LIGHTER = 0.55
VERDICT_COLORS = {"met": "#55a868", "NOT MET": "#c44e52", "": "#999999"}
SPLIT_COLORS = {"in services": "#4c72b0", "transit": "#bbbbbb", "enforcement": "#dd8452", "sender late": "#8172b2"}
CPU_COLORS = {"service": "#4c72b0", "envoy": "#55a868", "opa": "#c44e52"}
CPU_LABELS = {"service": "services", "envoy": "Envoy", "opa": "OPA"}
# Outliers drawn per box at most: tens of thousands of points per box make unreadable,
# heavy figures; the whiskers and the tables keep the extremes.
MAX_FLIERS = 200
SATURATED_MARK = "†"
CV_FLAG = "over 10%"


def load_paper_reference() -> dict:
    return json.loads(PAPER_REFERENCE.read_text())


# ---- derived tables -------------------------------------------------------------------

def paper_w_avg_over(services: list[int], architecture: str, rate: int, reference: dict) -> float:
    """The paper's W Avg over the service counts we ran, where its Table I row is legible."""
    medians = reference["median_rtt_ms"].get(architecture, {}).get(str(rate), {})
    if not services or any(str(n) not in medians for n in services):
        return float("nan")
    return float(np.mean([medians[str(n)] / n for n in services]))


def w_avg_comparison(w_avg: pd.DataFrame, reference: dict) -> pd.DataFrame:
    """Our W Avg per topology, engine and rate beside the paper's for that topology: the paper
    had one engine, whose architecture is envoy-opa's, so both engines are set against it.
    Ordered by topology, rate, engine: a topology's engines side by side at each rate."""
    rows = []
    for row in w_avg.itertuples():
        architecture = PAPER_NAMES[row.topology]
        services = [int(n) for n in row.services_run.split()]
        rows.append({
            "topology": row.topology, "engine": row.engine, "rate": row.rate, "w_avg": row.w_avg, "services_run": row.services_run,
            "paper_w_avg": reference["w_avg_ms"].get(architecture, {}).get(str(row.rate), float("nan")),
            "paper_w_avg_same_services": paper_w_avg_over(services, architecture, row.rate, reference),
            "any_saturated": row.any_saturated,
        })
    return stats.order(pd.DataFrame(rows), by=["topology", "rate", "engine"])


# ---- formatting -----------------------------------------------------------------------

def ms(value) -> str:
    return "–" if pd.isna(value) else f"{value:.3f}"


def rate_text(value) -> str:
    return "–" if pd.isna(value) else f"{value:.1f}"


def percent(value) -> str:
    return "–" if pd.isna(value) else f"{value:.1%}"


def cores(value) -> str:
    return "–" if pd.isna(value) else f"{round(value, 2) + 0.0:.2f}"  # + 0.0: no "-0.00" from sampling noise


def ratio_text(value) -> str:
    return "–" if pd.isna(value) else f"{value:.2f}×"


def marked(text, saturated: bool) -> str:
    """A value with the saturated mark when its case is saturated."""
    return f"{text} {SATURATED_MARK}" if saturated else f"{text}"


def arch(topology: str) -> str:
    return PAPER_NAMES.get(topology, topology)


def names(frame: pd.DataFrame) -> list[str]:
    """Each row's topology under its engine, as an architect reads it: "CE (envoy-opa)", "CE (compiled)", "baseline"."""
    return [case_name(topology, engine) for topology, engine in zip(frame["topology"], frame["engine"])]


def table_one(table: pd.DataFrame, w_avg: pd.DataFrame) -> pd.DataFrame:
    """Table I in the paper's layout, a topology under each engine as an architecture of its
    own; W Avg on the first row of each architecture and rate."""
    w_avg_of = {(r.topology, r.engine, r.rate): r.w_avg for r in w_avg.itertuples()}
    rows, previous = [], None
    for row in table.itertuples():
        first = (row.topology, row.engine, row.rate) != previous
        previous = (row.topology, row.engine, row.rate)
        rows.append({
            "Arch.": case_name(row.topology, row.engine) if first else "",
            "Call Freq. (req/s)": str(row.rate) if first else "",
            "Num. Serv.": marked(row.services, row.saturated),
            "Min (ms)": ms(row.min), "Q1 (ms)": ms(row.q1), "Median (ms)": ms(row.median), "Q3 (ms)": ms(row.q3),
            "p95 (ms)": ms(row.p95), "Max (ms)": ms(row.max), "Mean (ms)": ms(row.mean), "STD": ms(row.std),
            "W Avg (ms)": ms(w_avg_of.get((row.topology, row.engine, row.rate))) if first else "",
        })
    return pd.DataFrame(rows)


def load_view(cells: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame({
        "Arch.": names(cells), "Rate (req/s)": cells["rate"], "Serv.": cells["services"], "Rep.": cells["repetition"], "Load": cells["load"],
        "Users": cells["users"], "Offered (req/s)": cells["offered_rate"].map(rate_text), "Achieved (req/s)": cells["achieved_rate"].map(rate_text),
        "Achieved / offered": (cells["achieved_rate"] / cells["offered_rate"]).map(percent),
        "Missed": [f"{missed} of {scheduled}" for missed, scheduled in zip(cells["missed"], cells["scheduled"])],
        "Send lag p99 (ms)": cells["send_lag_p99_ms"].map(ms), "Errors": cells["error_rate"].map(percent),
        "Saturated": cells["saturated"].map({True: f"yes {SATURATED_MARK}", False: "no"}), "Median RTT (ms)": cells["median"].map(ms),
        "CPU machine": cells["cpu_machine"].map(cores), "CPU Locust": cells["cpu_locust"].map(cores),
        "CPU deployment": cells["cpu_deployment"].map(cores), "CPU other": cells["cpu_other"].map(cores),
    })


def w_avg_view(comparison: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame({
        "Arch.": names(comparison), "Rate (req/s)": comparison["rate"],
        "W Avg ours (ms)": [marked(ms(v), s) for v, s in zip(comparison["w_avg"], comparison["any_saturated"])],
        "Services run": comparison["services_run"],
        "W Avg paper, its architecture = envoy-opa (ms, n = 5 10 25 50)": comparison["paper_w_avg"].map(ms),
        "Paper over our n (ms)": comparison["paper_w_avg_same_services"].map(ms),
    })


def spread_view(spread: pd.DataFrame) -> pd.DataFrame:
    """The CV of the medians of the cases that are not saturated, flagged over 10%; a saturated
    case's medians measure how far its queue grew, so it gets none."""
    return pd.DataFrame({
        "Arch.": names(spread), "Rate (req/s)": spread["rate"], "Serv.": spread["services"], "Load": spread["load"],
        "Repetitions": spread["repetitions"], "Median of each repetition (ms)": spread["medians"],
        "CV of the medians": [f"saturated {SATURATED_MARK}" if saturated else percent(cv) for cv, saturated in zip(spread["cv"], spread["saturated"])],
        f"CV above {MAX_REPETITION_CV:.0%}": spread["cv_flagged"].map({True: CV_FLAG, False: ""}),
    })


def cost_view(cost: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame({
        "Arch.": names(cost), "Rate (req/s)": cost["rate"],
        "Serv. (= hops)": [marked(n, s) for n, s in zip(cost["services"], cost["saturated"])],
        "Median RTT (ms)": cost["median"].map(ms), "Baseline median RTT (ms)": cost["baseline_median"].map(ms),
        "Enforcement per hop (ms)": cost["cost_per_hop"].map(ms),
    })


def split_view(split: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame({
        "Arch.": names(split), "Rate (req/s)": split["rate"],
        "Serv.": [marked(n, s) for n, s in zip(split["services"], split["saturated"])],
        "Mean RTT (ms)": split["rtt_ms"].map(ms), "Sender late (ms)": split["send_lag_ms"].map(ms), "In services (ms)": split["service_ms"].map(ms),
        "Transit (ms)": split["transit_ms"].map(ms), "Enforcement (ms)": split["enforcement_ms"].map(ms),
        "Enforcement share": (split["enforcement_ms"] / split["rtt_ms"]).map(percent),
        "Enforcement per hop (ms)": split["enforcement_per_hop_ms"].map(ms),
        "Median gap t_out→t_in (ms)": split["forward_gap_median_ms"].map(ms),
        "Baseline gap (ms)": split["baseline_forward_gap_median_ms"].map(ms),
        "Enforcement per gap (ms)": split["enforcement_per_gap_ms"].map(ms),
    })


def cpu_view(cpu: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame({
        "Arch.": names(cpu), "Rate (req/s)": cpu["rate"],
        "Serv.": [marked(n, s) for n, s in zip(cpu["services"], cpu["saturated"])],
        "CPU per record (ms)": cpu["total_ms"].map(ms), "Services (ms)": cpu["service_ms"].map(ms),
        "Envoy (ms)": cpu["envoy_ms"].map(ms), "OPA (ms)": cpu["opa_ms"].map(ms),
        "Enforcement CPU per hop (ms)": cpu["enforcement_per_hop_ms"].map(ms),
    })


def engines_view(comparison: pd.DataFrame) -> pd.DataFrame:
    """One topology's rows of stats.engine_comparison, for an architect: each measure under
    envoy-opa, under the compiled engine, compiled ÷ envoy-opa, and the baseline's."""
    saturated_opa, saturated_compiled = comparison["saturated_opa"], comparison["saturated_compiled"]
    return pd.DataFrame({
        "Rate (req/s)": comparison["rate"], "Serv.": comparison["services"],
        "Median RTT, envoy-opa (ms)": [marked(ms(v), s) for v, s in zip(comparison["median_opa"], saturated_opa)],
        "Median RTT, compiled (ms)": [marked(ms(v), s) for v, s in zip(comparison["median_compiled"], saturated_compiled)],
        "Median RTT, compiled ÷ envoy-opa": comparison["median_ratio"].map(ratio_text),
        "Median RTT, baseline (ms)": comparison["baseline_median"].map(ms),
        "Achieved, envoy-opa (req/s)": [marked(rate_text(v), s) for v, s in zip(comparison["achieved_rate_opa"], saturated_opa)],
        "Achieved, compiled (req/s)": [marked(rate_text(v), s) for v, s in zip(comparison["achieved_rate_compiled"], saturated_compiled)],
        "Achieved, compiled ÷ envoy-opa": comparison["achieved_rate_ratio"].map(ratio_text),
        "CPU per record, envoy-opa (ms)": comparison["total_ms_opa"].map(ms),
        "CPU per record, compiled (ms)": comparison["total_ms_compiled"].map(ms),
        "CPU per record, compiled ÷ envoy-opa": comparison["total_ms_ratio"].map(ratio_text),
        "CPU per record, baseline (ms)": comparison["baseline_total_ms"].map(ms),
    })


def bench_view(bench: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame({
        "Part": bench["part"], "Process": bench["process"], "CPU": [f"{v:.4g} {unit}" for v, unit in zip(bench["value"], bench["unit"])],
        "Floor": bench["floor"].fillna(""), "Floor's CPU": bench["floor_value"].map(lambda v: "–" if pd.isna(v) else f"{v:.4g}"), "Ratio to the floor": bench["ratio"].map(ratio_text),
        "Target": bench["target"].map(lambda t: "" if pd.isna(t) else f"≤ {t:g}×"), "Verdict": bench["verdict"].fillna(""),
    })


# ---- figures --------------------------------------------------------------------------

def save(figure, figures_dir: Path, name: str, load: str | None = None) -> Path:
    """Write a figure as PNG and SVG; one measured under load names that load in its corner."""
    if load:
        figure.text(0.995, 0.998, f"load: {load}", ha="right", va="top", fontsize=7, color="#444")
    png = figures_dir / f"{name}.png"
    figure.savefig(png, dpi=130, bbox_inches="tight")
    figure.savefig(figures_dir / f"{name}.svg", bbox_inches="tight")
    plt.close(figure)
    return png


def color(topology: str, engine: str) -> tuple:
    """The topology's colour; lighter under the compiled engine."""
    base = np.array(to_rgb(COLORS[topology]))
    return tuple(base + (1 - base) * COMPILED_LIGHTER) if engine == COMPILED_ENGINE else tuple(base)


def series_of(frame: pd.DataFrame) -> list[tuple[str, str]]:
    """The (topology, engine) pairs a frame holds, in the report's order: a topology's engines side by side."""
    present = set(zip(frame["topology"], frame["engine"]))
    return [(t, e) for t in TOPOLOGIES for e in [*ENGINES, stats.NO_ENGINE] if (t, e) in present]


def series_legend(pairs: list[tuple[str, str]], extra: list | None = None) -> list:
    return [Patch(facecolor=color(t, e), edgecolor="black", label=case_name(t, e)) for t, e in pairs] + (extra or [])


SATURATED_PATCH = Patch(facecolor="white", edgecolor="black", hatch="///", label="saturated")


def panels(count: int, width: float, height: float, columns: int = 2, **options):
    """A grid of `count` panels, at most `columns` wide, so that a page shows them legibly."""
    columns = min(columns, count)
    rows = -(-count // columns)
    figure, axes = plt.subplots(rows, columns, figsize=(width * columns, height * rows), squeeze=False, **options)
    flat = list(axes.flatten())
    for unused in flat[count:]:
        unused.set_visible(False)
    return figure, flat[:count]


def log_scale(ax) -> None:
    """A log y axis labelled 2, 5, 10, 20, ... rather than 2 x 10^0."""
    ax.set_yscale("log")
    plain = FuncFormatter(lambda value, _: f"{value:g}")
    ax.yaxis.set_major_formatter(plain)
    ax.yaxis.set_minor_formatter(FuncFormatter(lambda value, _: f"{value:g}" if str(f"{value:g}")[0] in "25" else ""))


LEGEND_COLUMNS = 5  # entries per legend row: a topology's two engines and the baseline fit twice


def legend_below(figure, handles: list) -> None:
    """One legend under all panels, where it hides no bar or box."""
    rows = -(-len(handles) // LEGEND_COLUMNS)
    figure.tight_layout(rect=(0, 0.04 + 0.04 * rows, 1, 1))
    figure.legend(handles=handles, loc="lower center", ncol=min(len(handles), LEGEND_COLUMNS), fontsize=8, frameon=False)


def box_figure(table: pd.DataFrame, requests: pd.DataFrame, figures_dir: Path, load: str) -> Path:
    """Like the paper's Fig. 2: RTT distributions, one panel per rate, a box per topology,
    engine and service count; a log scale when the panel spans more than two decades."""
    timed = stats.delivered(requests)
    values = {key: group["rtt_ms"].to_numpy() for key, group in timed.groupby(stats.CASE, observed=True)}
    saturated_cases = {(r.topology, r.engine, r.rate, r.services) for r in table.itertuples() if r.saturated}
    rates = sorted(table["rate"].unique())
    services = sorted(table["services"].unique())
    pairs = series_of(table)
    width = 0.8 / len(pairs)
    figure, axes = panels(len(rates), max(7.0, 0.5 * len(services) * len(pairs) + 2), 3.4, columns=1)
    rng = np.random.default_rng(0)
    for ax, rate in zip(axes, rates):
        for p_index, (topology, engine) in enumerate(pairs):
            for s_index, n in enumerate(services):
                data = values.get((topology, engine, rate, n))
                if data is None or not len(data):
                    continue
                box = cbook.boxplot_stats(data, whis=1.5)[0]
                if len(box["fliers"]) > MAX_FLIERS:
                    box["fliers"] = rng.choice(box["fliers"], MAX_FLIERS, replace=False)
                drawn = ax.bxp([box], positions=[s_index + (p_index - (len(pairs) - 1) / 2) * width], widths=width * 0.85,
                               patch_artist=True, showfliers=True, flierprops={"marker": ".", "markersize": 2, "alpha": 0.4},
                               medianprops={"color": "black", "linewidth": 1.5})
                for patch in drawn["boxes"]:
                    patch.set_facecolor(color(topology, engine))
                    patch.set_hatch("///" if (topology, engine, rate, n) in saturated_cases else "")
        positive = timed[timed["rate"] == rate]["rtt_ms"]
        positive = positive[positive > 0]
        if len(positive) and positive.max() / positive.min() > 100:
            log_scale(ax)
        ax.set_xticks(range(len(services)), [f"{n} services" for n in services])
        ax.set_ylabel("RTT (ms)")
        ax.set_title(f"{rate} requests/s (offered)")
        ax.grid(axis="y", alpha=0.3, which="both")
    legend_below(figure, series_legend(pairs, [SATURATED_PATCH]))
    return save(figure, figures_dir, "rtt_boxplots", load)


def grouped_bars(ax, groups: list, series: dict) -> None:
    """Bars of every (topology, engine) side by side in each group; series: that pair -> one value per group."""
    width = 0.8 / max(1, len(series))
    for index, ((topology, engine), heights) in enumerate(series.items()):
        positions = np.arange(len(groups)) + (index - (len(series) - 1) / 2) * width
        ax.bar(positions, heights, width * 0.95, color=color(topology, engine), edgecolor="black", linewidth=0.5)
    ax.set_xticks(range(len(groups)), groups)


def w_avg_figure(comparison: pd.DataFrame, figures_dir: Path, load: str) -> Path:
    """Our W Avg under each engine beside the paper's, per rate; log scale (the paper's CE is
    hundreds of ms). A group of bars per topology: its engines, then the paper's value."""
    rates = sorted(comparison["rate"].unique())
    pairs = series_of(comparison)
    topologies = list(dict.fromkeys(t for t, _ in pairs))
    figure, axes = panels(len(rates), max(4.6, 0.45 * (len(pairs) + len(topologies)) + 1.5), 4.0)
    for ax, rate in zip(axes, rates):
        rows = comparison[comparison["rate"] == rate]
        position, centres = 0.0, []
        for topology in topologies:
            first = position
            for row in rows[rows["topology"] == topology].itertuples():
                ax.bar(position, row.w_avg, 0.9, color=color(topology, row.engine), edgecolor="black", linewidth=0.5)
                ax.annotate(f"{row.w_avg:.1f}{SATURATED_MARK if row.any_saturated else ''}", (position, row.w_avg), ha="center", va="bottom", fontsize=7)
                position += 1
            paper = rows[rows["topology"] == topology]["paper_w_avg"].dropna()
            if len(paper):
                ax.bar(position, paper.iloc[0], 0.9, color="white", edgecolor=COLORS[topology], hatch="..", linewidth=1.2)
                ax.annotate(f"{paper.iloc[0]:.1f}", (position, paper.iloc[0]), ha="center", va="bottom", fontsize=7, color="#444")
                position += 1
            centres.append((first + position - 1) / 2)
            position += 0.6  # a gap between topologies
        ax.set_xticks(centres, [arch(t) for t in topologies])
        log_scale(ax)
        heights = pd.concat([rows["w_avg"], rows["paper_w_avg"]]).dropna()
        ax.set_ylim(heights.min() / 2, heights.max() * 2)  # room for the labels above the bars; bars start below the axis
        ax.set_title(f"{rate} requests/s (offered)")
        ax.set_ylabel("W Avg (ms per service)")
        ax.grid(axis="y", alpha=0.3, which="both")
    figure.suptitle(f"Ours over n = {comparison['services_run'].iloc[0]} ({SATURATED_MARK}: saturated); the paper's over n = 5 10 25 50", fontsize=9)
    legend_below(figure, series_legend(pairs, [Patch(facecolor="white", edgecolor="black", hatch="..", label="paper (its architecture = envoy-opa)")]))
    return save(figure, figures_dir, "w_avg", load)


def cost_figure(cost: pd.DataFrame, figures_dir: Path, load: str) -> Path:
    """Enforcement per hop, one panel per rate, a bar per topology and engine; saturated cases hatched."""
    rates = sorted(cost["rate"].unique())
    services = sorted(cost["services"].unique())
    pairs = series_of(cost)
    figure, axes = panels(len(rates), max(4.6, 0.3 * len(services) * len(pairs) + 1.5), 3.8)
    for ax, rate in zip(axes, rates):
        rows = cost[cost["rate"] == rate]
        series = {(t, e): [rows[(rows.topology == t) & (rows.engine == e) & (rows.services == n)]["cost_per_hop"].sum(min_count=1) for n in services]
                  for t, e in pairs}
        grouped_bars(ax, [f"{n} services" for n in services], series)
        saturated = {(r.topology, r.engine, r.services) for r in rows.itertuples() if r.saturated}
        for bar, key in zip(ax.patches, [(t, e, n) for t, e in pairs for n in services]):
            bar.set_hatch("///" if key in saturated else "")
        ax.axhline(0, color="black", linewidth=0.6)
        ax.set_title(f"{rate} requests/s (offered)")
        ax.set_ylabel("(median RTT − baseline's) / hops (ms)")
        ax.grid(axis="y", alpha=0.3)
    legend_below(figure, series_legend(pairs, [SATURATED_PATCH]))
    return save(figure, figures_dir, "enforcement_per_hop", load)


def stacked_figure(frame: pd.DataFrame, stacks: dict, title: str, ylabel: str, figures_dir: Path, name: str, load: str) -> Path:
    """Stacked bars, one per case (topology, engine and services), one panel per rate; saturated
    cases marked in their label. stacks: legend label -> (colour, the heights for a panel's rows)."""
    rates = sorted(frame["rate"].unique())
    figure, axes = panels(len(rates), max(6.0, 0.6 * frame.groupby("rate").size().max() + 1.5), 4.2, columns=1)
    for ax, rate in zip(axes, rates):
        rows = frame[frame["rate"] == rate].reset_index(drop=True)
        labels = [f"{arch(t)}\n{ENGINE_NAMES.get(e, '')}\n{marked(n, s)}" for t, e, n, s in zip(rows["topology"], rows["engine"], rows["services"], rows["saturated"])]
        bottom = np.zeros(len(rows))
        for fill, heights_of in stacks.values():
            heights = heights_of(rows)
            ax.bar(range(len(rows)), heights, 0.7, bottom=bottom, color=fill, edgecolor="black", linewidth=0.4)
            bottom += heights
        ax.set_xticks(range(len(rows)), labels, fontsize=7)
        ax.set_title(f"{rate} requests/s (offered): {title}")
        ax.set_ylabel(ylabel)
        ax.set_xlabel(f"architecture, engine, services ({SATURATED_MARK}: saturated)")
        ax.grid(axis="y", alpha=0.3)
    legend_below(figure, [Patch(facecolor=fill, edgecolor="black", label=label) for label, (fill, _) in stacks.items()])
    return save(figure, figures_dir, name, load)


def split_figure(split: pd.DataFrame, figures_dir: Path, load: str) -> Path:
    """Stacked mean time per request: in services, transit, enforcement (topology − baseline)."""
    return stacked_figure(split, {
        "in services": (SPLIT_COLORS["in services"], lambda rows: rows["service_ms"].to_numpy()),
        "transit": (SPLIT_COLORS["transit"], lambda rows: rows["transit_ms"].fillna(rows["outside_ms"]).to_numpy()),
        "enforcement": (SPLIT_COLORS["enforcement"], lambda rows: rows["enforcement_ms"].clip(lower=0).fillna(0).to_numpy()),
        "sender late": (SPLIT_COLORS["sender late"], lambda rows: rows["send_lag_ms"].clip(lower=0).fillna(0).to_numpy()),
    }, "mean per request", "ms", figures_dir, "time_split", load)


def cpu_figure(cpu: pd.DataFrame, figures_dir: Path, load: str) -> Path:
    """Stacked CPU per record by kind of part (services, Envoy, OPA)."""
    return stacked_figure(cpu, {
        CPU_LABELS[kind]: (fill, lambda rows, kind=kind: rows[f"{kind}_ms"].fillna(0).to_numpy()) for kind, fill in CPU_COLORS.items()
    }, "CPU per delivered record", "ms of CPU", figures_dir, "cpu_per_record", load)


def load_figure(cells: pd.DataFrame, figures_dir: Path, load: str) -> Path:
    """Achieved rate as a share of the offered one per case (mean over repetitions), the
    achieved req/s written on each bar; one panel per service count."""
    services = sorted(cells["services"].unique())
    rates = sorted(cells["rate"].unique())
    pairs = series_of(cells)
    achieved = cells.groupby(["topology", "engine", "rate", "services"])["achieved_rate"].mean()
    figure, axes = panels(len(services), max(4.4, 0.45 * len(rates) * len(pairs) + 1.5), 3.8)
    for ax, n in zip(axes, services):
        series = {(t, e): [100 * achieved.get((t, e, r, n), np.nan) / r for r in rates] for t, e in pairs}
        grouped_bars(ax, [f"{r} req/s offered" for r in rates], series)
        for bar, (topology, engine, rate) in zip(ax.patches, [(t, e, r) for t, e in pairs for r in rates]):
            value = achieved.get((topology, engine, rate, n), np.nan)
            if not pd.isna(value):
                ax.annotate(f"{value:.0f}", (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom", fontsize=6)
        ax.axhline(100, color="black", linewidth=1)
        ax.axhline(100 * MIN_ACHIEVED_SHARE, color="black", linewidth=1, linestyle="dotted")
        ax.set_ylim(0, 115)
        ax.set_title(f"{n} services")
        ax.set_ylabel("achieved / offered rate (%)")
        ax.grid(axis="y", alpha=0.3)
    figure.suptitle("Achieved share of the offered rate (on the bars: achieved req/s); below the dotted 95% line: saturated", fontsize=9)
    legend_below(figure, series_legend(pairs))
    return save(figure, figures_dir, "offered_vs_achieved", load)


ENGINE_MEASURES = {"median": "median RTT", "total_ms": "CPU per record", "achieved_rate": "achieved rate"}


def engines_figure(comparison: pd.DataFrame, figures_dir: Path, load: str) -> Path:
    """compiled ÷ envoy-opa per topology, one panel per measure, a group per rate and services;
    under 1 the compiled engine took less time or CPU (or, for the rate, carried fewer records)."""
    cases = list(dict.fromkeys(zip(comparison["rate"], comparison["services"])))
    topologies = [t for t in TOPOLOGIES if t in set(comparison["topology"])]
    figure, axes = panels(len(ENGINE_MEASURES), max(6.0, 0.3 * len(cases) * len(topologies) + 1.5), 3.2, columns=1)
    for ax, (measure, label) in zip(axes, ENGINE_MEASURES.items()):
        width = 0.8 / len(topologies)
        for index, topology in enumerate(topologies):
            rows = comparison[comparison["topology"] == topology].set_index(["rate", "services"])
            for c_index, key in enumerate(cases):
                if key not in rows.index:
                    continue
                row = rows.loc[key]
                ax.bar(c_index + (index - (len(topologies) - 1) / 2) * width, row[f"{measure}_ratio"], width * 0.95, color=COLORS[topology],
                       edgecolor="black", linewidth=0.5, hatch="///" if row["saturated_opa"] or row["saturated_compiled"] else "")
        ax.axhline(1, color="black", linewidth=1)
        ax.set_xticks(range(len(cases)), [f"{r} req/s\n{n} serv." for r, n in cases], fontsize=7)
        ax.set_title(f"{label}: compiled ÷ envoy-opa", fontsize=9)
        ax.grid(axis="y", alpha=0.3)
    legend_below(figure, [Patch(facecolor=COLORS[t], edgecolor="black", label=arch(t)) for t in topologies]
                 + [Patch(facecolor="white", edgecolor="black", hatch="///", label="saturated under either engine")])
    return save(figure, figures_dir, "engines", load)


def bench_figure(bench: pd.DataFrame, figures_dir: Path) -> Path:
    """Each part's CPU as a multiple of its floor (log scale, 1× = the floor), its target marked."""
    rows = bench[bench["ratio"].notna()].iloc[::-1]
    figure, ax = plt.subplots(figsize=(8.5, 0.32 * len(rows) + 1.2))
    positions = np.arange(len(rows))
    ax.barh(positions, rows["ratio"], 0.7, color=[VERDICT_COLORS[v] for v in rows["verdict"].fillna("")], edgecolor="black", linewidth=0.5)
    targets = rows["target"]
    ax.scatter(targets, positions, marker="|", s=250, color="black", zorder=3)
    for position, value, target in zip(positions, rows["ratio"], targets):
        ax.annotate(f" {value:.2f}×", (max(value, 0 if pd.isna(target) else target), position), va="center", fontsize=7)
    ax.axvline(1, color="black", linewidth=1)
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}×"))
    ax.set_yticks(positions, rows["part"], fontsize=7)
    ax.set_xlabel("CPU per request ÷ its floor's (log scale)")
    ax.grid(axis="x", alpha=0.3, which="both")
    legend_below(figure, [Patch(facecolor=VERDICT_COLORS["met"], edgecolor="black", label="target met"),
                          Patch(facecolor=VERDICT_COLORS["NOT MET"], edgecolor="black", label="target NOT MET"),
                          Patch(facecolor=VERDICT_COLORS[""], edgecolor="black", label="no target"),
                          plt.Line2D([], [], marker="|", linestyle="", color="black", markersize=12, label="target")])
    return save(figure, figures_dir, "bench")


# ---- documents ------------------------------------------------------------------------

def markdown_table(frame: pd.DataFrame) -> str:
    header = "| " + " | ".join(str(c) for c in frame.columns) + " |"
    rule = "|" + "|".join("---" for _ in frame.columns) + "|"
    body = ["| " + " | ".join(str(v).replace("|", "\\|") for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join([header, rule, *body])


def inline_html(text: str) -> str:
    """Escape, then `code` and **bold**: the only markup the report's prose uses."""
    escaped = html.escape(text)
    escaped = re.sub(r"`([^`]+)`", r"<code>\1</code>", escaped)
    return re.sub(r"\*\*([^*]+)\*\*", r"<strong>\1</strong>", escaped)


def render_markdown(blocks: list[tuple], report_dir: Path) -> str:
    out = []
    for kind, *content in blocks:
        if kind in ("h1", "h2", "h3"):
            out.append(f"{'#' * int(kind[1])} {content[0]}")
        elif kind == "p":
            out.append(content[0])
        elif kind == "list":
            out.append("\n".join(f"- {item}" for item in content[0]))
        elif kind == "table":
            out.append(markdown_table(content[0]))
        elif kind == "figure":
            path, caption = content
            out.append(f"![{path.stem}]({path.relative_to(report_dir).as_posix()})\n\n*{caption}* (also as [SVG]({path.with_suffix('.svg').relative_to(report_dir).as_posix()}))")
    return "\n\n".join(out) + "\n"


HTML_STYLE = """
body { font-family: system-ui, sans-serif; max-width: 1200px; margin: 2em auto; padding: 0 1em; color: #222; line-height: 1.45; }
table { border-collapse: collapse; margin: 0.8em 0; font-size: 0.82em; }
th, td { border: 1px solid #ccc; padding: 2px 6px; text-align: right; white-space: nowrap; }
th { background: #f0f0f0; } td:first-child, th:first-child { text-align: left; }
figure { margin: 1em 0; } figure img { max-width: 100%; } figcaption { font-size: 0.9em; color: #444; }
code { background: #f4f4f4; padding: 0 3px; } h2 { border-bottom: 1px solid #ddd; margin-top: 1.6em; }
.scroll { overflow-x: auto; }
"""


def render_html(blocks: list[tuple], title: str) -> str:
    out = [f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>{html.escape(title)}</title><style>{HTML_STYLE}</style></head><body>"]
    for kind, *content in blocks:
        if kind in ("h1", "h2", "h3"):
            out.append(f"<{kind}>{inline_html(content[0])}</{kind}>")
        elif kind == "p":
            out.append(f"<p>{inline_html(content[0])}</p>")
        elif kind == "list":
            out.append("<ul>" + "".join(f"<li>{inline_html(item)}</li>" for item in content[0]) + "</ul>")
        elif kind == "table":
            out.append("<div class='scroll'>" + content[0].to_html(index=False, escape=True, border=0) + "</div>")
        elif kind == "figure":
            path, caption = content
            encoded = base64.b64encode(path.read_bytes()).decode()
            out.append(f"<figure><img alt='{html.escape(caption)}' src='data:image/png;base64,{encoded}'><figcaption>{inline_html(caption)}</figcaption></figure>")
    out.append("</body></html>")
    return "\n".join(out)


ENGINES_TEXT = (
    "envoy-opa: Envoy asks OPA over ext_authz before every hop (the paper's architecture: a decision asked for each routing step). "
    "compiled (envoy-compiled): at deployment OPA evaluates the same rule set over each enforcement point's finite decision space, and "
    "the hops it allowed become Envoy routes that need no call to OPA; anything else (denials, unknown or malformed labels, a body to "
    "check) still asks OPA."
)

def load_settings(run: Parameters) -> str:
    if run.load == "open":
        return f"at most {run.max_in_flight} requests in flight, a send more than {run.late_tolerance_ms:g} ms late is missed"
    return f"{run.user_rate:g} req/s per Locust user"


def spread_flagged(spread: pd.DataFrame) -> list[str]:
    flagged = spread[spread["cv_flagged"]]
    return [f"{case_name(r.topology, r.engine)} {r.rate} req/s {r.services} services ({percent(r.cv)})" for r in flagged.itertuples()]


LOAD_READING = {
    "open": "The load is an open loop: records are sent on a schedule whatever the answers, so a saturated cell's queue grows and its "
            "RTTs, measured from each record's intended send time, show it; beyond the in-flight cap sends are missed and counted.",
    "closed": "The load is a closed loop: a slow system receives fewer requests, so a saturated cell's RTTs belong to its achieved rate, "
              "shown beside the offered one below.",
}

METHOD = [
    "**Open loop** (the default, `--load open`). One Locust `FastHttpUser` walks a schedule of intended send times, constant gaps of "
    "1/rate or Poisson arrivals (exponential gaps, drawn from a seed per cell), and sends each record in a greenlet of its own at its "
    "time, whether or not earlier answers have come back, over up to `max_in_flight` connections. Each RTT is measured from the "
    "record's intended send time, not from when it actually left: otherwise a sender that fell behind (its process not scheduled, or "
    "busy with answers) would time only what it managed to send, late, and leave out the waiting the system caused (coordinated "
    "omission). The service time from the actual send is kept beside it. A send more than `late_tolerance_ms` late, or one that "
    "would exceed `max_in_flight` unanswered requests, is not made: it is recorded as missed, with its reason, so every scheduled "
    "request ends as an answer, an error or a counted miss. A request unanswered after 30 s fails (status 0). The achieved rate "
    "(sent in the window / its length) is set against the schedule's own count, so misses saturate a cell.",
    "**Closed loop** (`--load closed`). Locust runs as one process of `FastHttpUser`s; each user sends at most `user_rate` requests per second "
    "(`constant_throughput`, with a random phase so users do not fire together) and waits for each answer before its next request. "
    "users = offered rate / user_rate. While the RTT stays under 1/user_rate the offered rate is kept; beyond it the users send less: "
    "a slow system receives fewer requests. The offered rate is the target; the achieved rate is the number of requests sent in the "
    "measured window divided by its length. Unlike an open-loop load (and like the paper's JMeter threads), an overloaded cell "
    "therefore shows RTT ≈ users / achieved rate (Little's law) rather than an ever-growing queue.",
    f"**Engines.** {ENGINES_TEXT} Every enforcing topology is deployed under each engine of the run, one right after the other at the "
    "same rate and services; the baseline enforces nothing, has no engine, and is measured once per rate and services as the reference "
    "of both. Runs recorded before engines were run ran envoy-opa.",
    f"**Saturation.** A cell is saturated when it achieved less than {MIN_ACHIEVED_SHARE:.0%} of its offered rate or had more than "
    f"{MAX_ERROR_RATE:.0%} errors (a status other than the one its record should get), or, under the open loop, whose rate holds while "
    f"its queue grows, a p99 RTT beyond {P99_BOUND_MS:g} ms (the capacity search's bound). Saturated cases are marked {SATURATED_MARK} "
    "(any repetition saturated) and hatched in the box plots: their numbers describe an overloaded system at the achieved rate, not the "
    "system at the offered rate.",
    "**Warm-up and window.** t0 is a cell's first request. Requests sent before t0 + warm-up are left out; the window is the next "
    "`duration` seconds. Requests still in flight at the end are given up to 30 s to finish, so slow answers to requests sent in the "
    "window are not lost. Every request's send time, RTT and status is kept in raw/<cell>/requests.csv.gz, warm-up included. "
    "Before a cell's load, the priming load (when the run has one) ran on the same fresh deployment: its requests are in "
    "raw/<cell>/prime/, outside every statistic.",
    "**Statistics.** RTT statistics cover the delivered requests: records meant to go through the whole chain (all of them with the "
    "default mix) that got their 200. Quantiles are pandas' (linear interpolation between closest ranks), STD the sample standard "
    "deviation. Repetitions are pooled as in the paper (Table I); the median of each repetition and their coefficient of variation "
    "show the spread between repetitions. W Avg = mean over the service counts n run of (median RTT_n / n); with n = 5, 10, 25, 50 "
    "that is the paper's (RTT_5/5 + RTT_10/10 + RTT_25/25 + RTT_50/50)/4. With fewer service counts it is not comparable to the "
    "paper's value as such: the paper's column \"over our n\" recomputes it from the one legible row of Table I (CE at 100 req/s).",
    "**Time split.** Every instance reports t_in, t_out and t_back in the answer; with the client's send and receive times (same "
    "clock, one machine) each delivered request's RTT splits exactly into: in services (Σ t_out − t_in), forward (Σ next t_in − t_out), "
    "back (Σ t_back − the next one's answer time), entry (client → first service) and exit (first service → client). The baseline "
    "enforces nothing and its services call each other directly, so its time outside the services is transit (loopback, the entry's "
    "plain proxy, the client). For a topology, enforcement = its mean time outside the services − the baseline's at the same rate and "
    "services; transit = the baseline's. Means are used because they add up to the mean RTT. Gap-based, per hop: the median gap "
    "t_out → next t_in per gap, minus the baseline's. The timestamps are taken before the service's own work (t_in at the request "
    "hook) and when it sends on (t_out), so queueing in a service's event loop before its handler runs counts as outside it.",
    "**Cost of enforcement per hop.** (median RTT of the topology − median RTT of the baseline) / hops, at the same rate and services, "
    "both measured in this run; hops = services (the entry's hop and the n − 1 between services are each decided). Under saturation "
    "this mixes the decision cost with queueing, and should be read as such.",
]


def engines_blocks(comparison: pd.DataFrame, run: Parameters, figures_dir: Path) -> list[tuple]:
    """The compiled engine against envoy-opa: a figure of the ratios, then a short table per topology."""
    blocks: list[tuple] = [("h2", "Engines compared: compiled against envoy-opa")]
    if len(run.engines) < 2:
        return blocks + [("p", f"This run measured one engine, {ENGINE_NAMES[run.engines[0]]}: there is nothing to compare.")]
    if comparison.empty:
        return blocks + [("p", "No case of this run has finished under both engines yet.")]
    blocks.append(("p", "Per topology, at each rate and chain length run under both engines: the median RTT, the achieved rate and the "
                        "deployment's CPU per delivered record under envoy-opa and under the compiled engine, compiled ÷ envoy-opa, and the "
                        "baseline's (no enforcement: the floor both approach). Below 1× the compiled engine took less time or CPU; for "
                        f"the achieved rate, above 1× it carried more records. {SATURATED_MARK}: saturated. The sections below give every "
                        "figure per engine."))
    blocks.append(("figure", engines_figure(comparison, figures_dir, run.load_label),
                   "compiled ÷ envoy-opa per topology: median RTT, CPU per record, achieved rate; 1 = no difference; hatched: saturated under "
                   "either engine."))
    for topology, rows in comparison.groupby("topology", sort=False):
        blocks.append(("h3", arch(topology)))
        blocks.append(("table", engines_view(rows)))
    return blocks


def bench_blocks(run_dir: Path, meta: dict, figures_dir: Path) -> list[tuple]:
    """`make bench`'s table as the run measured it (raw/bench.csv); nothing for a run without one."""
    path = run_dir / "raw" / BENCH_CSV
    sessions = meta["sessions"]
    failures = [(number, s["bench"]["error"]) for number, s in enumerate(sessions, 1) if "error" in s.get("bench", {})]
    if not path.exists() and not failures:
        return []
    blocks: list[tuple] = [("h2", "What each part of a hop costs, beside its floor")]
    blocks.extend(("p", f"The bench failed in session {number}: {error.splitlines()[0]}") for number, error in failures)
    if not path.exists():
        return blocks
    bench = pd.read_csv(path, keep_default_na=False, na_values=[""])
    measured_by = next(((number, s) for number, s in enumerate(sessions, 1) if s.get("bench", {}).get("csv") == BENCH_CSV), None)
    earlier = [s["bench"]["csv"] for s in sessions if s.get("bench", {}).get("csv", BENCH_CSV) != BENCH_CSV]
    blocks.append(("p", "The CPU time one process spends per request, beside its floor: the least the same job costs, measured in the same "
                        "run on the same machine. Read the ratio, not the value: 1× is the floor itself, 1.3× means 30% more CPU than the "
                        "floor, 5× five times as much. This machine is slow and shared, so absolute values describe only it; the ratios are "
                        "what carries over to another machine. Target: the most a part may cost against its floor; verdict: whether this "
                        "run met it. How: before its cells, every session takes `make bench`'s measurement (experiments/bench.py): each "
                        "part and its floor run side by side on loopback, outside any deployment, and get the same sequential records in "
                        "turns; a part's figure is the CPU time its process used divided by the records, the median over the rounds."
                        + (f" Measured at the start of session {measured_by[0]} ({measured_by[1]['started_at']}): "
                           f"{measured_by[1]['bench']['rounds']} rounds of {measured_by[1]['bench']['records']} sequential records per part, "
                           f"{measured_by[1]['bench']['seconds']:.0f} s." if measured_by else "")
                        + (f" Earlier sessions' measurements: {', '.join(f'`raw/{name}`' for name in earlier)}." if earlier else "")))
    blocks.append(("table", bench_view(bench)))
    if bench["ratio"].notna().any():
        blocks.append(("figure", bench_figure(bench, figures_dir),
                       "Each part's CPU per request as a multiple of its floor's, log scale; the black tick is its target."))
    return blocks


def build(run_dir: Path) -> dict:
    """Write report/ (tables, figures, report.md, report.html) for a run; return their paths."""
    meta = json.loads((run_dir / "metadata.json").read_text())
    cells, requests, failed = stats.load_run(run_dir)
    report_dir = run_dir / "report"
    tables_dir, figures_dir = report_dir / "tables", report_dir / "figures"
    tables_dir.mkdir(parents=True, exist_ok=True)
    figures_dir.mkdir(parents=True, exist_ok=True)
    reference = load_paper_reference()
    recorded = meta["parameters"]
    run = Parameters.from_json(recorded)  # with what a run recorded before engines ran

    blocks: list[tuple] = [("h1", f"complyroute experiment {meta['run_id']}")]
    preset = PROFILES.get(run.profile, {})
    changed = [name for name, value in recorded.items() if name in preset and preset[name] != value]
    blocks.append(("p", f"Profile `{run.profile}`" + (f" (changed: {', '.join(changed)})" if changed else "") + f": topologies {', '.join(arch(t) for t in run.topologies)}; "
                        f"engines {', '.join(ENGINE_NAMES[e] for e in run.engines)} (the baseline has none); "
                        f"offered rates {', '.join(map(str, run.rates))} req/s; {', '.join(map(str, run.services))} services; "
                        f"{run.repetitions} repetition(s) of {run.duration} s after a {run.warmup} s warm-up"
                        + (f", each on a deployment primed by {run.prime} records at its rate (at least {PRIME_MIN_SECONDS} s); "
                           if run.prime else "; ")
                        + 
                        f"record mix `{run.mix}`; load: **{run.load_label}** ({load_settings(run)}). "
                        f"Raw data: `{run_dir / 'raw'}`; tables: `{tables_dir}`; figures: `{figures_dir}`."))
    blocks.extend(("p", paragraph) for paragraph in run_paragraphs(meta))
    expected = len(run.cells())
    bench = bench_blocks(run_dir, meta, figures_dir)
    if cells.empty:
        blocks.append(("p", f"No cell of this run has finished yet (0 of {expected}); {len(failed)} failed."))
        return write_documents(blocks + bench + changeability.blocks(run_dir, figures_dir), report_dir, meta)

    cells.to_csv(tables_dir / "cells.csv", index=False)
    table = stats.pooled(cells, requests)
    table.to_csv(tables_dir / "table1.csv", index=False)
    w_avg = stats.w_avg(table)
    comparison = w_avg_comparison(w_avg, reference)
    comparison.to_csv(tables_dir / "w_avg.csv", index=False)
    spread = stats.repetition_spread(cells)
    spread.to_csv(tables_dir / "repetitions.csv", index=False)
    cost = stats.enforcement_cost(table)
    cost.to_csv(tables_dir / "enforcement_cost.csv", index=False)
    split = stats.time_split(requests)
    split.to_csv(tables_dir / "time_split.csv", index=False)
    split = split.merge(table[[*stats.CASE, "saturated"]], on=stats.CASE, how="left")
    cpu = stats.cpu_per_record(cells)
    cpu.to_csv(tables_dir / "cpu_per_record.csv", index=False)
    engines = stats.engine_comparison(table, cpu)
    engines.to_csv(tables_dir / "engines.csv", index=False)

    machine, versions = meta["machine"], meta["versions"]
    saturated = cells[cells["saturated"]]
    blocks.append(("h2", "Read this first"))
    blocks.append(("list", [
        f"{len(cells)} of {expected} cells finished" + (f", {len(failed)} failed (listed at the end)" if failed else "") + ".",
        f"**{len(saturated)} of {len(cells)} cells are saturated** ({SATURATED_MARK}: below {MIN_ACHIEVED_SHARE:.0%} of the offered rate or over "
        f"{MAX_ERROR_RATE:.0%} errors). " + LOAD_READING[run.load],
        f"**{int(cells['missed'].sum())} of {int(cells['scheduled'].sum())} scheduled requests were missed** (not sent: the sender late "
        "beyond its tolerance, or the in-flight cap reached), counted per cell in \"Offered and achieved rate\"." if run.load == "open" else
        "Closed loop: no request is scheduled, so none is missed.",
        (f"**{int(spread['cv_flagged'].sum())} case(s) not saturated whose repetitions' medians vary by more than {MAX_REPETITION_CV:.0%}** "
         f"(coefficient of variation; \"Spread between repetitions\"): {', '.join(spread_flagged(spread))}." if spread["cv_flagged"].any() else
         f"No case that is not saturated has repetitions whose medians vary by more than {MAX_REPETITION_CV:.0%} (coefficient of variation)"
         + ("." if run.repetitions > 1 else "; with one repetition there is no spread to measure.")),
        f"**Engines.** Every figure names the engine it belongs to: \"CE (envoy-opa)\", \"CE (compiled)\"; the baseline has none. {ENGINES_TEXT} "
        + ("This run was recorded before engines were run: its topologies ran envoy-opa." if "engines" not in recorded else
           f"This run measured {' and '.join(ENGINE_NAMES[e] for e in run.engines)}."),
        (f"This machine has {machine['cores']} cores ({machine['cpu_model']}, {machine['memory_gib']} GiB), shared by Locust and every process "
         "of the deployment (services, Envoys, OPAs)" if (meta.get("target") or {}).get("target", "local") == "local" else
         f"Locust ran on this machine, {machine['cores']} cores ({machine['cpu_model']}, {machine['memory_gib']} GiB); the deployment's pods "
         f"on the cluster's nodes ({', '.join(meta['target']['deploys_to'])}), whose cores this report does not know")
        + ": the paper ran on 4 nodes of 48 to 56 hardware threads, with the load from 5 other "
        "machines. Absolute numbers are not comparable with the paper's; the ranking of the architectures and the trends are what to compare.",
        "CPU columns: cores kept busy in the window by the whole machine, by Locust, by the deployment, and by anything else (\"other\": other "
        "users of a shared machine disturb a cell when this is high).",
    ]))
    blocks.extend(engines_blocks(engines, run, figures_dir))

    blocks.append(("h2", "Offered and achieved rate"))
    blocks.append(("table", load_view(cells)))
    blocks.append(("figure", load_figure(cells, figures_dir, run.load_label), "Achieved rate (mean over repetitions) against the offered rate, per topology and engine."))

    blocks.append(("h2", "Table I: RTT statistics (repetitions pooled)"))
    blocks.append(("p", f"In the paper's layout, in ms, a topology under each engine as an architecture of its own, under {run.load_label}"
                        + (" (RTT from each record's intended send time)" if run.load == "open" else "") + f". {SATURATED_MARK}: saturated "
                        "case. p99, the request counts and the load are in `tables/table1.csv`."))
    blocks.append(("table", table_one(table, w_avg)))
    blocks.append(("figure", box_figure(table, requests, figures_dir, run.load_label),
                   f"RTT distributions (as the paper's Fig. 2): boxes Q1–Q3 with the median, whiskers to 1.5 IQR, at most {MAX_FLIERS} outliers "
                   "drawn per box (chosen at random); a topology's colour, lighter under the compiled engine; hatched: saturated."))

    blocks.append(("h2", "W Avg: ours and the paper's"))
    blocks.append(("p", "The paper measured one engine, and its architecture is envoy-opa's (a decision asked for every hop): its values "
                        "stand beside both of ours, the envoy-opa row being the one to compare with it."))
    blocks.append(("table", w_avg_view(comparison)))
    blocks.append(("figure", w_avg_figure(comparison, figures_dir, run.load_label),
                   "W Avg per architecture, engine and offered rate: ours (filled; lighter: compiled) beside the paper's published value "
                   "(dotted; from experiments/paper_reference.json, citing ../shared/reference/). Log scale."))
    blocks.append(("p", "The paper's W Avg averages over 5, 10, 25 and 50 services and its testbed had about 50 times the cores; ours averages "
                        "over the service counts this run has. Compare the order of the architectures and how W Avg grows with the rate."))

    if run.mix != "allowed":
        kinds = stats.records(requests)
        kinds.to_csv(tables_dir / "records.csv", index=False)
        blocks.append(("h2", f"Records of the mix `{run.mix}`"))
        blocks.append(("p", "Table I and the figures time only the records meant for the whole chain. Here every kind of record, "
                            "the status it should get (the baseline lets every record through) and the status it got, repetitions pooled."))
        blocks.append(("table", pd.DataFrame({
            "Arch.": names(kinds), "Rate (req/s)": kinds["rate"], "Serv.": kinds["services"], "Record": kinds["record"],
            "Expected": kinds["expected"], "Status": kinds["status"], "Requests": kinds["requests"], "Median RTT (ms)": kinds["median"].map(ms),
        })))

    blocks.append(("h2", "Spread between repetitions"))
    blocks.append(("p", f"The median RTT of each repetition and their coefficient of variation (standard deviation / mean), for the cases "
                        f"that are not saturated; above {MAX_REPETITION_CV:.0%} a case is flagged \"{CV_FLAG}\": its repetitions disagree "
                        "more than its pooled median shows. A saturated case's medians measure how far its queue grew and get no CV."))
    blocks.append(("table", spread_view(spread)))

    blocks.append(("h2", "Baseline and the cost of enforcement per hop"))
    if cost.empty:
        blocks.append(("p", "This run has no baseline (or no case the baseline shares with a topology), so the cost of enforcement is not computed."))
    else:
        baseline_rows = table[table["topology"] == BASELINE]
        blocks.append(("p", "Baseline (no enforcement: a plain Envoy entry, services calling each other directly; the reference of both "
                            "engines), median RTT: "
                            + "; ".join(f"{r.rate} req/s, {r.services} services: {marked(f'{ms(r.median)} ms', r.saturated)}"
                                        for r in baseline_rows.itertuples()) + "."))
        blocks.append(("table", cost_view(cost)))
        blocks.append(("figure", cost_figure(cost, figures_dir, run.load_label),
                       "(median RTT − the baseline's median RTT) / hops, same rate and services, same run; lighter: compiled engine."))

    blocks.append(("h2", "Where the time goes"))
    if split["transit_ms"].isna().all():
        blocks.append(("p", "Without a baseline in the run, time outside the services cannot be told apart into transit and enforcement; "
                            "the figure shows it all as transit."))
    blocks.append(("table", split_view(split)))
    blocks.append(("figure", split_figure(split, figures_dir, run.load_label),
                   "Mean time per delivered request: inside the services, transit (the baseline's time outside its services) and enforcement "
                   "(the topology's time outside its services beyond the baseline's); negative enforcement (noise) is drawn as 0."))

    blocks.append(("h2", "CPU per record: what enforcement costs in capacity"))
    blocks.append(("p", "The deployment's CPU time per delivered record: the cores its processes kept busy in the window divided by the "
                        "achieved rate (mean over repetitions), split by kind of process. Unlike the RTT it hardly depends on queueing, "
                        "so saturated cases compare too: 1000 ms divided by it is how many records per second one core carries. "
                        "Enforcement CPU per hop: (CPU per record − the baseline's, same rate and services) / hops."
                        + (" This run was recorded before cpu.csv split the CPU by kind of process: only the totals are known."
                           if cpu["service_ms"].isna().all() else "")))
    blocks.append(("table", cpu_view(cpu)))
    if not cpu["service_ms"].isna().all():
        blocks.append(("figure", cpu_figure(cpu, figures_dir, run.load_label),
                       "CPU time per delivered record by kind of process: the services, the Envoys (entry, sidecars, routers or the "
                       "central entity) and the OPAs."))

    blocks.extend(bench)

    if failed:
        blocks.append(("h2", "Failed cells"))
        rows = []
        for record in failed:
            cell = stats.identity(record["cell"])
            rows.append({"Cell": f"{case_name(cell['topology'], cell['engine'])} {cell['rate']} req/s {cell['services']} services rep {cell['repetition']}",
                         "Error": record["error"].splitlines()[0], "At": record["at"]})
        blocks.append(("table", pd.DataFrame(rows)))

    blocks.extend(changeability.blocks(run_dir, figures_dir))
    blocks.append(("h2", "Method"))
    blocks.extend(("p", paragraph) for paragraph in METHOD)
    blocks.append(("h2", "Machine and versions"))
    sessions = meta["sessions"]
    blocks.append(("list", [
        f"Commit {meta['git']['commit']} ({meta['git']['branch']}) at the run's start, "
        f"{ {True: 'with uncommitted changes', False: 'no uncommitted changes'}.get(meta['git'].get('dirty'), 'uncommitted changes not recorded') }.",
        f"Envoy {versions['envoy']}, OPA {versions['opa']}, Node.js {versions['node']}, Locust {versions['locust']}, Python {versions['python']}, "
        f"pandas {versions['pandas']}, matplotlib {versions['matplotlib']}.",
        f"{machine['cores']} cores, {machine['cpu_model']}, {machine['memory_gib']} GiB memory, {machine['os']}; load average at start "
        f"{', '.join(map(str, machine['load_average_at_start']))}.",
        f"{len(sessions)} session(s): " + "; ".join(f"{s['started_at']} to {s.get('ended_at', '?')} ({s.get('outcome', 'running or killed')}, "
                                                    f"{s.get('cells_run', '?')} cells)" for s in sessions) + ".",
    ]))
    return write_documents(blocks, report_dir, meta)


def write_documents(blocks: list[tuple], report_dir: Path, meta: dict) -> dict:
    report_dir.mkdir(parents=True, exist_ok=True)
    markdown = report_dir / "report.md"
    page = report_dir / "report.html"
    markdown.write_text(render_markdown(blocks, report_dir))
    page.write_text(render_html(blocks, f"complyroute experiment {meta['run_id']}"))
    return {"markdown": markdown, "html": page}
