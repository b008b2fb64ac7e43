"""The statistics against values worked out by hand on small fixed samples."""

import math

import pandas as pd
import pytest

from experiments.analysis import stats
from experiments.load.timing import split


def test_quartiles_and_percentiles_of_one_to_ten():
    # Linear interpolation between closest ranks: position p * (n - 1) in the sorted sample.
    result = stats.rtt_statistics(pd.Series([7.0, 1, 10, 4, 2, 9, 3, 8, 6, 5]))
    assert result["count"] == 10
    assert (result["min"], result["max"]) == (1, 10)
    assert result["q1"] == pytest.approx(3.25)  # 0.25 * 9 = 2.25: 3 + 0.25 * (4 - 3)
    assert result["median"] == pytest.approx(5.5)
    assert result["q3"] == pytest.approx(7.75)
    assert result["p95"] == pytest.approx(9.55)  # 0.95 * 9 = 8.55: 9 + 0.55 * (10 - 9)
    assert result["p99"] == pytest.approx(9.91)
    assert result["mean"] == pytest.approx(5.5)
    assert result["std"] == pytest.approx(math.sqrt(82.5 / 9))  # sample standard deviation: sum of squares 82.5, n - 1 = 9


def test_p95_of_a_skewed_sample():
    result = stats.rtt_statistics(pd.Series([10.0, 20, 30, 40, 100]))
    assert (result["q1"], result["median"], result["q3"]) == (20, 30, 40)
    assert result["p95"] == pytest.approx(88)  # 0.95 * 4 = 3.8: 40 + 0.8 * (100 - 40)


def test_w_avg_reproduces_the_papers_central_entity_at_100_per_second():
    table = pd.DataFrame({
        "topology": "central-entity", "engine": "envoy-opa", "rate": 100, "services": [5, 10, 25, 50],
        "median": [37.884, 136.734, 1438.716, 3486.238], "saturated": False,
    })
    row = stats.w_avg(table).iloc[0]
    # (37.884/5 + 136.734/10 + 1438.716/25 + 3486.238/50) / 4, the paper's 37.131
    assert row["w_avg"] == pytest.approx(37.1309, abs=1e-4)
    assert row["services_run"] == "5 10 25 50"


def test_w_avg_averages_over_the_service_counts_run_only():
    table = pd.DataFrame({"topology": "sidecar", "engine": "envoy-opa", "rate": [100, 100, 500], "services": [5, 10, 5],
                          "median": [20.0, 60.0, 50.0], "saturated": [False, False, True]})
    result = stats.w_avg(table).set_index("rate")
    assert result.loc[100, "w_avg"] == pytest.approx((20 / 5 + 60 / 10) / 2)
    assert result.loc[500, "w_avg"] == pytest.approx(10)
    assert list(result["any_saturated"]) == [False, True]


def test_w_avg_of_each_engine_apart():
    table = pd.DataFrame({"topology": "sidecar", "engine": ["envoy-opa", "envoy-opa", "envoy-compiled", "envoy-compiled"],
                          "rate": 100, "services": [5, 10, 5, 10], "median": [20.0, 60.0, 10.0, 20.0], "saturated": False})
    result = stats.w_avg(table).set_index("engine")
    assert result.loc["envoy-opa", "w_avg"] == pytest.approx((20 / 5 + 60 / 10) / 2)
    assert result.loc["envoy-compiled", "w_avg"] == pytest.approx((10 / 5 + 20 / 10) / 2)
    assert list(result.index) == ["envoy-opa", "envoy-compiled"]  # the reference engine first


@pytest.mark.parametrize(("achieved", "offered", "error_rate", "saturated"), [
    (95.0, 100, 0.0, False),   # exactly 95% of the target: kept
    (94.9, 100, 0.0, True),
    (100.0, 100, 0.01, False),  # exactly 1% errors: kept
    (100.0, 100, 0.0101, True),
    (480.0, 500, 0.0, False),
    (300.0, 500, 0.0, True),
])
def test_saturation_flag(achieved, offered, error_rate, saturated):
    assert stats.is_saturated(achieved, offered, error_rate) is saturated


