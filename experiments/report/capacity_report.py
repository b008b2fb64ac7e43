"""A capacity run's report: report/capacity.md and capacity.html (self-contained), the
capacity table (report/tables/capacity.csv) and the latency-against-offered-rate figure
(report/figures/capacity_latency.png, .svg), built from metadata.json and raw/steps.csv alone (and
raw/closing-steps.csv, the baseline searched again at the end, where the run has one)."""

from __future__ import annotations

import json
import shutil
from datetime import datetime
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.lines import Line2D
from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, NullFormatter

from experiments.analysis import stats
from experiments.design.capacity import CLOSING_STEPS_CSV, KEPT_CAPACITY, STEPS_CSV, as_bool, result_of_steps
from experiments.design.matrix import BASELINE, ENGINE_NAMES, MAX_ERROR_RATE, MIN_ACHIEVED_SHARE, PAPER_NAMES, PRIME_SHARE, case_name, load_label
from experiments.design.targets import run_paragraphs
from experiments.report.reporting import color, panels, render_html, render_markdown, save, series_of

DOUBLINGS = [25 * 2**k for k in range(6)] + [2000]  # 25 .. 800 req/s, and the default max
CAPACITY_COLUMNS = ("topology", "engine", "services", "capacity", "capped", "lowest_failed", "converged", "baseline_capacity",
                    "share_of_baseline", "first_failed", "first_failed_why", "first_failed_other_cores", "steps")


def read_steps(run_dir: Path, name: str = STEPS_CSV) -> pd.DataFrame:
    steps = pd.read_csv(run_dir / "raw" / name, dtype={"engine": str, "why_not": str})
    steps["why_not"] = steps["why_not"].fillna("")
    steps["held"] = steps["held"].map(as_bool)
    return steps


def capacity_of_runs(run_dirs: list[Path]) -> pd.DataFrame:
    """Every search of capacity runs, one row each (capacity_table's), with the run it is of."""
    tables = []
    for run_dir in run_dirs:
        if not (run_dir / "raw" / STEPS_CSV).exists():
            raise FileNotFoundError(f"{run_dir} is not a capacity run with steps (no raw/{STEPS_CSV})")
        gap = json.loads((run_dir / "metadata.json").read_text())["parameters"]["gap"]
        tables.append(capacity_table(read_steps(run_dir), gap).assign(run=run_dir.name))
    return pd.concat(tables, ignore_index=True)


def keep_capacity(run_dir: Path, capacity_dirs: list[Path]) -> None:
    """Make these capacity runs the ones the run's report reads (replacing any it kept before),
    copied into its raw/capacity/<name>/; a folder that is not a capacity run is refused
    (FileNotFoundError) before anything changes."""
    capacity_of_runs(capacity_dirs)
    kept = run_dir / KEPT_CAPACITY
    shutil.rmtree(kept, ignore_errors=True)
    for capacity_dir in capacity_dirs:
        (kept / capacity_dir.name / "raw").mkdir(parents=True)
        shutil.copy2(capacity_dir / "metadata.json", kept / capacity_dir.name / "metadata.json")
        shutil.copy2(capacity_dir / "raw" / STEPS_CSV, kept / capacity_dir.name / "raw" / STEPS_CSV)


def kept_capacity(run_dir: Path) -> pd.DataFrame | None:
    """The searches of the capacity runs the run keeps (capacity_of_runs), or None if it keeps none."""
    kept = sorted(path.parent.parent for path in (run_dir / KEPT_CAPACITY).glob(f"*/raw/{STEPS_CSV}"))
    return capacity_of_runs(kept) if kept else None


