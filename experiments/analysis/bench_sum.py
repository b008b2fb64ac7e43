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


def read(path: Path) -> pd.DataFrame:
    """A run's bench (raw/bench.csv, experiments/run/bench.py writes it) as written: only an
    empty cell is missing, not a text pandas takes for one by default ("NA", "None", "null")."""
    return pd.read_csv(path, keep_default_na=False, na_values=[""])


def recipe(engine: str, services: int = SERVICES) -> dict[str, list[tuple[str, int]]]:
    """By kind of process, the bench's processes (bench_parts.py) a record of a central entity of
    `services` crosses, and how many times: every service with its work, mutual TLS and label tokens
    (the token row beyond its work, plus the work: the working row less the bare one); the entry's
    decision and the token it signs; each later hop's token check, decided by the central entity's
    route (envoy-compiled) or by its OPA through ext_authz (envoy-opa). The last service forwards
    nothing, which the sum does not take off (a forward is about a tenth of a service hop)."""
    later = services - 1
    hop = {"envoy-compiled": [("envoy-compiled-token/envoy", later)],
           "envoy-opa": [("envoy-opa-token/envoy", later), ("envoy-opa-token/opa", later)]}[engine]
    parts = {"services": [("service-token", services), ("service-work", services), ("service", -services)],
             "envoy": [("entry/envoy", 1)], "opa": [("entry/opa", 1)]}
    for process, times in hop:
        parts[process.rsplit("/", 1)[1]].append((process, times))
    return parts


def processes(engines: tuple[str, ...] = ENGINES) -> set[str]:
    """The bench's processes the recipe names under any of `engines`: those the bench also paces."""
    return {process for engine in engines for kind in recipe(engine).values() for process, _ in kind}


def bench_sum(bench: pd.DataFrame, cpu: pd.DataFrame) -> pd.DataFrame:
    """Per engine and rate the run measured a central entity of SERVICES services at: each kind's
    (services, envoy, opa, then all three) CPU per record summed from the bench, back to back
    (bench_ms) and paced (paced_ms, NaN for a bench without paced rows), and measured by the
    cells; `compared` names the sum the cell is set against (paced at PACED_RATE, back to back
    otherwise), `ratio` is measured ÷ that sum. Empty when the bench lacks a part (one older than
    the recipe) or the run has no such cell."""
    def values(unit: str) -> pd.Series:
        return bench[bench["unit"] == unit].drop_duplicates("process").set_index("process")["value"]

    back_to_back, paced = values("ms CPU/request"), values(PACED_UNIT)
    cells = cpu[(cpu["topology"] == TOPOLOGY) & (cpu["services"] == SERVICES) & cpu["engine"].isin(ENGINES)]
    rows = []
    for _, cell in cells.sort_values(["engine", "rate"]).iterrows():
        parts, crossed = recipe(cell["engine"]), processes((cell["engine"],))
        if not crossed <= set(back_to_back.index):
            return pd.DataFrame()
        sums = {"back to back": summed(parts, back_to_back)}
        was_paced = crossed <= set(paced.index)
        sums["paced"] = summed(parts, paced) if was_paced else dict.fromkeys(sums["back to back"], float("nan"))
        compared = "paced" if cell["rate"] == PACED_RATE and was_paced else "back to back"
        measured = {kind: cell[column] for kind, column in KINDS.items()}
        measured["all"] = sum(measured.values())
        for kind in [*KINDS, "all"]:
            rows.append({"engine": cell["engine"], "rate": cell["rate"], "saturated": cell["saturated"], "kind": kind,
                         "bench_ms": sums["back to back"][kind], "paced_ms": sums["paced"][kind], "measured_ms": measured[kind],
                         "compared": compared, "ratio": measured[kind] / sums[compared][kind]})
    return pd.DataFrame(rows)


def summed(parts: dict[str, list[tuple[str, int]]], per_record: pd.Series) -> dict[str, float]:
    """Each kind's ms per record from the bench's per-process figures, and all kinds' ("all")."""
    kinds = {kind: sum(per_record[process] * times for process, times in kind_parts) for kind, kind_parts in parts.items()}
    return {**kinds, "all": sum(kinds.values())}