def test_an_open_loop_cell_under_the_p99_bound_is_not_saturated_allowed():
    assert not stats.is_saturated(100.0, 100, 0.0, p99_ms=stats.P99_BOUND_MS)
    assert not stats.is_saturated(100.0, 100, 0.0, p99_ms=None)  # a closed loop: its users bound the RTT, whatever the p99


def test_an_open_loop_cell_whose_queue_grew_is_saturated_denied():
    # CE (envoy-opa) at 100 req/s and 5 services in 20261126-quick: the rate held, p99 2.3 s
    assert stats.is_saturated(100.0, 100, 0.0, p99_ms=2329.0)


def requests_frame(rows):
    """A closed loop's requests: each intended when sent, its RTT its service time, none missed."""
    frame = pd.DataFrame(rows, columns=["t_send_ms", "rtt_ms", "status", "record", "expected"])
    return frame.assign(t_intended_ms=frame["t_send_ms"], service_time_ms=frame["rtt_ms"], missed=None)


def test_cell_statistics_leave_the_warm_up_and_the_tail_out():
    rows = [(0.0, 900.0, 200, "allowed", 200), (500.0, 900.0, 200, "allowed", 200)]  # warm-up (1 s)
    rows += [(1000.0 + 250 * k, 10.0 + k, 200, "allowed", 200) for k in range(8)]  # window: 1000 <= t < 3000
    rows += [(1100.0, 3.0, 503, "allowed", 200)]  # an error: counted, not timed
    rows += [(3000.0, 900.0, 200, "allowed", 200)]  # after the window
    result = stats.cell_statistics(requests_frame(rows), {"warmup_s": 1, "duration_s": 2, "offered_rate": 5, "users": 1})
    assert result["requests"] == 9
    assert result["errors"] == 1
    assert result["achieved_rate"] == pytest.approx(4.5)
    assert result["error_rate"] == pytest.approx(1 / 9)
    assert result["saturated"] is True
    assert (result["count"], result["min"], result["max"], result["median"]) == (8, 10, 17, 13.5)


def test_denied_records_are_counted_but_not_timed():
    rows = [(0.0, 1.0, 200, "allowed", 200), (10.0, 20.0, 200, "allowed", 200), (20.0, 2.0, 451, "denied-hop-1", 451)]
    result = stats.cell_statistics(requests_frame(rows), {"warmup_s": 0, "duration_s": 1, "offered_rate": 3, "users": 1})
    assert (result["requests"], result["errors"], result["count"]) == (3, 0, 2)


def test_repetition_spread_is_the_coefficient_of_variation_of_the_medians():
    cells = pd.DataFrame({"topology": "sidecar", "engine": "envoy-opa", "rate": 100, "services": 5, "repetition": [1, 2, 3],
                          "median": [10.0, 20.0, 30.0], "saturated": False, "load": "open loop, constant arrivals"})
    row = stats.repetition_spread(cells).iloc[0]
    assert row["medians"] == "10.000 20.000 30.000"
    assert row["cv"] == pytest.approx(10 / 20)  # sample std 10, mean 20
    assert row["load"] == "open loop, constant arrivals"


def test_a_case_whose_repetitions_vary_by_more_than_ten_percent_is_flagged_unless_saturated():
    def case(rate, medians, saturated=False):
        return pd.DataFrame({"topology": "sidecar", "engine": "envoy-opa", "rate": rate, "services": 5, "repetition": [1, 2, 3],
                             "median": medians, "saturated": saturated, "load": "open loop, constant arrivals"})
    # mean 100 each; sample standard deviation 12 and 5: CV 12% and 5%
    cells = pd.concat([case(100, [88.0, 100.0, 112.0]), case(200, [95.0, 100.0, 105.0]), case(500, [88.0, 100.0, 112.0], saturated=[False, True, False])])
    spread = stats.repetition_spread(cells).set_index("rate")
    assert spread["cv"].tolist() == pytest.approx([0.12, 0.05, 0.12])
    assert spread["cv_flagged"].tolist() == [True, False, False]  # 500 req/s: a saturated repetition, not flagged


