"""The testbed model (experiments/analysis/model.py): queueing theory where it is known, the paths the
placements lay out, the bench it reads, and the command on a small run folder."""

import json
import math
import shutil
from pathlib import Path

import pandas as pd
import pytest

from experiments.__main__ import main
from experiments.analysis import bench_sum, model, model_predict, stats
from experiments.report import model_report
from tests.unit.experiments.markdown_text import compact

TWO_ENGINES = Path(__file__).resolve().parents[1] / "fixtures" / "two-engines"
COSTS = model.Costs(service=1.0, forwarding=0.25, decision_envoy=0.6, decision_opa=0.9, compiled_envoy=0.3, entry_opa=0.9)
ONE_PART = [model.Visit("part", "service", "node", cpu_ms=5.0)]  # 5 ms of CPU: 200 records/s on one core


def test_one_part_at_half_load_is_m_m_1():
    # M/M/1, service 5 ms, 100 arrivals/s: utilisation 0.5, mean wait rho S / (1 - rho) = 5 ms,
    # mean response S / (1 - rho) = 10 ms, exponentially distributed: median 10 ln 2.
    predicted = model.simulate(ONE_PART, {"node": 1}, 100, seconds=600, max_records=60000, seed=7)
    assert not predicted.saturated
    assert predicted.capacity == pytest.approx(200)
    assert predicted.mean_wait == pytest.approx(5.0, rel=0.1)
    assert predicted.mean == pytest.approx(10.0, rel=0.1)
    assert predicted.median == pytest.approx(10 * math.log(2), rel=0.1)


def test_constant_service_times_give_pollaczek_khinchine():
    # M/D/1 at utilisation 0.5: mean wait rho S / (2 (1 - rho)) = 2.5 ms.
    predicted = model.simulate(ONE_PART, {"node": 1}, 100, service="constant", seconds=600, max_records=60000, seed=7)
    assert predicted.mean_wait == pytest.approx(2.5, rel=0.1)


def test_a_part_at_full_load_is_saturated_not_a_number():
    predicted = model.simulate(ONE_PART, {"node": 1}, 200)
    assert predicted.saturated
    assert predicted.median is None and predicted.mean is None and predicted.p95 is None
    assert predicted.bottleneck == "part" and predicted.capacity == pytest.approx(200)


def test_a_closed_loop_past_its_capacity_carries_its_capacity_and_is_saturated():
    # 40 users of 10 records/s each offer 400/s to a part that carries 200/s.
    predicted = model.simulate(ONE_PART, {"node": 1}, 400, arrivals="closed", user_rate=10, seconds=20)
    assert predicted.saturated and predicted.median is None
    assert predicted.achieved_rate == pytest.approx(200, rel=0.1)


def test_threads_and_cores_bound_capacity():
    # Two single-thread processes on one core: the node (1 core, 10 ms a record) is the bottleneck.
    path = [model.Visit("a", "service", "node", 5.0), model.Visit("b", "service", "node", 5.0)]
    assert model.capacity(path, {"node": 1}) == (pytest.approx(100), "node node")
    # On 4 cores each process's one thread is: 200 records/s each.
    assert model.capacity(path, {"node": 4})[0] == pytest.approx(200)


def test_idle_cpu_leaves_a_node_less_for_records():
    # Two single-thread processes on one core, 5 ms each: 100 records/s; half the core idle-busy: 50.
    path = [model.Visit("a", "service", "node", 5.0), model.Visit("b", "service", "node", 5.0)]
    assert model.capacity(path, {"node": 1}, idle={"node": 500.0})[0] == pytest.approx(50)
    busy = model.simulate(path, {"node": 1}, 40, service="constant", idle={"node": 500.0}, seconds=60, seed=3)
    quiet = model.simulate(path, {"node": 1}, 40, service="constant", seconds=60, seed=3)
    assert not busy.saturated and busy.mean_wait > 1.5 * quiet.mean_wait  # records wait behind the node's idle CPU
    assert model.simulate(path, {"node": 1}, 60, idle={"node": 500.0}).saturated and not model.simulate(path, {"node": 1}, 60).saturated


def test_fixed_delays_add_to_the_rtt():
    without = model.simulate(ONE_PART, {"node": 1}, 10, service="constant", seconds=20)
    with_delay = model.simulate(ONE_PART, {"node": 1}, 10, service="constant", seconds=20, delays={"service": 3.0})
    assert with_delay.median - without.median == pytest.approx(3.0, abs=0.2)


def chain(first: list[str], hop) -> list[str]:
    """The processes of a 5-service chain: the entry's, then each later hop's (hop(i): into svc-0i)."""
    return first + [name for i in range(2, 6) for name in hop(i)]


