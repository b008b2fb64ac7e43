"""A run report's figures (report/figures/*.png, .svg): the RTT box plots like the paper's
Fig. 2, W Avg beside the paper's, the cost of enforcement per hop, where the time goes, the CPU
per record, offered against achieved rate, the engines compared, the bench's ratios, the RTT's
percentile curves and where a record's time goes hop by hop."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib import cbook  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402
from matplotlib.ticker import FuncFormatter  # noqa: E402

from experiments.analysis import stats  # noqa: E402
from experiments.analysis.stats import HOP_COLUMNS  # noqa: E402
from experiments.design.matrix import ENGINE_NAMES, MIN_ACHIEVED_SHARE, TOPOLOGIES, case_name  # noqa: E402
from experiments.report.reporting import (COLORS, SATURATED_EDGE, SATURATED_MARK, SATURATED_PATCH, arch, color, grouped_bars, hatch,  # noqa: E402
                                          legend_below, line_legend, line_style, log_scale, mark_saturated, marked, marker, panels, save,
                                          series_legend, series_of)


# Okabe and Ito's colours, as the topologies' (reporting.PALETTE).
VERDICT_COLORS = {"met": "#009E73", "NOT MET": "#D55E00", "": "#999999"}

SPLIT_COLORS = {"in services": "#0072B2", "transit": "#BBBBBB", "enforcement": "#D55E00", "sender late": "#CC79A7"}

CPU_COLORS = {"service": "#0072B2", "envoy": "#009E73", "opa": "#D55E00"}

CPU_LABELS = {"service": "services", "envoy": "Envoy", "opa": "OPA"}

# Outliers drawn per box at most: tens of thousands of points per box make unreadable,
# heavy figures; the whiskers and the tables keep the extremes.
MAX_FLIERS = 200


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
                    patch.set_hatch(hatch(engine))
                    if (topology, engine, rate, n) in saturated_cases:
                        patch.set(**SATURATED_EDGE)
                        mark_saturated(ax, s_index + (p_index - (len(pairs) - 1) / 2) * width)
        positive = timed[timed["rate"] == rate]["rtt_ms"]
        positive = positive[positive > 0]
        if len(positive) and positive.max() / positive.min() > 100:
            log_scale(ax)
        ax.set_xticks(range(len(services)), [f"{n} services" for n in services])
        ax.set_xlim(-0.5, len(services) - 0.5)  # every panel alike, whichever of its cases finished
        ax.set_ylabel("RTT (ms)")
        ax.set_title(f"{rate} requests/s (offered)")
        ax.grid(axis="y", alpha=0.3, which="both")
    legend_below(figure, series_legend(pairs, [SATURATED_PATCH]))
    return save(figure, figures_dir, "rtt_boxplots", load)


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
                ax.bar(position, row.w_avg, 0.9, color=color(topology, row.engine), edgecolor="black", linewidth=0.5, hatch=hatch(row.engine))
                ax.annotate(f"{row.w_avg:.1f}{SATURATED_MARK if row.any_saturated else ''}", (position, row.w_avg), ha="center", va="bottom", fontsize=7)
                position += 1
            paper = rows[rows["topology"] == topology]["paper_w_avg"].dropna()
            if len(paper):
                ax.bar(position, paper.iloc[0], 0.9, color="white", edgecolor=COLORS[topology], hatch="xx", linewidth=1.2)
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
    legend_below(figure, series_legend(pairs, [Patch(facecolor="white", edgecolor="black", hatch="xx", label="paper (its architecture = envoy-opa)")]))
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
        for bar, key in zip(list(ax.patches), [(t, e, n) for t, e in pairs for n in services]):
            if key in saturated:
                bar.set(**SATURATED_EDGE)
                mark_saturated(ax, bar.get_x() + bar.get_width() / 2, max(bar.get_height(), 0))
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
                x = c_index + (index - (len(topologies) - 1) / 2) * width
                saturated = row["saturated_opa"] or row["saturated_compiled"]
                ax.bar(x, row[f"{measure}_ratio"], width * 0.95, color=COLORS[topology],
                       **(SATURATED_EDGE if saturated else {"edgecolor": "black", "linewidth": 0.5}))
                if saturated:
                    mark_saturated(ax, x, row[f"{measure}_ratio"])
        ax.axhline(1, color="black", linewidth=1)
        ax.set_xticks(range(len(cases)), [f"{r} req/s\n{n} serv." for r, n in cases], fontsize=7)
        ax.set_title(f"{label}: compiled ÷ envoy-opa", fontsize=9)
        ax.grid(axis="y", alpha=0.3)
    legend_below(figure, [Patch(facecolor=COLORS[t], edgecolor="black", label=arch(t)) for t in topologies]
                 + [Patch(facecolor="white", label=f"{SATURATED_MARK} saturated under either engine", **SATURATED_EDGE)])
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


# The percentiles of the RTT curves: the median to one request in a thousand.
CURVE_PERCENTILES = (50, 75, 90, 95, 99, 99.9)


def nines(percentile: float) -> float:
    """A percentile's place on the curves' x axis: -log10 of the share beyond it (p50 0.3, p90 1, p99 2, p99.9 3)."""
    return -np.log10(1 - percentile / 100)


def percentile_figure(table: pd.DataFrame, requests: pd.DataFrame, figures_dir: Path, load: str) -> Path:
    """RTT percentile curves, p50 to p99.9 on a log scale, one panel per rate and chain length, a
    line per topology and engine (colour: topology; marker and line style: engine); a saturated
    case's line thin and ending in the saturated mark."""
    timed = stats.delivered(requests)
    curves = timed.groupby(stats.CASE, observed=True)["rtt_ms"].quantile([p / 100 for p in CURVE_PERCENTILES]).unstack()
    saturated_cases = {(r.topology, r.engine, r.rate, r.services) for r in table.itertuples() if r.saturated}
    cells = sorted(set(zip(table["rate"], table["services"])))
    pairs = series_of(table)
    figure, axes = panels(len(cells), 5.2, 3.6, sharey=True)
    x = [nines(p) for p in CURVE_PERCENTILES]
    for ax, (rate, services) in zip(axes, cells):
        for topology, engine in pairs:
            key = (topology, engine, rate, services)
            if key not in curves.index:
                continue
            saturated = key in saturated_cases
            ax.plot(x, curves.loc[key].to_numpy(), color=COLORS[topology], marker=marker(engine), linestyle=line_style(engine),
                    linewidth=0.9 if saturated else 1.6, markersize=4, alpha=0.75 if saturated else 1)
            if saturated:
                mark_saturated(ax, x[-1], curves.loc[key].iloc[-1])
        ax.set_xticks(x, [f"p{p:g}" for p in CURVE_PERCENTILES], fontsize=8)
        log_scale(ax)
        ax.set_title(f"{rate} req/s, {services} services", fontsize=10)
        ax.set_ylabel("RTT (ms)")
        ax.grid(alpha=0.3, which="both")
    legend_below(figure, line_legend(pairs, [plt.Line2D([], [], color="#B00000", marker=f"${SATURATED_MARK}$", linestyle="", label="saturated")]))
    return save(figure, figures_dir, "rtt_percentiles", load)