def test_enforcement_cost_per_hop_of_both_engines_against_one_baseline():
    table = pd.DataFrame({"topology": ["sidecar", "sidecar", "baseline", "sidecar"],
                          "engine": ["envoy-compiled", "envoy-opa", "none", "envoy-opa"], "rate": [100, 100, 100, 500], "services": 10,
                          "median": [25.0, 45.0, 15.0, 80.0], "saturated": False})
    cost = stats.enforcement_cost(table)
    assert cost["engine"].tolist() == ["envoy-opa", "envoy-compiled"]  # 500 req/s has no baseline to compare with
    assert cost["cost_per_hop"].tolist() == pytest.approx([3.0, 1.0])  # (45 - 15) / 10 hops, (25 - 15) / 10


def test_time_split_of_one_request_adds_up_to_its_rtt():
    path = [
        {"t_in": 102.0, "t_out": 104.0, "t_back": 120.0},
        {"t_in": 107.0, "t_out": 110.0, "t_back": 117.0},
        {"t_in": 112.0, "t_out": 115.0},
    ]
    parts = split(path, t_send=100.0, t_recv=123.0)
    assert parts == {
        "service_ms": 2 + 3 + 3,
        "forward_ms": (107 - 104) + (112 - 110),
        "back_ms": (120 - 117) + (117 - 115),
        "entry_ms": 2.0,
        "exit_ms": 3.0,
    }
    assert sum(parts.values()) == 23.0


def test_time_split_of_a_case_takes_transit_from_the_baseline():
    def rows(topology, engine, outside):
        return [{"topology": topology, "engine": engine, "rate": 100, "services": 2, "t_send_ms": 0.0, "rtt_ms": 4.0 + outside,
                 "service_time_ms": 4.0 + outside, "status": 200, "record": "allowed", "expected": 200, "hops": 2.0, "service_ms": 4.0, "forward_ms": outside / 2,
                 "back_ms": outside / 4, "entry_ms": outside / 8, "exit_ms": outside / 8}]
    requests = pd.DataFrame(rows("sidecar", "envoy-opa", 16.0) + rows("sidecar", "envoy-compiled", 8.0) + rows("baseline", "none", 4.0))
    result = stats.time_split(requests).set_index("engine")
    assert result.loc["envoy-opa", "transit_ms"] == pytest.approx(4.0)
    assert result.loc["envoy-opa", "enforcement_ms"] == pytest.approx(12.0)
    assert result.loc["envoy-opa", "enforcement_per_hop_ms"] == pytest.approx(6.0)
    assert result.loc["envoy-opa", "enforcement_per_gap_ms"] == pytest.approx(8.0 - 2.0)  # one gap: forward 8 vs 2
    # the compiled engine against the same baseline: 8 ms outside its services, 4 of them transit
    assert (result.loc["envoy-compiled", "transit_ms"], result.loc["envoy-compiled", "enforcement_ms"]) == pytest.approx((4.0, 4.0))
    assert result.loc["none", "enforcement_ms"] == pytest.approx(0.0)
    assert (result["send_lag_ms"] == 0).all()  # sent when intended: the parts make up the whole RTT


def test_time_split_leaves_the_senders_lateness_out_of_the_parts():
    request = {"topology": "baseline", "engine": "none", "rate": 100, "services": 2, "t_send_ms": 0.0, "rtt_ms": 30.0,
               "service_time_ms": 10.0, "status": 200, "record": "allowed", "expected": 200, "hops": 2.0, "service_ms": 4.0,
               "forward_ms": 2.0, "back_ms": 2.0, "entry_ms": 1.0, "exit_ms": 1.0}
    row = stats.time_split(pd.DataFrame([request])).iloc[0]
    assert row["send_lag_ms"] == pytest.approx(20.0)  # sent 20 ms after its intended time
    assert row["service_ms"] + row["outside_ms"] + row["send_lag_ms"] == pytest.approx(row["rtt_ms"])


