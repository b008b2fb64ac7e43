"""The section a run's report opens with, "Findings": analysis/findings.py's numbers in words. The
ranking of the architectures per rate and chain length with their intervals, the saturated cases
named apart, the price of enforcement per engine, the agreement with the paper's order and the
model's order on the paper's testbed."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from experiments.analysis import findings, stats
from experiments.analysis.model import ModelError
from experiments.design.capacity import command_for
from experiments.design.matrix import (BASELINE, BENCH_CSV, BENCH_DECISION_LOG, BENCH_OBSERVABILITY, ENGINE_NAMES, MAX_ERROR_RATE,
                                       MIN_ACHIEVED_SHARE, P99_BOUND_MS, PAPER_NAMES, Parameters, case_name)
from experiments.report.reporting import SATURATED_MARK, arch, percent



def capacity_command(run_dir: Path, meta: dict) -> str:
    """What would give a run's report the capacity share: the capacity search of its topologies,
    engines and chain lengths, then its report again with that search kept."""
    run = Parameters.from_json(meta["parameters"])
    return (f"`{command_for(run)}`, then `python -m experiments report {run_dir.name} --capacity CAPACITY_RUN` "
            "(the search's run id, which it prints)")


def citation(reference: dict) -> str:
    """The paper, cited by its DOI (paper_reference.json)."""
    return f"{reference['source']} doi:{reference['doi']}, https://doi.org/{reference['doi']}"


def interval_text(row) -> str:
    if math.isnan(row.low):
        return f"{row.median:.2f} ms"
    return f"{row.median:.2f} ms [{row.low:.2f}, {row.high:.2f}]"


def why_saturated(row) -> str:
    """The criterion a saturated case failed, with its number."""
    if row.achieved_rate < MIN_ACHIEVED_SHARE * row.offered_rate:
        return f"achieved {row.achieved_rate:.0f} of {row.offered_rate:g} req/s"
    if row.error_rate > MAX_ERROR_RATE:
        return f"{percent(row.error_rate)} errors"
    return f"p99 {row.p99:.0f} ms beyond {P99_BOUND_MS:g}"


def ranking_items(ranked: pd.DataFrame, cases: pd.DataFrame) -> list[str]:
    """One line per rate and chain length: the held cases fastest first with their rank (= where
    tied), the baseline's median beside them, the saturated ones named with why. Overlap is not
    transitive: a case whose interval overlaps one of another rank (A overlaps B, B overlaps C, A
    clear of C) names it, so no tie goes unsaid."""
    baseline = {(r.rate, r.services): r for r in cases[cases["topology"] == BASELINE].itertuples()}
    items = []
    for (rate, services), group in ranked.groupby(["rate", "services"], sort=True):
        held = group[group["rank"].notna()].sort_values(["rank", "median"])
        shared = held["rank"].value_counts()
        rank_of = {(row.topology, row.engine): row.rank for row in held.itertuples()}

        def entry(row) -> str:
            text = f"{int(row.rank)}{'=' if shared[row.rank] > 1 else ''}. {case_name(row.topology, row.engine)} {interval_text(row)}"
            across = [case_name(*other) for other in row.tied_with if rank_of[other] != row.rank]
            return text + (f" (overlaps {', '.join(across)})" if across else "")

        entries = [entry(row) for row in held.itertuples()]
        text = f"**{rate} req/s, {services} services**: " + ("; ".join(entries) if entries else "no case held")
        floor = baseline.get((rate, services))
        if floor is not None:
            text += f" (baseline, no enforcement: {interval_text(floor)}{f' {SATURATED_MARK}' if floor.saturated else ''})"
        saturated = group[group["rank"].isna()]
        if len(saturated):
            text += f". {SATURATED_MARK} Saturated, not ranked: " + "; ".join(
                f"{case_name(row.topology, row.engine)} ({why_saturated(row)})" for row in saturated.itertuples())
        items.append(text + ".")
    return items


def price_items(prices: list[findings.Price], capacity: pd.DataFrame | None, capacity_command: str) -> list[str]:
    """One sentence per engine; `capacity_command`: the commands that would give the capacity share
    when the run keeps no capacity run."""
    items = []
    for price in prices:
        low_t, low_r, low_n = price.lowest
        high_t, high_r, high_n = price.highest
        text = (f"**{ENGINE_NAMES[price.engine]}**: the deployment's CPU per record is {price.ratio_median:.2f}× the baseline's (median of "
                f"{price.cases} cases: {price.extra_ms_median:.2f} ms more per record, {price.per_hop_ms_median:.2f} ms per hop), from "
                f"{price.ratio_low:.2f}× ({arch(low_t)}, {low_r} req/s, {low_n} services) to {price.ratio_high:.2f}× "
                f"({arch(high_t)}, {high_r} req/s, {high_n} services)")
        if price.capacity_share is not None:
            (low_at, low_at_n), (high_at, high_at_n) = price.capacity_at
            runs = ", ".join(f"`{name}`" for name in sorted(capacity["run"].unique()))
            text += (f"; its searched capacity is {percent(price.capacity_share[0])} ({arch(low_at)}, {low_at_n} services) to "
                     f"{percent(price.capacity_share[1])} ({arch(high_at)}, {high_at_n} services) of the baseline's at the same chain "
                     f"length (capacity run {runs})")
            if price.baseline_capped:
                text += ", at most: the baseline held every rate its search offered, so its capacity is higher than the one found"
            if price.capacity_share[1] > 1:
                text += "; a share over 100%, which enforcement cannot earn, says the searches found the machine unequally busy"
                others = capacity["first_failed_other_cores"].dropna()
                if len(others):
                    text += f" (other processes at each search's first failed step: {others.min():.2f} to {others.max():.2f} cores)"
        elif capacity is None:
            text += f"; its share of the baseline's capacity needs a capacity run, and none is kept with this run: {capacity_command}"
        else:
            text += "; the capacity runs kept with this run found no capacity of this engine to set beside a baseline's"
        if price.held_nothing:
            text += ("; held not even its search's lowest rate: "
                     + ", ".join(f"{arch(topology)} at {services} services" for topology, services in price.held_nothing))
        items.append(text + ".")
    return items


def evidence_text(costs: list[findings.EvidenceCost]) -> str:
    """The bench's price of the evidence, in one paragraph; "" for a run whose bench has none."""
    hops = [cost for cost in costs if cost.what.startswith(BENCH_OBSERVABILITY)]
    logs = [cost for cost in costs if cost.what == BENCH_DECISION_LOG]
    parts = []
    if hops:
        targets = sorted({cost.target for cost in hops if cost.target})
        parts.append("a deciding hop's access log and hop counters: " + ", ".join(
            f"{cost.ratio:.2f}× its enforcement CPU without them ({cost.what[len(BENCH_OBSERVABILITY) + 2:cost.what.index(')')]})"
            for cost in hops) + (f", against a target of at most {targets[0]:.2f}×" if len(targets) == 1 else ""))
    parts += [f"the entry's decision log: {cost.ratio:.2f}× its OPA's CPU for the decision and label token without it" for cost in logs]
    if not parts:
        return ""
    return ("**Of that price, the evidence** a deployment keeps, as this run's bench measured it (`raw/bench.csv`: the same process "
            "with and without it, outside any deployment, so a ratio, not a share of the cells' CPU): " + "; ".join(parts) + ".")