HOP_COLORS = {"in_ms": "#56B4E9", "service_ms": "#0072B2", "out_ms": "#E69F00"}
HOP_LABELS = {"in_ms": "reaching the hop", "service_ms": "inside the service", "out_ms": "the answer back"}
LATE_COLOR = "#CC79A7"


def hop_figure(hops: pd.DataFrame, table: pd.DataFrame, figures_dir: Path, load: str) -> Path:
    """Where a record's time goes, hop by hop: per rate and chain length, a horizontal bar per
    topology and engine, the sender's lateness then each hop's in, service and out times in turn,
    as shares of the mean RTT (means add up to it; shares keep a saturated case's seconds from
    flattening the others' milliseconds), the mean RTT written at the end; hops parted by white
    lines and numbered."""
    saturated_cases = {(r.topology, r.engine, r.rate, r.services) for r in table.itertuples() if r.saturated}
    cells = sorted(set(zip(hops["rate"], hops["services"])))
    pairs = series_of(hops)
    figure, axes = panels(len(cells), 6.4, 0.42 * len(pairs) + 1.4, columns=1 if len(cells) < 2 else 2)
    for ax, (rate, services) in zip(axes, cells):
        rows = hops[(hops["rate"] == rate) & (hops["services"] == services)]
        labels = []
        for position, (topology, engine) in enumerate(pairs):
            case = rows[(rows["topology"] == topology) & (rows["engine"] == engine)].sort_values("hop")
            labels.append(marked(case_name(topology, engine), (topology, engine, rate, services) in saturated_cases))
            if case.empty:
                continue
            rtt = float(case["rtt_ms"].iloc[0])
            left = max(0.0, float(case["send_lag_ms"].iloc[0])) / rtt * 100
            ax.barh(position, left, 0.7, color=LATE_COLOR, edgecolor="none")
            for hop in case.itertuples():
                start = left
                for column in HOP_COLUMNS:
                    width = max(0.0, getattr(hop, column)) / rtt * 100
                    ax.barh(position, width, 0.7, left=left, color=HOP_COLORS[column], edgecolor="none")
                    left += width
                ax.plot([left, left], [position - 0.35, position + 0.35], color="white", linewidth=1.2)
                if len(case) <= 12 and left - start > 3:
                    ax.text((start + left) / 2, position, str(hop.hop), ha="center", va="center", fontsize=6, color="black")
            ax.text(101, position, f"{rtt:,.0f} ms" if rtt >= 100 else f"{rtt:.3g} ms", va="center", fontsize=7)
        ax.set_yticks(range(len(pairs)), labels, fontsize=7)
        ax.invert_yaxis()
        ax.set_xlim(0, 118)
        ax.set_xticks(range(0, 101, 25))
        ax.set_title(f"{rate} req/s, {services} services", fontsize=10)
        ax.set_xlabel("share of the mean RTT (%); at the end: the mean RTT")
        ax.grid(axis="x", alpha=0.3)
    legend_below(figure, [Patch(facecolor=LATE_COLOR, label="sender late")]
                 + [Patch(facecolor=HOP_COLORS[c], label=HOP_LABELS[c]) for c in HOP_COLUMNS])
    return save(figure, figures_dir, "hops", load)