def capacity_table(steps: pd.DataFrame, gap: float) -> pd.DataFrame:
    """One row per search: its capacity (the highest rate held), whether every step held (capped),
    the bracket's top, the baseline's capacity at the same chain length and the share of it,
    and the first failed step with why it failed."""
    rows = []
    for (topology, engine, services), group in steps.groupby(["topology", "engine", "services"], sort=False):
        result = result_of_steps(group.to_dict("records"))
        first = group[group["offered_rate"] == result.first_failed].sort_values("step").head(1)  # its first step
        other = pd.to_numeric(first["cpu_machine"], errors="coerce") - pd.to_numeric(first["cpu_locust"], errors="coerce") \
            - pd.to_numeric(first["cpu_deployment"], errors="coerce")
        rows.append({
            "topology": topology, "engine": engine, "services": int(services), "capacity": result.capacity, "capped": result.capped,
            "lowest_failed": result.lowest_failed,
            "converged": result.capped or (result.capacity is not None and result.lowest_failed is not None
                                           and result.lowest_failed - result.capacity <= max(1, gap * result.capacity)),
            "first_failed": int(first["offered_rate"].iloc[0]) if len(first) else None,
            "first_failed_why": first["why_not"].iloc[0] if len(first) else "",
            "first_failed_other_cores": round(float(other.iloc[0]), 2) if len(first) and not pd.isna(other.iloc[0]) else None,
            "steps": len(group),
        })
    table = pd.DataFrame(rows, columns=[c for c in CAPACITY_COLUMNS if c not in ("baseline_capacity", "share_of_baseline")])
    for column in ("capacity", "lowest_failed", "first_failed"):  # whole rates, or none
        table[column] = table[column].astype("Int64")
    baseline = {row.services: row.capacity for row in table.itertuples() if row.topology == BASELINE}
    table["baseline_capacity"] = table["services"].map(baseline).astype("Int64")
    table["share_of_baseline"] = [  # none while the baseline has no capacity (not searched yet, or nothing held)
        float(row.capacity / row.baseline_capacity) if pd.notna(row.capacity) and pd.notna(row.baseline_capacity)
        and row.baseline_capacity > 0 else None for row in table.itertuples()]
    return stats.order(table[list(CAPACITY_COLUMNS)], by=["services", "topology", "engine"])


