"""How much of a deployment's CPU per record `make bench`'s parts explain (issue 39 asks for
within 15 %).

The bench measures each part of a hop alone, beside its floor, on the plan of a central entity of
5 services (experiments/run/bench_parts.py), its records sent one after another. Summed the way a
record of that central entity crosses them, the parts are a record's CPU as the bench sees it, by
kind of process. The run's cells of the same central entity measured that CPU under their load.
What the sum leaves out is what a process spends around a record rather than on it: waking for
each one at the cells' rates, the timers and polling between them. A bench whose records come
back to back never pays it.
"""

from __future__ import annotations

import pandas as pd

TOPOLOGY = "central-entity"
SERVICES = 5  # the bench's plan
WITHIN = 0.15  # |measured ÷ sum − 1| the bench should stay within
KINDS = {"services": "service_ms", "envoy": "envoy_ms", "opa": "opa_ms"}  # cpu_per_record's columns


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


def bench_sum(bench: pd.DataFrame, cpu: pd.DataFrame) -> pd.DataFrame:
    """Per engine and rate the run measured a central entity of SERVICES services at: each kind's
    (services, envoy, opa, then all three) CPU per record summed from the bench and measured by
    the cells, and measured ÷ sum. Empty when the bench lacks a part (one older than the recipe)
    or the run has no such cell."""
    per_record = bench[bench["unit"] == "ms CPU/request"].drop_duplicates("process").set_index("process")["value"]
    cells = cpu[(cpu["topology"] == TOPOLOGY) & (cpu["services"] == SERVICES) & cpu["engine"].isin(["envoy-compiled", "envoy-opa"])]
    rows = []
    for _, cell in cells.sort_values(["engine", "rate"]).iterrows():
        parts = recipe(cell["engine"])
        if any(process not in per_record.index for kind in parts.values() for process, _ in kind):
            return pd.DataFrame()
        summed = {kind: sum(per_record[process] * times for process, times in kind_parts) for kind, kind_parts in parts.items()}
        measured = {kind: cell[column] for kind, column in KINDS.items()}
        summed["all"], measured["all"] = sum(summed.values()), sum(measured.values())
        for kind in [*KINDS, "all"]:
            rows.append({"engine": cell["engine"], "rate": cell["rate"], "saturated": cell["saturated"], "kind": kind,
                         "bench_ms": summed[kind], "measured_ms": measured[kind], "ratio": measured[kind] / summed[kind]})
    return pd.DataFrame(rows)