def order_line(topologies: list[str], saturated: list[str] = ()) -> str:
    """"SA < DR_6", then the saturated ones, which have no place in an order of held cases."""
    held = " < ".join(PAPER_NAMES.get(t, t) for t in topologies) or "none held"
    return held + (f", then saturated ({', '.join(arch(t) for t in saturated)})" if saturated else "")


def agreement_items(agreement: pd.DataFrame) -> list[str]:
    items = []
    for row in agreement.itertuples():
        tau = f"{row.tau:+.2f}"
        if math.isnan(row.tau):  # the reason, so that a reader knows what run would give it
            tau = ("undefined (every architecture saturated, so ours has no order: a rate the machine carries would give one)"
                   if len(row.saturated) == row.architectures else "undefined")
        items.append(f"**{row.rate} req/s, {ENGINE_NAMES[row.engine]}**: ours {order_line(row.ours, row.saturated)}; the paper's "
                     f"{order_line(row.paper)}; Kendall's τ = {tau} over {row.architectures} architectures "
                     "(+1: the same order, −1: reversed; the saturated ranked last, tied).")
    return items


def model_items(orders: list[findings.ModelOrder]) -> list[str]:
    return [f"**{order.rate} req/s, {ENGINE_NAMES[order.engine]}**: the model on the paper's testbed {order_line(order.model, order.model_saturated)}; "
            f"measured here {order_line(order.ours, order.ours_saturated)}; the paper "
            f"{order_line(order.paper) if order.paper else 'published no W Avg at this rate'}. Why: {order.reason}."
            for order in orders]


