"""The bench's parts summed into a record of the baseline and of the central entity at 5 services,
beside what the cells measured, and into the floor (experiments/analysis/bench_sum.py); the
report's view of both."""

import pandas as pd
import pytest

from complyroute.topology.manifest import REPO
from experiments.analysis.bench_sum import BASELINE, CASES, FLOOR, PACED_RATE, PACED_UNIT, bench_sum, floors, processes
from experiments.analysis.bench_sum import read as read_bench
from experiments.report.bench_report import floors_text
from experiments.report.report_tables import bench_sum_view

SAMPLE_BENCH = REPO / "experiments" / "sample" / "raw" / "bench.csv"
# ms CPU/request of each process the recipe names, chosen so each kind's sum is a round figure.
PARTS = {"service-token": 0.3, "service-work": 0.5, "service": 0.2, "entry/envoy": 0.4, "entry/opa": 0.6,
         "envoy-compiled-token/envoy": 0.25, "envoy-opa-token/envoy": 0.5, "envoy-opa-token/opa": 0.4,
         "service-mtls": 0.25, "forwarding/envoy": 0.1, "forwarding-mtls/envoy": 0.15}


def bench(parts=PARTS):
    rows = [{"part": process, "process": process, "value": value, "unit": "ms CPU/request"} for process, value in parts.items()]
    # opa bench's rows have their own unit: never summed as CPU per request
    rows.append({"part": "policy evaluation alone", "process": "opa bench", "value": 9.0, "unit": "ms/evaluation"})
    return pd.DataFrame(rows)


def cpu(topology="central-entity", services=5, **measured):
    return pd.DataFrame([{"topology": topology, "engine": engine, "rate": 100, "services": services, "saturated": False,
                          "service_ms": 3.0, "envoy_ms": measured.get(engine, 1.4), "opa_ms": 0.6} for engine in ("envoy-compiled", "envoy-opa")])


def baseline_cell(services=5):
    return pd.DataFrame([{"topology": BASELINE, "engine": None, "rate": 100, "services": services, "saturated": False,
                          "service_ms": 2.5, "envoy_ms": 0.2, "opa_ms": 0.0}])


def test_the_recipe_names_only_processes_the_bench_measures_allowed():
    measured = read_bench(SAMPLE_BENCH)
    measured = set(measured[measured["unit"] == "ms CPU/request"]["process"])
    for case in CASES:
        assert processes((case,)) <= measured, case


def test_a_record_of_the_central_entity_sums_its_parts_allowed():
    summed = bench_sum(bench(), cpu()).set_index(["case", "kind"])
    # five services: 5 x (0.3 + 0.5 - 0.2); the entry, then 4 later hops
    assert summed.loc[("envoy-compiled", "services"), "bench_ms"] == pytest.approx(3.0)
    assert summed.loc[("envoy-compiled", "envoy"), "bench_ms"] == pytest.approx(0.4 + 4 * 0.25)
    assert summed.loc[("envoy-compiled", "opa"), "bench_ms"] == pytest.approx(0.6)
    assert summed.loc[("envoy-opa", "envoy"), "bench_ms"] == pytest.approx(0.4 + 4 * 0.5)
    assert summed.loc[("envoy-opa", "opa"), "bench_ms"] == pytest.approx(0.6 + 4 * 0.4)
    assert summed.loc[("envoy-compiled", "all"), "bench_ms"] == pytest.approx(5.0)
    assert summed.loc[("envoy-compiled", "all"), "ratio"] == pytest.approx(1.0)  # measured 3.0 + 1.4 + 0.6
    assert summed.loc[("envoy-opa", "envoy"), "ratio"] == pytest.approx(1.4 / 2.4)


def test_a_bench_without_a_part_or_a_run_without_the_case_sums_nothing_denied():
    assert bench_sum(bench({k: v for k, v in PARTS.items() if k != "entry/opa"}), cpu()).empty
    assert bench_sum(bench({k: v for k, v in PARTS.items() if k != "forwarding/envoy"}), baseline_cell()).empty
    assert bench_sum(bench(), baseline_cell(services=10)).empty
    assert bench_sum(bench(), cpu(services=10)).empty
    assert bench_sum(bench(), cpu(topology="sidecar")).empty


def test_the_view_says_within_15_percent_only_within_it_allowed():
    summed = bench_sum(bench(), cpu(**{"envoy-compiled": 1.4 + 0.7, "envoy-opa": 1.4}))
    view = bench_sum_view(summed).set_index(["Case", "Processes"])
    assert view.loc[("compiled", "services"), "Within 15%"] == "yes"  # 3.0 against 3.0
    assert view.loc[("compiled", "Envoy"), "Within 15%"] == "no"  # 2.1 against 1.4: 1.50x
    assert view.loc[("compiled", "all"), "Within 15%"] == "yes"  # 5.7 against 5.0: 1.14x
    assert view.loc[("envoy-opa", "Envoy"), "Within 15%"] == "no"  # 1.4 against 2.4: 0.58x