@pytest.mark.parametrize("topology, engine, processes", [
    ("central-entity", "envoy-opa", chain(["central-entity/envoy", "central-entity/opa", "svc-01"],
                                          lambda i: ["central-entity/envoy", "central-entity/opa", f"svc-0{i}"])),
    # The compiled engine decides later hops in Envoy alone; the entry, fed by clients, still asks OPA.
    ("central-entity", "envoy-compiled", chain(["central-entity/envoy", "central-entity/opa", "svc-01"],
                                               lambda i: ["central-entity/envoy", f"svc-0{i}"])),
    ("sidecar", "envoy-opa", chain(["entry/envoy", "entry/opa", "sidecar-svc-01/envoy", "svc-01"],
                                   lambda i: [f"sidecar-svc-0{i - 1}/envoy", f"sidecar-svc-0{i - 1}/opa", f"sidecar-svc-0{i}/envoy", f"svc-0{i}"])),
    ("baseline", None, ["gateway/envoy", "svc-01", "svc-02", "svc-03", "svc-04", "svc-05"]),
])
def test_a_records_path_is_the_placements(topology, engine, processes):
    assert [v.process for v in model.record_path(topology, engine, 5, COSTS)] == processes


def test_dynamic_routers_decide_on_the_service_nodes():
    path = model.record_path("dynamic-router-3", "envoy-opa", 5, COSTS)
    deciding = [v for v in path if v.kind == "envoy"]
    assert deciding[0].node == "gateway" and deciding[0].threads == 2  # the entry, gateway_concurrency
    assert {v.node for v in deciding[1:]} == {"node-1", "node-2", "node-3"} and all(v.threads == 1 for v in deciding[1:])
    assert [v.threads for v in path if v.kind == "opa"] == [1, 1, 1, 1, 1]  # Go: every point's GOMAXPROCS


def test_costs_from_a_bench_and_a_bench_without_a_row(tmp_path):
    rows = [{"part": name, "process": process, "value": value, "unit": model.CPU_UNIT}
            for (name, process), value in zip(model.BENCH_PROCESSES.items(), [1.0, 0.25, 0.6, 0.9, 0.3])]
    rows.append({"part": "decision through ext_authz: inside the plugin (wall time)", "process": "envoy-opa/opa", "value": 0.4,
                 "unit": "ms/decision"})
    # The same Envoy again, without its access log and hop counters: a comparison, not the part's cost.
    rows.append({"part": "decision through ext_authz: Envoy without its access log and hop counters", "process": "envoy-opa/envoy",
                 "value": 5.0, "unit": model.CPU_UNIT})
    pd.DataFrame(rows).to_csv(tmp_path / "bench.csv", index=False)
    assert model.Costs.from_bench(tmp_path / "bench.csv") == COSTS  # the wall-time row of the same process is not CPU
    pd.DataFrame(rows[1:]).to_csv(tmp_path / "bench.csv", index=False)
    with pytest.raises(model.ModelError, match="service-work"):
        model.Costs.from_bench(tmp_path / "bench.csv")


def full_bench(run_dir: Path) -> None:
    """The fixture's bench with the rows the model reads that it lacks."""
    bench = bench_sum.read(run_dir / "raw" / "bench.csv")
    extra = [{"part": name, "process": process, "value": value, "unit": model.CPU_UNIT}
             for (name, process), value in zip(model.BENCH_PROCESSES.items(), [1.0, 0.25, 0.6, 0.9, 0.3])
             if process not in set(bench["process"])]
    pd.concat([bench, pd.DataFrame(extra)]).to_csv(run_dir / "raw" / "bench.csv", index=False)


def test_the_model_command_writes_its_section(tmp_path, capsys):
    run_dir = tmp_path / "two-engines"
    shutil.copytree(TWO_ENGINES, run_dir)
    full_bench(run_dir)
    assert main(["model", str(run_dir), "--paper-rates", "100", "--paper-services", "5", "--seconds", "4"]) == 0
    report = run_dir / "report"
    assert f"model: {report / 'model.html'}" in capsys.readouterr().out
    for name in ("model.md", "model.html", "figures/model.png", "figures/model.svg", "tables/model_this_machine.csv",
                 "tables/model_paper_testbed.csv", "tables/model_w_avg.csv"):
        assert (report / name).exists(), name
    validation = pd.read_csv(report / "tables" / "model_this_machine.csv")
    assert len(validation) == 10  # every case of the run
    paper = pd.read_csv(report / "tables" / "model_paper_testbed.csv")
    assert set(paper["topology"]) == {"central-entity", "dynamic-router-3", "dynamic-router-6", "sidecar", "baseline"}
    assert "| Arch. | rate | paper W Avg (ms) |" in compact((report / "model.md").read_text())


