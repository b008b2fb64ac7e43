"""A run report's tables: the paper's W Avg beside ours (derived), and each table as the report
shows it (a view: the columns renamed and the numbers written), Table I in the paper's layout
first."""

from __future__ import annotations

import numpy as np
import pandas as pd

from experiments.analysis import stats
from experiments.analysis.bench_sum import CASE_NAMES, PACED_RATE, WITHIN
from experiments.design.matrix import ENGINE_NAMES, MAX_REPETITION_CV, PAPER_NAMES, case_name
from experiments.report.reporting import SATURATED_MARK, cores, marked, ms, names, percent, rate_text, ratio_text


CV_FLAG = "over 10%"


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


def bench_sum_view(summed: pd.DataFrame) -> pd.DataFrame:
    kinds = {"services": "services", "envoy": "Envoy", "opa": "OPA", "all": "all"}
    return pd.DataFrame({
        "Case": summed["case"].map(CASE_NAMES),
        "Rate (req/s)": [marked(rate, saturated) for rate, saturated in zip(summed["rate"], summed["saturated"])],
        "Processes": summed["kind"].map(kinds), "Bench, back to back (ms)": summed["bench_ms"].map(ms),
        f"Bench, paced at {PACED_RATE}/s (ms)": summed["paced_ms"].map(ms), "Measured (ms)": summed["measured_ms"].map(ms),
        "Measured ÷ bench": [f"{ratio_text(r)} ({compared})" for r, compared in zip(summed["ratio"], summed["compared"])],
        f"Within {WITHIN:.0%}": ["yes" if abs(r - 1) <= WITHIN else "no" for r in summed["ratio"]],
    })


def floors_view(table: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame({
        "Case": table["case"].map(CASE_NAMES),
        "Bench, back to back (ms)": table["bench_ms"].map(ms), "× the baseline": table["bench_ratio"].map(ratio_text),
        f"Bench, paced at {PACED_RATE}/s (ms)": table["paced_ms"].map(ms), "× the baseline, paced": table["paced_ratio"].map(ratio_text),
    })