def test_a_cell_at_the_paced_rate_is_set_against_the_paced_sum_allowed():
    paced = bench()
    paced = pd.concat([paced, paced[paced["unit"] == "ms CPU/request"].assign(value=lambda rows: rows["value"] * 2, unit=PACED_UNIT)])
    cells = pd.concat([cpu(), cpu().assign(rate=500)])
    summed = bench_sum(paced, cells).set_index(["case", "rate", "kind"])
    at_rate = summed.loc[("envoy-compiled", PACED_RATE, "all")]
    assert at_rate["compared"] == "paced" and at_rate["paced_ms"] == pytest.approx(10.0) and at_rate["ratio"] == pytest.approx(0.5)
    beyond = summed.loc[("envoy-compiled", 500, "all")]
    assert beyond["compared"] == "back to back" and beyond["ratio"] == pytest.approx(1.0)


def test_a_bench_without_paced_rows_sets_every_cell_against_back_to_back_denied():
    summed = bench_sum(bench(), cpu())
    assert (summed["compared"] == "back to back").all() and summed["paced_ms"].isna().all()


def test_a_text_pandas_would_take_for_missing_is_read_as_written_allowed(tmp_path):
    path = tmp_path / "bench.csv"
    pd.DataFrame([{"part": "NA", "floor": "None", "value": 0.5, "ratio": 1.2}]).to_csv(path, index=False)
    read = read_bench(path)
    assert (read.loc[0, "part"], read.loc[0, "floor"], read.loc[0, "ratio"]) == ("NA", "None", 1.2)


def test_an_empty_cell_is_read_as_missing_denied(tmp_path):
    path = tmp_path / "bench.csv"
    pd.DataFrame([{"part": "service hop floor", "floor": None, "value": 0.5, "ratio": None}]).to_csv(path, index=False)
    read = read_bench(path)
    assert pd.isna(read.loc[0, "floor"]) and pd.isna(read.loc[0, "ratio"]) and read.loc[0, "value"] == 0.5


def test_the_baseline_cell_sums_its_services_and_plain_entry_without_an_opa_allowed():
    summed = bench_sum(bench(), pd.concat([baseline_cell(), cpu()])).set_index(["case", "kind"])
    assert summed.loc[(BASELINE, "services"), "bench_ms"] == pytest.approx(5 * 0.5)
    assert summed.loc[(BASELINE, "envoy"), "bench_ms"] == pytest.approx(0.1)
    assert summed.loc[(BASELINE, "all"), "ratio"] == pytest.approx((2.5 + 0.2) / 2.6)
    assert (BASELINE, "opa") not in summed.index  # the baseline runs no OPA
    assert ("envoy-compiled", "opa") in summed.index


def test_the_floor_prices_envoys_and_mtls_without_a_rule_allowed():
    table = floors(bench()).set_index("case")
    baseline = 5 * 0.5 + 0.1
    # five services with mutual TLS and their work; the entry, then 4 traversals with mutual TLS
    floor = 5 * (0.25 + 0.5 - 0.2) + 0.1 + 4 * 0.15
    assert table.loc[FLOOR, "bench_ms"] == pytest.approx(floor)
    assert table.loc[FLOOR, "bench_ratio"] == pytest.approx(floor / baseline)
    assert table.loc["envoy-compiled", "bench_ratio"] == pytest.approx(5.0 / baseline)
    assert table["paced_ms"].isna().all()  # a bench without paced rows


def test_without_the_baseline_s_parts_there_is_no_floor_denied():
    assert floors(bench({k: v for k, v in PARTS.items() if k != "forwarding/envoy"})).empty


def test_the_floor_text_gives_its_share_of_each_engine_s_excess_allowed():
    text = floors_text(floors(bench()))
    baseline, floor = 2.6, 5 * 0.55 + 0.1 + 0.6
    assert f"the floor {floor / baseline:.2f}×" in text and "back to back" in text
    share = (floor / baseline - 1) / (5.0 / baseline - 1)
    assert f"compiled {5.0 / baseline:.2f}× (the floor is {share:.0%} of its excess)" in text


def test_the_floor_text_reads_the_paced_sums_only_when_every_case_was_paced_denied():
    paced = bench()
    paced = pd.concat([paced, paced[paced["unit"] == "ms CPU/request"].assign(value=lambda rows: rows["value"] * 2, unit=PACED_UNIT)])
    assert f"paced at {PACED_RATE} records/s" in floors_text(floors(paced))
    partly = paced[~((paced["unit"] == PACED_UNIT) & (paced["process"] == "forwarding-mtls/envoy"))]
    assert "back to back" in floors_text(floors(partly))