def test_the_model_command_refuses_a_run_without_the_benchs_rows(tmp_path, capsys):
    run_dir = tmp_path / "two-engines"
    shutil.copytree(TWO_ENGINES, run_dir)
    assert main(["model", str(run_dir)]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "has no row for service-work" in error
    assert main(["--results", str(tmp_path / "nothing"), "model"]) == 2
    assert "no run with a bench" in capsys.readouterr().err


@pytest.mark.parametrize("parameters, arrivals", [
    ({"load": "open", "arrivals": "poisson", "user_rate": 10}, "poisson"),
    ({"load": "open", "user_rate": 10}, "constant"),  # the open loop's default arrivals
])
def test_an_open_loop_run_is_modelled_with_its_arrivals_allowed(parameters, arrivals):
    load = model_predict.RunLoad.of(parameters)
    assert load.arrivals == arrivals and "open loop" in load.describe()


@pytest.mark.parametrize("parameters", [{"load": "closed", "user_rate": 5}, {"user_rate": 5}])  # runs before the open loop: closed
def test_a_closed_loop_run_is_not_modelled_as_an_open_one_denied(parameters):
    load = model_predict.RunLoad.of(parameters)
    assert (load.arrivals, load.user_rate) == ("closed", 5.0) and "closed loop (users of 5 req/s" in load.describe()


def compared(cvs: list[float | None], repetitions: int) -> pd.DataFrame:
    return pd.DataFrame({"measured_cv": cvs, "repetitions": [repetitions] * len(cvs)})


def test_the_measurements_own_spread_is_set_beside_the_errors_allowed():
    line = model_report.measurement_spread(compared([0.05, 0.12, 0.08], repetitions=2))
    assert line.startswith("the measurement's own spread: the medians of the compared cases' 2 repetitions")
    assert "8.0% (median; at most 12.0%, 1 of 3 above 10%)" in line


def test_one_repetition_says_its_spread_is_not_measured_denied():
    line = model_report.measurement_spread(compared([None, None], repetitions=1))
    assert line.startswith("one repetition per case") and "--repetitions 2" in line


def test_the_model_of_an_open_loop_run_says_so(tmp_path):
    run_dir = tmp_path / "two-engines"
    shutil.copytree(TWO_ENGINES, run_dir)
    full_bench(run_dir)
    meta_path = run_dir / "metadata.json"
    meta = json.loads(meta_path.read_text())
    meta["parameters"].update(load="open", arrivals="constant")
    meta_path.write_text(json.dumps(meta))
    _, calibration, _ = model_predict.this_machine(run_dir, seconds=4)
    assert calibration.load == model_predict.RunLoad("constant", float(meta["parameters"].get("user_rate", 10)))


TRUE_COSTS = model.Costs(service=1.5, forwarding=0.4, decision_envoy=0.9, decision_opa=0.3, compiled_envoy=0.45, entry_opa=2.5)
IDLE = {"service": 2.0, "envoy": 3.0, "opa": 1.0}  # ms of CPU per second per process


def measured_cells(cases, rates, costs=TRUE_COSTS, saturated=()) -> pd.DataFrame:
    """Cells as a run would measure them if each part cost `costs` per visit plus IDLE per process."""
    rows = []
    for topology, engine in cases:
        for services in (5, 10):
            for rate in rates:
                count = model.visits(topology, engine, services)
                running = model.processes(topology, engine, services)
                rows.append({"topology": topology, "engine": engine or stats.NO_ENGINE, "rate": rate, "services": services, "achieved_rate": rate,
                             "saturated": (topology, rate) in saturated,
                             **{f"cpu_{kind}": (sum(rate * count[part] * getattr(costs, part) for part in parts)
                                                + IDLE[kind] * running[kind]) / 1000
                                for kind, parts in model.PARTS_OF_CPU_KIND.items()}})
    return pd.DataFrame(rows)


EVERY_CASE = [("central-entity", "envoy-opa"), ("central-entity", "envoy-compiled"), ("sidecar", "envoy-opa"),
              ("sidecar", "envoy-compiled"), ("baseline", None)]


def test_costs_under_load_are_the_cells_cpu_per_visit_allowed():
    # A saturated cell is left out of the fit: its CPU (here a wrong one) does not move it.
    cells = measured_cells(EVERY_CASE, (20, 40))
    wrong = measured_cells([("sidecar", "envoy-opa")], (80,), costs=model.Costs(*(10.0,) * 6), saturated=[("sidecar", 80)])
    fitted = model.costs_under_load(pd.concat([cells, wrong]), COSTS)
    assert fitted.cells == len(cells) and fitted.from_bench == []
    for part in model.COST_PARTS:
        assert getattr(fitted.costs, part) == pytest.approx(getattr(TRUE_COSTS, part), rel=1e-6), part
    assert fitted.idle_ms_per_s == pytest.approx(IDLE)


def test_costs_under_load_need_two_rates_below_capacity_denied():
    assert model.costs_under_load(measured_cells(EVERY_CASE, (20,)), COSTS) is None
    assert model.costs_under_load(measured_cells(EVERY_CASE, (20, 40), saturated=[(t, 40) for t, _ in EVERY_CASE]), COSTS) is None


def test_a_part_no_cell_visits_keeps_the_benchs_cost():
    fitted = model.costs_under_load(measured_cells([("central-entity", "envoy-opa"), ("baseline", None)], (20, 40)), COSTS)
    assert fitted.from_bench == ["compiled_envoy"] and fitted.costs.compiled_envoy == COSTS.compiled_envoy
    assert fitted.costs.decision_envoy == pytest.approx(TRUE_COSTS.decision_envoy)


def test_the_entry_decision_costs_its_own():
    path = model.record_path("central-entity", "envoy-compiled", 5, TRUE_COSTS)
    assert [v.cpu_ms for v in path if v.kind == "opa"] == [TRUE_COSTS.entry_opa]  # the entry's, issuing the label token
    assert model.visits("central-entity", "envoy-opa", 5) == {"service": 5, "forwarding": 0, "decision_envoy": 5, "decision_opa": 4,
                                                            "compiled_envoy": 0, "entry_opa": 1}


def capacity_run(folder: Path, steps: list[tuple]) -> Path:
    """A capacity run's raw steps: (topology, engine, services, step, offered rate, held) each."""
    from experiments.design.capacity import STEP_COLUMNS
    (folder / "raw").mkdir(parents=True)
    rows = [dict.fromkeys(STEP_COLUMNS, "") | {"topology": t, "engine": e, "services": n, "step": k, "offered_rate": r, "held": h,
                                                "why_not": "" if h else "p99 900 ms > 500 ms"}
            for t, e, n, k, r, h in steps]
    pd.DataFrame(rows, columns=list(STEP_COLUMNS)).to_csv(folder / "raw" / "steps.csv", index=False)
    (folder / "metadata.json").write_text(json.dumps({"parameters": {"gap": 0.1}}))
    return folder


CALIBRATION = model_predict.Calibration(delays={}, cells=[], client_cpu_ms=0.5, load=model_predict.RunLoad("constant", 10.0), under_load=None)


def test_a_searched_capacity_is_set_beside_the_models_allowed(tmp_path):
    run = capacity_run(tmp_path / "capacity", [("central-entity", "envoy-opa", 5, 1, 50, True), ("central-entity", "envoy-opa", 5, 2, 100, False),
                                               ("central-entity", "envoy-opa", 5, 3, 75, True), ("central-entity", "envoy-opa", 5, 4, 87, False)])
    [row] = model_report.against_capacity_searches([run], COSTS, CALIBRATION, cores=2).to_dict("records")
    path = model.on_one_node(model.record_path("central-entity", "envoy-opa", 5, COSTS), 0.5)
    assert (row["searched"], row["predicted"]) == (75, pytest.approx(model.capacity(path, {model.ONE_NODE: 2})[0]))
    assert row["error"] == pytest.approx(row["predicted"] / 75 - 1)


def test_a_capped_search_has_no_capacity_to_compare_denied(tmp_path):
    run = capacity_run(tmp_path / "capacity", [("baseline", "none", 5, 1, 50, True), ("baseline", "none", 5, 2, 100, True)])
    [row] = model_report.against_capacity_searches([run], COSTS, CALIBRATION, cores=2).to_dict("records")
    assert pd.isna(row["searched"]) and pd.isna(row["error"]) and row["predicted"] > 0
    with pytest.raises(model.ModelError, match="not a capacity run"):
        model_report.against_capacity_searches([tmp_path], COSTS, CALIBRATION, cores=2)


def test_the_model_command_sets_capacity_runs_beside_it(tmp_path, capsys):
    run_dir = tmp_path / "two-engines"
    shutil.copytree(TWO_ENGINES, run_dir)
    full_bench(run_dir)
    searched = capacity_run(tmp_path / "capacity", [("sidecar", "envoy-opa", 5, 1, 50, True), ("sidecar", "envoy-opa", 5, 2, 100, False)])
    assert main(["model", str(run_dir), "--paper-rates", "100", "--paper-services", "5", "--seconds", "2", "--capacity", str(searched)]) == 0
    table = pd.read_csv(run_dir / "report" / "tables" / "model_capacity.csv")
    assert table[["topology", "engine", "services", "searched"]].values.tolist() == [["sidecar", "envoy-opa", 5, 50]]
    assert "capacity predicted against the capacity searches" in (run_dir / "report" / "model.md").read_text()
    assert main(["model", str(run_dir), "--capacity", str(tmp_path / "nothing")]) == 2
    assert "not a capacity run" in capsys.readouterr().err