def capacity_view(table: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    lowest = steps.groupby(["topology", "engine", "services"])["offered_rate"].min()

    def capacity_cell(row) -> str:
        if pd.isna(row.capacity):
            return f"< {int(lowest[(row.topology, row.engine, row.services)])}"
        value = f"{int(row.capacity)}"
        if row.capped:
            return f"≥ {value}"
        return value if row.converged else f"{value} (bracket {int(row.capacity)}–{int(row.lowest_failed)} not within the gap)"

    def share(row) -> str:
        if row.topology == BASELINE:
            return "reference"
        if row.share_of_baseline is None or pd.isna(row.share_of_baseline):
            return "–"
        capped_baseline = bool(table[(table["topology"] == BASELINE) & (table["services"] == row.services)]["capped"].any())
        return ("≤ " if capped_baseline and not row.capped else "") + f"{row.share_of_baseline:.0%}"

    def limited(row) -> str:
        if pd.isna(row.first_failed):
            return f"no step failed, up to {int(row.capacity)} req/s" if not pd.isna(row.capacity) else "no step"
        other = "" if pd.isna(row.first_failed_other_cores) else f" (other processes: {row.first_failed_other_cores:.2f} cores)"
        return f"at {int(row.first_failed)} req/s: {row.first_failed_why}{other}"

    return pd.DataFrame({
        "topology": table["topology"].map(lambda t: PAPER_NAMES.get(t, t)),
        "engine": table["engine"].map(lambda e: ENGINE_NAMES.get(e, e)),
        "services": table["services"],
        "capacity (req/s)": [capacity_cell(row) for row in table.itertuples()],
        "lowest failed (req/s)": table["lowest_failed"].map(lambda v: "–" if pd.isna(v) else str(int(v))),
        "of the baseline's": [share(row) for row in table.itertuples()],
        "limited by (first failed step)": [limited(row) for row in table.itertuples()],
        "steps": table["steps"],
    })


def baseline_drift(steps: pd.DataFrame, closing: pd.DataFrame, gap: float) -> pd.DataFrame:
    """Per chain length whose baseline was searched twice: its capacity searched first and
    searched again after the enforcing topologies, the minutes between their first steps, and the
    change (closing / first - 1; none where either held nothing or both every step)."""
    baseline = steps[steps["topology"] == BASELINE]
    first = capacity_table(baseline, gap).set_index("services")
    again = capacity_table(closing, gap).set_index("services")

    def started(frame: pd.DataFrame, services: int) -> datetime:
        return datetime.strptime(frame[frame["services"] == services].sort_values("step")["started_at"].iloc[0], "%Y-%m-%dT%H:%M:%S%z")

    rows = []
    for services in again.index:
        if services not in first.index:
            continue
        before, after = first.loc[services], again.loc[services]
        comparable = pd.notna(before.capacity) and pd.notna(after.capacity) and not (before.capped and after.capped)
        rows.append({"services": int(services), "first": before.capacity, "closing": after.capacity,
                     "minutes_between": round((started(closing, services) - started(baseline, services)).total_seconds() / 60, 1),
                     "change": float(after.capacity / before.capacity - 1) if comparable else None})
    return pd.DataFrame(rows, columns=["services", "first", "closing", "minutes_between", "change"])


def drift_paragraphs(drift: pd.DataFrame, gap: float) -> list[str]:
    """What the baseline's two searches say of the machine under the run, per chain length."""
    paragraphs = []
    for row in drift.itertuples():
        said = (f"At {row.services} services the baseline held {capacity_said(row.first)} req/s searched first, and "
                f"{capacity_said(row.closing)} searched again {row.minutes_between:g} min later, after the enforcing topologies")
        if row.change is None or pd.isna(row.change):
            paragraphs.append(f"{said}: not comparable (a search that held no rate, or two that held every one).")
        elif abs(row.change) <= gap:
            paragraphs.append(f"{said} ({row.change:+.0%}): within the search's resolution ({gap:.0%}), so the machine held its speed "
                              "over the run as far as a search can tell.")
        else:
            paragraphs.append(f"{said} ({row.change:+.0%}): beyond the search's resolution ({gap:.0%}). The machine's speed changed "
                              "under the run by about as much (a shared machine), and each share above, against the first search, "
                              "carries that doubt: a topology searched late met the closing machine more than the first.")
    return paragraphs


def capacity_said(capacity) -> str:
    return "no rate" if capacity is None or pd.isna(capacity) else str(int(capacity))


def steps_view(steps: pd.DataFrame) -> pd.DataFrame:
    def number(value, digits=0):
        return "–" if pd.isna(value) or value == "" else f"{float(value):.{digits}f}"

    return pd.DataFrame({
        "case": [case_name(t, None if e == stats.NO_ENGINE else e) for t, e in zip(steps["topology"], steps["engine"])],
        "services": steps["services"], "step": steps["step"], "offered": steps["offered_rate"],
        "achieved": [f"{a:.1f} ({s:.1%})" for a, s in zip(steps["achieved_rate"], steps["achieved_share"])],
        "errors": steps["errors"], "missed": steps["missed"], "errors+missed": steps["loss_share"].map(lambda v: f"{v:.1%}"),
        "p50 (ms)": steps["p50_ms"].map(number), "p95 (ms)": steps["p95_ms"].map(number), "p99 (ms)": steps["p99_ms"].map(number),
        "cores busy": steps["cpu_machine"].map(lambda v: number(v, 2)),
        "deployment": steps["cpu_deployment"].map(lambda v: number(v, 2)),
        "others": (pd.to_numeric(steps["cpu_machine"], errors="coerce") - pd.to_numeric(steps["cpu_locust"], errors="coerce")
                   - pd.to_numeric(steps["cpu_deployment"], errors="coerce")).map(lambda v: number(v, 2)),
        "held": ["yes" if held else f"no: {why}" for held, why in zip(steps["held"], steps["why_not"])],
    })


def latency_figure(steps: pd.DataFrame, bound_ms: float, figures_dir: Path, load: str) -> Path:
    """The knee: p50 (solid) and p99 (dashed) RTT against the offered rate, a line per topology
    and engine, one panel per chain length; a failed step's points hollow; the p99 bound dotted."""
    services = sorted(steps["services"].unique())
    figure, axes = panels(len(services), 6.4, 4.2)
    pairs = series_of(steps)
    for ax, count in zip(axes, services):
        panel = steps[steps["services"] == count]
        for topology, engine in pairs:
            line = panel[(panel["topology"] == topology) & (panel["engine"] == engine)].sort_values("offered_rate")
            if line.empty:
                continue
            shade = color(topology, engine)
            for column, style in (("p50_ms", "-"), ("p99_ms", "--")):
                values = pd.to_numeric(line[column], errors="coerce")
                ax.plot(line["offered_rate"], values, style, color=shade, linewidth=1.3)
                for held, marker_face in ((True, shade), (False, "white")):
                    chosen = line["held"] == held
                    ax.plot(line["offered_rate"][chosen], values[chosen], "o" if column == "p50_ms" else "s", color=shade,
                            markerfacecolor=marker_face, markersize=4.5, linestyle="none")
        ax.axhline(bound_ms, color="black", linestyle=":", linewidth=1)
        # Log axes with a few plain labels: the doubling's rates along x, decades and their 2s and 5s up y.
        ax.set_xscale("log")
        tried = sorted(panel["offered_rate"].unique())
        ax.xaxis.set_major_locator(FixedLocator([r for r in DOUBLINGS if tried[0] <= r <= tried[-1]] or tried))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1, 2, 5)))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("offered rate (req/s)")
        ax.set_ylabel("RTT (ms) from the intended send time")
        ax.set_title(f"{count} services")
        ax.grid(True, which="major", alpha=0.3)
    handles = [Line2D([], [], color=color(t, e), linewidth=2, label=case_name(t, None if e == stats.NO_ENGINE else e)) for t, e in pairs]
    handles += [Line2D([], [], color="black", linestyle="-", marker="o", label="p50"),
                Line2D([], [], color="black", linestyle="--", marker="s", label="p99"),
                Line2D([], [], color="black", linestyle="none", marker="o", markerfacecolor="white", label="step not held"),
                Line2D([], [], color="black", linestyle=":", label=f"p99 bound {bound_ms:g} ms")]
    rows = -(-len(handles) // 4)
    figure.tight_layout(rect=(0, 0.04 + 0.045 * rows, 1, 1))
    figure.legend(handles=handles, loc="lower center", ncol=4, fontsize=8, frameon=False)
    return save(figure, figures_dir, "capacity_latency", load)


def priming(parameters: dict) -> str:
    """What came before a search's first step (runs before the priming load had none)."""
    if not parameters.get("prime", False):
        return "No priming load: a search's first step was the fresh deployment's first load. "
    return (f"Before its first step each search ran one step's load at {PRIME_SHARE:.0%} of the start rate, not judged (a fresh "
            "deployment's first seconds are slower whatever the rate). ")


def deployed(parameters: dict) -> str:
    """What the run changed of the manifests: replicas of every step, the services' work (runs recorded before: nothing)."""
    replicas, work = parameters.get("replicas", 1), parameters.get("work_iterations")
    return (f", {replicas} instances of every step" if replicas != 1 else "") + (f", {work} work iterations per record" if work is not None else "")


def build(run_dir: Path) -> dict:
    """Write report/ of a capacity run; return the paths of capacity.md and capacity.html."""
    meta = json.loads((run_dir / "metadata.json").read_text())
    parameters = meta["parameters"]
    report_dir = run_dir / "report"
    tables_dir, figures_dir = report_dir / "tables", report_dir / "figures"
    tables_dir.mkdir(parents=True, exist_ok=True)
    figures_dir.mkdir(parents=True, exist_ok=True)
    load = load_label("open", "constant")
    title = f"complyroute capacity {meta['run_id']}"
    bound = parameters["p99_bound_ms"]
    blocks: list[tuple] = [("h1", title)]
    blocks.append(("p", f"The highest offered rate each topology holds, per engine and chain length: topologies "
                        f"{', '.join(case_name(t, None) for t in parameters['topologies'])} (the baseline always, the reference); engines "
                        f"{', '.join(parameters['engines'])}; {', '.join(map(str, parameters['services']))} services"
                        f"{deployed(parameters)}. One deployment per "
                        f"search; the rate starts at {parameters['start_rate']} req/s and doubles while steps hold, up to "
                        f"{parameters['max_rate']} req/s, then bisects between the highest rate held and the lowest that failed until "
                        f"they are within {parameters['gap']:.0%} (at most {parameters.get('max_steps', 16)} steps). {priming(parameters)}"
                        f"Each step: {parameters['step_warmup']} s of warm-up and "
                        f"{parameters['step_seconds']} s measured, {load} (at most {parameters['max_in_flight']} requests in flight, a "
                        f"send more than {parameters['late_tolerance_ms']:g} ms late is missed), record mix `{parameters['mix']}`. "
                        f"Outcome: {meta.get('outcome', 'unknown')}. Raw data: `{run_dir / 'raw' / STEPS_CSV}`."))
    blocks.append(("p", f"A step is **held** when its achieved rate is at least {MIN_ACHIEVED_SHARE:.0%} of the offered rate, its errors "
                        f"and missed sends are at most {MAX_ERROR_RATE:.0%} of the requests its window scheduled, and the p99 of its "
                        f"delivered records' RTTs, from each record's intended send time, is at most {bound:g} ms. The capacity is the "
                        f"highest rate held (≥: every step held up to the max rate; <: none held)."))
    blocks.extend(("p", paragraph) for paragraph in run_paragraphs(meta))
    machine = meta.get("machine", {})
    versions = meta.get("versions", {})
    blocks.append(("p", f"Machine: {machine.get('cores')} cores ({machine.get('cpu_model')}), load average at the start "
                        f"{machine.get('load_average_at_start')}; Envoy {versions.get('envoy')}, OPA {versions.get('opa')}, Node.js "
                        f"{versions.get('node')}, Locust {versions.get('locust')}; commit {(meta.get('git') or {}).get('commit')}"
                        f"{' (uncommitted changes)' if (meta.get('git') or {}).get('dirty') else ''}."))
    failed = [s for s in meta.get("searches", []) if s.get("error")]
    for search in failed:
        blocks.append(("p", f"Search {case_name(search['topology'], search['engine'])} {search['services']} services FAILED: "
                            f"{search['error'].splitlines()[0]}"))
    paths = {"markdown": report_dir / "capacity.md", "html": report_dir / "capacity.html"}
    steps = read_steps(run_dir) if (run_dir / "raw" / STEPS_CSV).exists() else pd.DataFrame()
    if steps.empty:
        blocks.append(("p", "No step has finished yet."))
    else:
        table = capacity_table(steps, parameters["gap"])
        table.to_csv(tables_dir / "capacity.csv", index=False)
        blocks.append(("h2", "Capacity"))
        blocks.append(("table", capacity_view(table, steps)))
        blocks.append(("figure", latency_figure(steps, bound, figures_dir, load),
                       "RTT against the offered rate, one panel per chain length: p50 (solid) and p99 (dashed) of each step, hollow "
                       "where the step was not held; the dotted line is the p99 bound."))
        closing = read_steps(run_dir, CLOSING_STEPS_CSV) if (run_dir / "raw" / CLOSING_STEPS_CSV).exists() else pd.DataFrame()
        if not closing.empty:
            drift = baseline_drift(steps, closing, parameters["gap"])
            drift.to_csv(tables_dir / "baseline_drift.csv", index=False)
            blocks.append(("h2", "The baseline, first and last"))
            blocks.append(("p", "Every share above is against the baseline searched first at its chain length. It was searched again "
                                f"after the enforcing topologies (its steps: `{run_dir / 'raw' / CLOSING_STEPS_CSV}`), so that a change "
                                "of the machine's speed over the run shows."))
            blocks.extend(("p", paragraph) for paragraph in drift_paragraphs(drift, parameters["gap"]))
        blocks.append(("h2", "Steps"))
        blocks.append(("p", "Every step in the order run within each search. Cores busy over the measured window: the whole machine's, "
                            "the deployment's, and others' (the machine's less the deployment's and Locust's: other users of a shared "
                            "machine). On a 2-core machine a step where others took a core measured half a machine."))
        blocks.append(("table", steps_view(steps)))
    paths["markdown"].write_text(render_markdown(blocks, report_dir))
    paths["html"].write_text(render_html(blocks, title))
    plt.close("all")
    return paths