def blocks(run_dir: Path, cells: pd.DataFrame, table: pd.DataFrame, requests: pd.DataFrame, cpu: pd.DataFrame, meta: dict, reference: dict,
           tables_dir: Path, capacity: pd.DataFrame | None = None) -> list[tuple]:
    """The Findings section; its numbers also in tables/findings_*.csv."""
    cases = findings.intervals(table, requests)
    cases.to_csv(tables_dir / "findings_medians.csv", index=False)
    ranked = findings.ranking(cases)
    ranked.assign(tied_with=[" ".join(f"{t}/{e}" for t, e in tied) for tied in ranked["tied_with"]]).to_csv(
        tables_dir / "findings_ranking.csv", index=False)
    agreement = findings.agreement(stats.w_avg(table), reference)
    agreement.to_csv(tables_dir / "findings_tau.csv", index=False)
    out: list[tuple] = [
        ("h2", "Findings"),
        ("p", "Computed from this run's data, nothing written by hand. **Which architecture is fastest**, per offered rate and chain "
              "length: the enforcing topologies under each engine by median RTT, fastest first, each with its 95% confidence interval "
              "in brackets (percentile bootstrap over the requests, and over the repetitions where there are several; "
              f"{findings.RESAMPLES} resamples). Cases whose intervals overlap share a rank (2=): the data do not tell them apart. "
              "A saturated case did not carry its load and is named apart, never ranked."),
        ("list", ranking_items(ranked, cases)),
        ("p", "**The price of enforcement**, per engine: the CPU the whole deployment spends per delivered record against the "
              "baseline's at the same rate and chain length (CPU hardly depends on queueing, so saturated cases count too)."),
        ("list", price_items(findings.price(cpu, capacity), capacity, capacity_command(run_dir, meta))
         or ["This run has no baseline: no price to compute."]),
        *([("p", evidence)] if (evidence := evidence_text(findings.evidence_costs(run_dir / "raw" / BENCH_CSV))) else []),
        ("p", "**Against the paper's order** of the architectures by W Avg at each rate (" + citation(reference) + "). Ours is over "
              "this run's chain lengths, theirs over 5, 10, 25 and 50 services."),
        ("list", agreement_items(agreement) or ["No architecture of this run has a published W Avg at its rates."]),
    ]
    try:
        orders = findings.model_orders(run_dir, cells, table, meta, reference)
    except ModelError as error:
        out.append(("p", f"**The model's order on the paper's testbed** is not computed: {error}."))
        return out
    pd.DataFrame([vars(order) for order in orders]).to_csv(tables_dir / "findings_model.csv", index=False)
    out += [
        ("p", "**The model's order on the paper's testbed** (experiments/analysis/model.py, calibrated on this run: this run's CPU "
              "per part, a gateway node and three service nodes of 48 to 56 hardware threads, Poisson arrivals, this run's chain "
              "lengths), beside ours and the paper's; τ compares the model's order with each, and the reason is the model's own numbers."),
        ("list", model_items(orders)),
    ]
    return out
