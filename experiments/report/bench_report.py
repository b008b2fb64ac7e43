"""A run report's sections that set `make bench`'s parts against the run's CPU per record
(experiments/analysis/bench_sum.py): how much of the central entity's CPU the parts explain, and
what the topology costs before any rule runs (the floor) against what each engine costs."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from experiments.analysis import bench_sum
from experiments.design.matrix import BENCH_CSV
from experiments.report.report_tables import bench_sum_view, floors_view
from experiments.report.reporting import arch


def blocks(run_dir: Path, cpu: pd.DataFrame, tables_dir: Path) -> list[tuple]:
    """Both sections, written to tables/bench_sum.csv and tables/bench_floors.csv; nothing for a
    run without a bench, and each section only where the bench and the cells hold its parts."""
    path = run_dir / "raw" / BENCH_CSV
    if not path.exists():
        return []
    bench = bench_sum.read(path)
    return [*explained_blocks(bench, cpu, tables_dir), *floor_blocks(bench, tables_dir)]


def explained_blocks(bench: pd.DataFrame, cpu: pd.DataFrame, tables_dir: Path) -> list[tuple]:
    if cpu["service_ms"].isna().all():
        return []
    summed = bench_sum.bench_sum(bench, cpu)
    if summed.empty:
        return []
    summed.to_csv(tables_dir / "bench_sum.csv", index=False)
    return [("h3", f"How much of it the bench explains ({arch(bench_sum.TOPOLOGY)}, {bench_sum.SERVICES} services)"),
            ("p", f"The bench's parts (below) summed the way a record crosses them: in the baseline, every service with its work "
                  f"behind a plain Envoy entry; in a {arch(bench_sum.TOPOLOGY)} of {bench_sum.SERVICES} services, every service with "
                  f"its work, mutual TLS and label tokens, the entry's decision and the token it signs, and {bench_sum.SERVICES - 1} "
                  "later hops checking the token, each decided by the route (compiled) or by OPA (envoy-opa). Beside them, what this "
                  "run's cells of that case measured. Back to back, the bench's records come one after another, so its processes never "
                  "wait for one; a cell at a modest rate also pays for waking each process for each record, and timers and polling "
                  f"between records. So the bench measures the same parts again with their records paced at {bench_sum.PACED_RATE} a "
                  "second, all at once, as in a deployment: a cell at that rate is set against the paced sum, one at any other rate "
                  f"against the back-to-back sum (in brackets). Near 1 the bench accounts for the case's CPU (within "
                  f"{bench_sum.WITHIN:.0%}: yes); above 1, the deployment spends more than its parts do alone."),
            ("table", bench_sum_view(summed))]


def floor_blocks(bench: pd.DataFrame, tables_dir: Path) -> list[tuple]:
    table = bench_sum.floors(bench)
    if table.empty or bench_sum.FLOOR not in set(table["case"]):
        return []
    table.to_csv(tables_dir / "bench_floors.csv", index=False)
    return [("h3", "What the topology costs before any rule runs"),
            ("p", floors_text(table)),
            ("table", floors_view(table))]


def floors_text(table: pd.DataFrame) -> str:
    """The floor's multiple of the baseline and, per engine, its multiple and the share of its
    excess over the baseline the floor already takes: paced where every case was paced, else
    back to back (said so)."""
    paced = table["paced_ms"].notna().all()
    column, how = ("paced_ratio", f"paced at {bench_sum.PACED_RATE} records/s") if paced else ("bench_ratio", "back to back")
    by_case = table.set_index("case")[column]
    floor = by_case[bench_sum.FLOOR]
    engines = [f"{bench_sum.CASE_NAMES[engine]} {by_case[engine]:.2f}× (the floor is {(floor - 1) / (by_case[engine] - 1):.0%} of its excess)"
               for engine in bench_sum.ENGINES if engine in by_case.index and by_case[engine] > 1]
    return (f"The same parts priced for a {arch(bench_sum.TOPOLOGY)} record of {bench_sum.SERVICES} services with its Envoys and mutual "
            "TLS but no decision, no label token and no OPA: the floor, what the topology and cryptographic identity cost before "
            "any rule runs. No engine can cost less than it, since every hop must cross an Envoy and prove who it is. It errs low: "
            "the entry's TLS to the first service is left out, the bench having no such row. "
            f"Summed {how}, as multiples of the baseline's record: the floor {floor:.2f}×"
            + (f"; {', '.join(engines)}." if engines else "."))
