"""How much of a deployment's CPU per record `make bench`'s parts explain (issue 39 asks for
within 15 %).

The bench measures each part of a hop alone, beside its floor, on the plan of a central entity of
5 services (experiments/run/bench_parts.py), its records sent one after another. Summed the way a
record of that central entity crosses them, the parts are a record's CPU as the bench sees it, by
kind of process. The run's cells of the same central entity measured that CPU under their load.
What the sum leaves out is what a process spends around a record rather than on it: waking for
each one at the cells' rates, the timers and polling between them. A bench whose records come
back to back never pays it; so the bench also measures those parts with their records paced at
PACED_RATE a second, all at once (bench.measure_paced), and a cell at that rate is set against
that sum, a cell at any other rate against the back-to-back one.

The same parts also price two cases no rule decides: the baseline (the bare chain, the
denominator of every ratio issue 39 sets) and the floor, a central entity's record with its
Envoys and mutual TLS but no decision, no label token and no OPA: what the topology costs before
any rule runs (floors). What an engine costs beyond the floor is what the rules' machinery adds.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

TOPOLOGY = "central-entity"
SERVICES = 5  # the bench's plan
WITHIN = 0.15  # |measured ÷ sum − 1| the bench should stay within
PACED_RATE = 100  # records/s: the quick profile's lowest rate, where issue 39 reads CPU per record
PACED_UNIT = f"ms CPU/request, paced at {PACED_RATE} records/s"
KINDS = {"services": "service_ms", "envoy": "envoy_ms", "opa": "opa_ms"}  # cpu_per_record's columns
ENGINES = ("envoy-compiled", "envoy-opa")
BASELINE = "baseline"  # the bare chain: a plain Envoy entry, services calling the next directly
FLOOR = "floor"  # the central entity's Envoys and mutual TLS, nothing decided
CASES = (BASELINE, FLOOR, *ENGINES)
CASE_NAMES = {BASELINE: "baseline (no enforcement)", FLOOR: "floor (Envoys and mutual TLS, no rule)",
              "envoy-compiled": "compiled", "envoy-opa": "envoy-opa"}


def read(path: Path) -> pd.DataFrame:
    """A run's bench (raw/bench.csv, experiments/run/bench.py writes it) as written: only an
    empty cell is missing, not a text pandas takes for one by default ("NA", "None", "null")."""
    return pd.read_csv(path, keep_default_na=False, na_values=[""])


def recipe(case: str, services: int = SERVICES) -> dict[str, list[tuple[str, int]]]:
    """By kind of process, the bench's processes (bench_parts.py) a record of `case` at `services`
    crosses, and how many times.

    baseline: every service with its work, and the entry's plain Envoy.
    floor: every service with its work and mutual TLS (the mTLS row, whose own work is none, plus
    the work: the working row less the bare one); the entry's Envoy and the central entity's
    traversal for each later hop, mutual TLS on both sides; no OPA. The entry's upstream TLS is
    left out (the bench has no such row), so the floor errs low.
    envoy-compiled, envoy-opa: every service with its work, mutual TLS and label tokens; the
    entry's decision and the token it signs; each later hop's token check, decided by the central
    entity's route (envoy-compiled) or by its OPA through ext_authz (envoy-opa).
    The last service forwards nothing, which no sum takes off (a forward is about a tenth of a
    service hop)."""
    later = services - 1
    work = [("service-work", services), ("service", -services)]
    if case == BASELINE:
        return {"services": [("service-work", services)], "envoy": [("forwarding/envoy", 1)]}
    if case == FLOOR:
        return {"services": [("service-mtls", services), *work],
                "envoy": [("forwarding/envoy", 1), ("forwarding-mtls/envoy", later)]}
    hop = {"envoy-compiled": [("envoy-compiled-token/envoy", later)],
           "envoy-opa": [("envoy-opa-token/envoy", later), ("envoy-opa-token/opa", later)]}[case]
    parts = {"services": [("service-token", services), *work], "envoy": [("entry/envoy", 1)], "opa": [("entry/opa", 1)]}
    for process, times in hop:
        parts[process.rsplit("/", 1)[1]].append((process, times))
    return parts


def processes(cases: tuple[str, ...] = CASES) -> set[str]:
    """The bench's processes the recipe names under any of `cases`: those the bench also paces."""
    return {process for case in cases for kind in recipe(case).values() for process, _ in kind}