def test_records_of_a_mix_are_counted_by_kind_and_status():
    requests = pd.DataFrame({"topology": "sidecar", "engine": "envoy-opa", "rate": 100, "services": 5, "t_send_ms": 0.0,
                             "rtt_ms": [10.0, 30.0, 2.0, 4.0], "status": [200, 200, 451, 451],
                             "record": ["allowed", "allowed", "denied-hop-1", "denied-hop-1"], "expected": [200, 200, 451, 451]})
    result = stats.records(requests)
    assert result[["record", "status", "requests", "median"]].values.tolist() == [["allowed", 200, 2, 20.0], ["denied-hop-1", 451, 2, 3.0]]


def test_cpu_cores_split_by_kind_and_nan_for_runs_recorded_before_the_split():
    split = pd.DataFrame({"t_ms": [0, 2000], "machine_busy_s": [0, 3.0], "locust_s": [0, 0.2], "deployment_s": [0, 2.0],
                          "service_s": [0, 1.0], "envoy_s": [0, 0.6], "opa_s": [0, 0.4]})
    cores = stats.cpu_cores(split, 0, 2000)
    assert [cores[k] for k in ("cpu_machine", "cpu_locust", "cpu_deployment", "cpu_other", "cpu_service", "cpu_envoy", "cpu_opa")] == \
        pytest.approx([1.5, 0.1, 1.0, 0.4, 0.5, 0.3, 0.2])
    before = stats.cpu_cores(split[["t_ms", "machine_busy_s", "locust_s", "deployment_s"]], 0, 2000)
    assert before["cpu_deployment"] == pytest.approx(1.0) and all(pd.isna(before[f"cpu_{k}"]) for k in ("service", "envoy", "opa"))


@pytest.mark.parametrize(("cell", "engine"), [
    ({"topology": "central-entity", "engine": "envoy-compiled"}, "envoy-compiled"),
    ({"topology": "central-entity", "engine": "envoy-opa"}, "envoy-opa"),
    ({"topology": "central-entity"}, "envoy-opa"),  # recorded before engines were run
    ({"topology": "baseline", "engine": None}, "none"),
    ({"topology": "baseline"}, "none"),
])
def test_a_cells_engine_as_the_tables_name_it(cell, engine):
    assert stats.identity({**cell, "rate": 100, "services": 5, "repetition": 1})["engine"] == engine


def test_engine_comparison_sets_compiled_beside_envoy_opa_and_the_baseline():
    def case(topology, engine, services, median, achieved, saturated=False):
        return {"topology": topology, "engine": engine, "rate": 100, "services": services, "median": median,
                "achieved_rate": achieved, "saturated": saturated}
    table = pd.DataFrame([case("sidecar", "envoy-opa", 5, 40.0, 80.0, True), case("sidecar", "envoy-compiled", 5, 20.0, 100.0),
                          case("baseline", "none", 5, 10.0, 100.0), case("sidecar", "envoy-opa", 10, 90.0, 50.0, True)])
    cpu = table[stats.CASE].assign(total_ms=[20.0, 12.0, 8.0, 30.0])
    result = stats.engine_comparison(table, cpu)
    assert len(result) == 1  # 10 services ran under one engine only: nothing to compare
    row = result.iloc[0]
    assert (row["median_opa"], row["median_compiled"], row["median_ratio"]) == pytest.approx((40, 20, 0.5))
    assert row["achieved_rate_ratio"] == pytest.approx(100 / 80)
    assert row["total_ms_ratio"] == pytest.approx(12 / 20)
    assert (row["baseline_median"], row["baseline_total_ms"]) == pytest.approx((10, 8))
    assert bool(row["saturated_opa"]) and not bool(row["saturated_compiled"])
