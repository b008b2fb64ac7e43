"""A run's report: derived tables (report/tables/*.csv), figures (report/figures/*.png, .svg)
and report.md / report.html (self-contained: the figures embedded). Its tables are
report_tables.py's, its figures report_figures.py's; what every report shares, reporting.py.

The report is built only from results/<run-id>/ (metadata.json and raw/), so it can be
rebuilt at any time: `python -m experiments report <run-id>`.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from experiments.analysis import bench_sum, stats
from experiments.design.matrix import (BASELINE, BENCH_CSV, ENGINE_NAMES, MAX_ERROR_RATE, MAX_REPETITION_CV, MIN_ACHIEVED_SHARE, P99_BOUND_MS,
                                       PRIME_MIN_SECONDS, PROFILES, Parameters, case_name)
from experiments.design.targets import run_paragraphs
from experiments.report import bench_report, changeability_report, findings_report
from experiments.report.capacity_report import kept_capacity
from experiments.report.report_figures import (CURVE_PERCENTILES, MAX_FLIERS, bench_figure, box_figure, cost_figure, cpu_figure, engines_figure,
                                               hop_figure, load_figure, percentile_figure, split_figure, w_avg_figure)
from experiments.report.report_tables import (CV_FLAG, bench_view, cost_view, cpu_view, engines_view, load_view, split_view, spread_view, table_one,
                                              w_avg_comparison, w_avg_view)
from experiments.report.reporting import SATURATED_MARK, arch, load_paper_reference, marked, ms, names, percent, render_html, render_markdown


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
    bench = bench_sum.read(path)
    measured_by = next(((number, s) for number, s in enumerate(sessions, 1) if s.get("bench", {}).get("csv") == BENCH_CSV), None)
    earlier = [s["bench"]["csv"] for s in sessions if s.get("bench", {}).get("csv", BENCH_CSV) != BENCH_CSV]
    blocks.append(("p", "The CPU time one process spends per request, beside its floor: the least the same job costs, measured in the same "
                        "run on the same machine. Read the ratio, not the value: 1× is the floor itself, 1.3× means 30% more CPU than the "
                        "floor, 5× five times as much. This machine is slow and shared, so absolute values describe only it; the ratios are "
                        "what carries over to another machine. Target: the most a part may cost against its floor; verdict: whether this "
                        "run met it. How: before its cells, every session takes `make bench`'s measurement (experiments/run/bench.py): each "
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
    """Write report/ (tables, figures, report.md, report.html) for a run; return their paths. The
    capacity runs the run keeps (capacity_report.keep_capacity) price enforcement in capacity."""
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
                        f"In the run's folder (`{run_dir.name}`, this report's parent): raw data in `raw/`, tables in `report/tables/`, "
                        "figures in `report/figures/`."))
    blocks.extend(("p", paragraph) for paragraph in run_paragraphs(meta))
    expected = len(run.cells())
    bench = bench_blocks(run_dir, meta, figures_dir)
    if cells.empty:
        blocks.append(("p", f"No cell of this run has finished yet (0 of {expected}); {len(failed)} failed."))
        return write_documents(blocks + bench + changeability_report.blocks(run_dir, figures_dir), report_dir, meta)

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
    blocks.extend(findings_report.blocks(run_dir, cells, table, requests, cpu, meta, reference, tables_dir, kept_capacity(run_dir)))
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
        "machines. Absolute numbers are not comparable with the paper's; the ranking of the architectures (\"Findings\", above) and the "
        "trends are what to compare.",
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
                   f"drawn per box (chosen at random); a topology's colour, lighter and striped under the compiled engine; {SATURATED_MARK} above "
                   "a red outline: saturated.",
                   "Box plots of the RTT of every topology under each engine and of the baseline, one panel per offered rate, grouped by "
                   "chain length."))
    blocks.append(("figure", percentile_figure(table, requests, figures_dir, run.load_label),
                   f"RTT percentiles from p{CURVE_PERCENTILES[0]:g} to p{CURVE_PERCENTILES[-1]:g} (log scale), one panel per rate and chain "
                   f"length: a line per topology (colour) and engine (marker and line style: envoy-opa ○ solid, compiled □ dashed, "
                   f"baseline ◇ dotted); a saturated case's line thin, ending in {SATURATED_MARK}. The tail is where the architectures part.",
                   "Line charts of RTT against percentile, one per rate and chain length, a line per topology and engine."))

    blocks.append(("h2", "W Avg: ours and the paper's"))
    blocks.append(("p", "The paper measured one engine, and its architecture is envoy-opa's (a decision asked for every hop): its values "
                        "stand beside both of ours, the envoy-opa row being the one to compare with it."))
    blocks.append(("table", w_avg_view(comparison)))
    blocks.append(("figure", w_avg_figure(comparison, figures_dir, run.load_label),
                   "W Avg per architecture, engine and offered rate: ours (filled; lighter and striped: compiled) beside the paper's published value "
                   f"(crossed; experiments/paper_reference.json, doi:{reference['doi']}). Log scale."))
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
                       "(median RTT − the baseline's median RTT) / hops, same rate and services, same run; lighter and striped: compiled engine."))

    blocks.append(("h2", "Where the time goes"))
    if split["transit_ms"].isna().all():
        blocks.append(("p", "Without a baseline in the run, time outside the services cannot be told apart into transit and enforcement; "
                            "the figure shows it all as transit."))
    blocks.append(("table", split_view(split)))
    blocks.append(("figure", split_figure(split, figures_dir, run.load_label),
                   "Mean time per delivered request: inside the services, transit (the baseline's time outside its services) and enforcement "
                   "(the topology's time outside its services beyond the baseline's); negative enforcement (noise) is drawn as 0."))

    hops = stats.hop_times(run_dir)
    hops.to_csv(tables_dir / "hops.csv", index=False)
    if hops.empty:
        blocks.append(("p", "This run's requests were recorded before requests.csv.gz kept each hop's times: no per-hop breakdown."))
    else:
        blocks.append(("h3", "Hop by hop"))
        blocks.append(("p", "Each delivered record's time per hop: reaching it (from the previous service sending the record on, or from "
                            "the client's send: the proxies and decisions in between), inside the service, and its answer getting back; "
                            "with the sender's lateness first, they add up to the record's RTT. Means per case, repetitions pooled "
                            "(`tables/hops.csv`)."))
        blocks.append(("figure", hop_figure(hops, table, figures_dir, run.load_label),
                       f"Where a delivered record's time goes, hop by hop, as shares of the mean RTT (written at each bar's end; white "
                       f"lines part the hops, numbered): the sender late, then each hop's way in, its service and the answer's way back. "
                       f"{SATURATED_MARK}: saturated.",
                       "Horizontal stacked bars, one per topology and engine and one panel per rate and chain length, each bar split "
                       "into the hops of a record in turn."))

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
    blocks.extend(bench_report.blocks(run_dir, cpu, tables_dir))

    blocks.extend(bench)

    if failed:
        blocks.append(("h2", "Failed cells"))
        rows = []
        for record in failed:
            cell = stats.identity(record["cell"])
            rows.append({"Cell": f"{case_name(cell['topology'], cell['engine'])} {cell['rate']} req/s {cell['services']} services rep {cell['repetition']}",
                         "Error": record["error"].splitlines()[0], "At": record["at"]})
        blocks.append(("table", pd.DataFrame(rows)))

    blocks.extend(changeability_report.blocks(run_dir, figures_dir))
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