def per_record(bench: pd.DataFrame) -> dict[str, pd.Series]:
    """The bench's ms CPU per record by process: back to back, and paced (empty for a bench
    without paced rows)."""
    def values(unit: str) -> pd.Series:
        return bench[bench["unit"] == unit].drop_duplicates("process").set_index("process")["value"]
    return {"back to back": values("ms CPU/request"), "paced": values(PACED_UNIT)}


def bench_sum(bench: pd.DataFrame, cpu: pd.DataFrame) -> pd.DataFrame:
    """Per case (the baseline, each engine) and rate the run measured at SERVICES services (the
    engines at the central entity): each kind's (services, envoy, opa, then all) CPU per record
    summed from the bench, back to back (bench_ms) and paced (paced_ms, NaN for a bench without
    paced rows), and measured by the cells; `compared` names the sum the cell is set against
    (paced at PACED_RATE, back to back otherwise), `ratio` is measured ÷ that sum. A kind the
    case has none of (the baseline's OPA) is left out; a cell whose parts the bench lacks (one
    older than the recipe) is skipped."""
    sums_of = per_record(bench)
    at_size = cpu[cpu["services"] == SERVICES]
    cells = pd.concat([at_size[at_size["topology"] == BASELINE].assign(case=BASELINE),
                       at_size[(at_size["topology"] == TOPOLOGY) & at_size["engine"].isin(ENGINES)].assign(case=lambda c: c["engine"])])
    rows = []
    for case in CASES:
        parts, crossed = recipe(case), processes((case,))
        if not crossed <= set(sums_of["back to back"].index):
            continue
        sums = {"back to back": summed(parts, sums_of["back to back"])}
        was_paced = crossed <= set(sums_of["paced"].index)
        sums["paced"] = summed(parts, sums_of["paced"]) if was_paced else dict.fromkeys(sums["back to back"], float("nan"))
        kinds = [kind for kind in KINDS if kind in parts]
        for _, cell in cells[cells["case"] == case].sort_values("rate").iterrows():
            compared = "paced" if cell["rate"] == PACED_RATE and was_paced else "back to back"
            measured = {kind: cell[KINDS[kind]] for kind in kinds}
            measured["all"] = sum(measured.values())
            rows.extend({"case": case, "rate": cell["rate"], "saturated": cell["saturated"], "kind": kind,
                         "bench_ms": sums["back to back"][kind], "paced_ms": sums["paced"][kind], "measured_ms": measured[kind],
                         "compared": compared, "ratio": measured[kind] / sums[compared][kind]} for kind in [*kinds, "all"])
    return pd.DataFrame(rows)


def floors(bench: pd.DataFrame) -> pd.DataFrame:
    """Per case the bench prices, a record's CPU at the central entity of SERVICES (all kinds),
    back to back (bench_ms) and paced (paced_ms, NaN without paced rows), and each as a multiple
    of the baseline's (bench_ratio, paced_ratio). Empty for a bench without the baseline's parts;
    a case whose parts the bench lacks is left out."""
    sums_of = per_record(bench)
    rows = []
    for case in CASES:
        crossed = processes((case,))
        if crossed <= set(sums_of["back to back"].index):
            paced = summed(recipe(case), sums_of["paced"])["all"] if crossed <= set(sums_of["paced"].index) else float("nan")
            rows.append({"case": case, "bench_ms": summed(recipe(case), sums_of["back to back"])["all"], "paced_ms": paced})
    table = pd.DataFrame(rows, columns=["case", "bench_ms", "paced_ms"])
    if BASELINE not in set(table["case"]):
        return pd.DataFrame()
    baseline = table.set_index("case").loc[BASELINE]
    return table.assign(bench_ratio=table["bench_ms"] / baseline["bench_ms"], paced_ratio=table["paced_ms"] / baseline["paced_ms"])


def summed(parts: dict[str, list[tuple[str, int]]], figures: pd.Series) -> dict[str, float]:
    """Each kind's ms per record from the bench's per-process figures, and all kinds' ("all")."""
    kinds = {kind: sum(figures[process] * times for process, times in kind_parts) for kind, kind_parts in parts.items()}
    return {**kinds, "all": sum(kinds.values())}
