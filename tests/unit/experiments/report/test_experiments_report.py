"""The reports built from the committed raw-results fixtures (fixtures/README.md): small-run,
recorded before engines were run, and two-engines; their tables checked against values worked
out by hand, their documents and figures written."""

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from experiments.__main__ import main
from experiments.report.report import bench_blocks, build
from tests.unit.experiments.markdown_text import compact

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "small-run"
TWO_ENGINES = Path(__file__).resolve().parents[1] / "fixtures" / "two-engines"


def built(fixture: Path, tmp_path_factory):
    """A copy of a fixture run with its report built: (run folder, report paths, tables by name)."""
    run_dir = tmp_path_factory.mktemp("results") / fixture.name
    shutil.copytree(fixture, run_dir)
    paths = build(run_dir)
    tables = {path.stem: pd.read_csv(path) for path in (run_dir / "report" / "tables").glob("*.csv")}
    return run_dir, paths, tables


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    return built(FIXTURE, tmp_path_factory)


def case(table, topology, services, engine=None):
    rows = table[(table["topology"] == topology) & (table["services"] == services)]
    if engine:
        rows = rows[rows["engine"] == engine]
    assert len(rows) == 1
    return rows.iloc[0]


def test_table_one_pools_the_repetitions(report):
    _, _, tables = report
    table = tables["table1"]
    assert len(table) == 4
    # 50..69 and 51..70 pooled: 50, 51, 51, ..., 69, 69, 70
    ce5 = case(table, "central-entity", 5)
    assert [ce5[c] for c in ("count", "min", "q1", "median", "q3", "p95", "max", "mean")] == [40, 50, 55, 60, 65, 69, 70, 60]
    # 100..119 and 101..118 pooled: 38 values
    ce10 = case(table, "central-entity", 10)
    assert [ce10[c] for c in ("count", "min", "q1", "median", "q3", "p95", "max", "mean")] == [38, 100, 105, 109.5, 114, 118, 119, 109.5]
    assert bool(ce10["saturated"]) and not bool(ce5["saturated"])
    # the 503 is an error, not an RTT
    base5 = case(table, "baseline", 5)
    assert (base5["count"], base5["min"], base5["median"], base5["errors"], base5["requests"]) == (40, 10, 20, 1, 41)
    assert bool(base5["saturated"])
    base10 = case(table, "baseline", 10)
    assert (base10["repetitions"], base10["q1"], base10["median"], base10["q3"]) == (1, 24.75, 29.5, 34.25)
    assert base10["p95"] == pytest.approx(38.05)


def test_cells_give_the_load_and_the_machine(report):
    _, _, tables = report
    cells = tables["cells"]
    assert len(cells) == 7
    saturated = cells[cells["saturated"]][["topology", "services", "repetition"]].values.tolist()
    assert saturated == [["central-entity", 10, 2], ["baseline", 5, 2]]
    assert case(cells[cells["repetition"] == 2], "central-entity", 10)["achieved_rate"] == pytest.approx(9.0)
    by_topology = cells.groupby("topology")
    assert by_topology["cpu_machine"].apply(list).to_dict() == {"central-entity": pytest.approx([1.5] * 4), "baseline": pytest.approx([1.1] * 3)}
    assert cells["cpu_other"].tolist() == pytest.approx([0.4] * 7)
    assert (cells["cpu_service"] + cells["cpu_envoy"] + cells["cpu_opa"]).tolist() == pytest.approx(cells["cpu_deployment"].tolist())


def test_cpu_per_record_and_enforcement_cpu_per_hop(report):
    _, _, tables = report
    cpu = tables["cpu_per_record"]
    ce5 = case(cpu, "central-entity", 5)  # 1 core at 10 records/s in both repetitions
    assert [ce5[c] for c in ("total_ms", "service_ms", "envoy_ms", "opa_ms")] == pytest.approx([100, 50, 20, 30])
    base10 = case(cpu, "baseline", 10)  # 0.6 cores at 10 records/s, one repetition
    assert [base10[c] for c in ("total_ms", "service_ms", "envoy_ms", "opa_ms")] == pytest.approx([60, 40, 20, 0])
    assert pd.isna(base10["enforcement_per_hop_ms"])
    ce10 = case(cpu, "central-entity", 10)  # rep2 carried 9 records/s: 1000/9 ms each
    assert ce10["total_ms"] == pytest.approx((100 + 1000 / 9) / 2)
    assert ce10["enforcement_per_hop_ms"] == pytest.approx(((100 + 1000 / 9) / 2 - 60) / 10)
    assert bool(ce10["saturated"]) and not bool(ce5["saturated"])


def test_w_avg_and_the_papers(report):
    _, _, tables = report
    w_avg = tables["w_avg"].set_index("topology")
    assert w_avg.loc["central-entity", "w_avg"] == pytest.approx((60 / 5 + 109.5 / 10) / 2)
    assert w_avg.loc["baseline", "w_avg"] == pytest.approx((20 / 5 + 29.5 / 10) / 2)
    assert pd.isna(w_avg.loc["central-entity", "paper_w_avg"])  # the paper has no 10 req/s


def test_spread_cost_and_time_split(report):
    _, _, tables = report
    spread = case(tables["repetitions"], "central-entity", 5)
    assert spread["medians"] == "59.500 60.500"
    assert spread["cv"] == pytest.approx((2 ** 0.5 / 2) / 60)
    cost = tables["enforcement_cost"]
    assert case(cost, "central-entity", 5)["cost_per_hop"] == pytest.approx((60 - 20) / 5)
    assert case(cost, "central-entity", 10)["cost_per_hop"] == pytest.approx((109.5 - 29.5) / 10)
    split = case(tables["time_split"], "central-entity", 5)
    assert split["service_ms"] == pytest.approx(5)
    assert split["transit_ms"] == pytest.approx(20 - 5)  # the baseline's mean RTT outside its 5 ms of services
    assert split["enforcement_ms"] == pytest.approx(60 - 5 - 15)
    assert split["enforcement_per_hop_ms"] == pytest.approx(8)


def test_documents_and_figures(report):
    run_dir, paths, _ = report
    markdown = compact(paths["markdown"].read_text())
    page = paths["html"].read_text()
    for heading in ("Table I", "W Avg: ours and the paper", "Where the time goes", "CPU per record", "Failed cells", "Method"):
        assert heading in markdown and heading in page
    assert "| Arch. | Call Freq. (req/s) | Num. Serv. | Min (ms) | Q1 (ms) | Median (ms) | Q3 (ms) | p95 (ms) | Max (ms) | Mean (ms) | STD | W Avg (ms) |" in markdown
    assert "| CE (envoy-opa) | 10 | 5 | 50.000 | 55.000 | 60.000 | 65.000 | 69.000 | 70.000 | 60.000 |" in markdown
    assert "| 10 † |" in markdown  # the saturated case is marked
    assert "svc-03 exited" in markdown
    figures = run_dir / "report" / "figures"
    for name in ("rtt_boxplots", "rtt_percentiles", "w_avg", "enforcement_per_hop", "time_split", "offered_vs_achieved", "cpu_per_record"):
        assert (figures / f"{name}.png").stat().st_size > 5000
        assert (figures / f"{name}.svg").exists()
        assert f"figures/{name}.png" in markdown
    assert page.count("data:image/png;base64,") == 7
    # recorded before the hops were kept: said, not drawn
    assert "no per-hop breakdown" in markdown and not (figures / "hops.png").exists()
    assert "<img" in page and "src='figures/" not in page  # self-contained


def test_a_run_recorded_before_engines_ran_envoy_opa(report):
    run_dir, paths, tables = report
    assert tables["cells"].groupby("topology")["engine"].unique().apply(list).to_dict() == {"central-entity": ["envoy-opa"], "baseline": ["none"]}
    markdown = compact(paths["markdown"].read_text())
    assert "This run was recorded before engines were run: its topologies ran envoy-opa." in markdown
    assert "This run measured one engine, envoy-opa: there is nothing to compare." in markdown
    assert tables["engines"].empty
    assert "| baseline 10 req/s 10 services rep 2 | svc-03 exited" in markdown  # a failed cell, named as before
    assert "What each part of a hop costs" not in markdown  # no raw/bench.csv: no section
    assert not (run_dir / "report" / "figures" / "engines.png").exists()


def test_a_run_recorded_before_targets_ran_locally(report):
    markdown = compact(report[1]["markdown"].read_text())
    assert "Target: **local** (processes on this machine, supervised; entry on loopback)." in markdown
    assert "Not measured on this target" not in markdown and "shared by Locust and every process of the deployment" in markdown


def test_a_k8s_run_names_its_context_and_nodes_and_what_it_did_not_measure(tmp_path):
    run_dir = tmp_path / "k8s-run"
    shutil.copytree(FIXTURE, run_dir)
    meta = json.loads((run_dir / "metadata.json").read_text())
    meta["target"] = {"target": "k8s", "context": "local", "server": "https://10.250.250.1:36443", "nodes": ["complyroute-node"],
                      "deploys_to": ["complyroute-node"], "one_node": True, "entry": "kubectl port-forward to the entry's Service",
                      "image": "complyroute/service:0.1.0"}
    meta["unmeasured"] = ["the deployment's CPU time and memory, by part or in total"]
    (run_dir / "metadata.json").write_text(json.dumps(meta))
    markdown = compact(build(run_dir)["markdown"].read_text())
    assert ("Target: **k8s**: kubectl context `local`, API server https://10.250.250.1:36443, nodes complyroute-node (deployed to "
            "complyroute-node, rendered for one node); entry: kubectl port-forward to the entry's Service") in markdown
    assert "Not measured on this target: the deployment's CPU time and memory, by part or in total." in markdown
    assert "the deployment's pods on the cluster's nodes (complyroute-node)" in markdown


def test_a_run_recorded_before_the_open_loop_is_named_closed_loop_everywhere(report):
    _, paths, tables = report
    for name in ("cells", "table1", "repetitions"):
        assert set(tables[name]["load"]) == {"closed loop"}, name
    assert (tables["cells"]["missed"] == 0).all() and (tables["cells"]["scheduled"] == tables["cells"]["requests"]).all()
    markdown = compact(paths["markdown"].read_text())
    assert "load: **closed loop** (10 req/s per Locust user)" in markdown
    assert "The load is a closed loop" in markdown and "under closed loop." in markdown
    # central-entity at 5 services: CV 1.2%, not flagged; at 10 a repetition is saturated: no CV
    spread = tables["repetitions"].set_index(["topology", "services"])
    assert not spread["cv_flagged"].any()
    assert "| CE (envoy-opa) | 10 | 10 | closed loop | 2 | 109.500 109.500 | saturated † | |" in markdown


def test_report_command_accepts_a_run_folder(tmp_path, capsys):
    run_dir = tmp_path / "small-run"
    shutil.copytree(FIXTURE, run_dir)
    assert main(["report", str(run_dir)]) == 0
    assert str(run_dir / "report" / "report.html") in capsys.readouterr().out
    assert main(["--results", str(tmp_path), "report", "no-such-run"]) == 2


# ---- two engines (fixtures/two-engines) ----------------------------------------------------

@pytest.fixture(scope="module")
def engines_report(tmp_path_factory):
    return built(TWO_ENGINES, tmp_path_factory)


def test_every_table_has_the_engine_and_the_baseline_none(engines_report):
    _, _, tables = engines_report
    for name in ("cells", "table1", "w_avg", "repetitions", "time_split", "cpu_per_record"):
        engines = tables[name].groupby("topology")["engine"].unique().apply(sorted).to_dict()
        assert engines == {"central-entity": ["envoy-compiled", "envoy-opa"], "sidecar": ["envoy-compiled", "envoy-opa"], "baseline": ["none"]}, name
    assert set(tables["enforcement_cost"]["engine"]) == {"envoy-opa", "envoy-compiled"}  # the baseline is what it is compared with


def test_table_one_and_w_avg_per_engine(engines_report):
    _, _, tables = engines_report
    table = tables["table1"]
    # 20 requests with RTTs 30..49 ms
    compiled = case(table, "central-entity", 5, "envoy-compiled")
    assert [compiled[c] for c in ("count", "min", "q1", "median", "q3", "max", "mean")] == [20, 30, 34.75, 39.5, 44.25, 49, 39.5]
    opa10 = case(table, "central-entity", 10, "envoy-opa")  # 18 requests in 2 s: 9 req/s of 10, saturated
    assert (opa10["count"], opa10["median"], bool(opa10["saturated"])) == (18, 108.5, True)
    assert not bool(case(table, "central-entity", 10, "envoy-compiled")["saturated"])
    w_avg = tables["w_avg"].set_index(["topology", "engine"])
    assert w_avg.loc[("central-entity", "envoy-opa"), "w_avg"] == pytest.approx((59.5 / 5 + 108.5 / 10) / 2)
    assert w_avg.loc[("central-entity", "envoy-compiled"), "w_avg"] == pytest.approx((39.5 / 5 + 69.5 / 10) / 2)
    assert w_avg.loc[("baseline", "none"), "w_avg"] == pytest.approx((19.5 / 5 + 29.5 / 10) / 2)
    # a topology's engines side by side, as the paper's value stands beside both
    assert tables["w_avg"][["topology", "engine"]].values.tolist()[:2] == [["central-entity", "envoy-opa"], ["central-entity", "envoy-compiled"]]


def test_both_engines_against_one_baseline(engines_report):
    _, _, tables = engines_report
    cost = tables["enforcement_cost"]
    assert case(cost, "central-entity", 5, "envoy-opa")["cost_per_hop"] == pytest.approx((59.5 - 19.5) / 5)
    assert case(cost, "central-entity", 5, "envoy-compiled")["cost_per_hop"] == pytest.approx((39.5 - 19.5) / 5)
    assert case(cost, "sidecar", 10, "envoy-compiled")["cost_per_hop"] == pytest.approx((89.5 - 29.5) / 10)
    split = case(tables["time_split"], "central-entity", 5, "envoy-compiled")
    assert split["transit_ms"] == pytest.approx(19.5 - 5)  # the baseline's mean RTT outside its 5 ms of services
    assert split["enforcement_ms"] == pytest.approx(39.5 - 5 - 14.5)
    assert split["enforcement_per_hop_ms"] == pytest.approx(4)
    cpu = tables["cpu_per_record"]
    compiled = case(cpu, "central-entity", 5, "envoy-compiled")  # 0.8 cores at 10 records/s
    assert [compiled[c] for c in ("total_ms", "service_ms", "envoy_ms", "opa_ms")] == pytest.approx([80, 50, 25, 5])
    assert compiled["enforcement_per_hop_ms"] == pytest.approx((80 - 60) / 5)
    assert case(cpu, "central-entity", 10, "envoy-opa")["total_ms"] == pytest.approx(1000 / 9)  # 1 core at 9 records/s


def test_engine_comparison_per_topology(engines_report):
    _, _, tables = engines_report
    engines = tables["engines"]
    assert engines[["topology", "services"]].values.tolist() == [["central-entity", 5], ["central-entity", 10], ["sidecar", 5], ["sidecar", 10]]
    ce5 = case(engines, "central-entity", 5)
    assert [ce5[c] for c in ("median_opa", "median_compiled", "baseline_median")] == [59.5, 39.5, 19.5]
    assert [ce5[c] for c in ("median_ratio", "achieved_rate_ratio", "total_ms_ratio")] == pytest.approx([39.5 / 59.5, 1.0, 80 / 100])
    ce10 = case(engines, "central-entity", 10)
    assert [ce10[c] for c in ("median_ratio", "achieved_rate_ratio", "total_ms_ratio")] == pytest.approx([69.5 / 108.5, 10 / 9, 80 / (1000 / 9)])
    assert bool(ce10["saturated_opa"]) and not bool(ce10["saturated_compiled"])
    sa10 = case(engines, "sidecar", 10)
    assert [sa10[c] for c in ("median_ratio", "total_ms_ratio", "baseline_total_ms")] == pytest.approx([89.5 / 149.5, 90 / 120, 60])


def test_the_report_names_the_engine_of_every_figure(engines_report):
    run_dir, paths, _ = engines_report
    markdown = compact(paths["markdown"].read_text())
    page = paths["html"].read_text()
    for heading in ("## Engines compared: compiled against envoy-opa", "### CE", "### SA", "## What each part of a hop costs, beside its floor"):
        assert heading in markdown
    assert "<h3 id=\"ce\">CE</h3>" in page
    assert "| CE (compiled) | 10 | 5 | 30.000 | 34.750 | 39.500 | 44.250 | 48.050 | 49.000 | 39.500 |" in markdown  # Table I
    assert "| CE (envoy-opa) | 10 | 10 † | 108.500 | 29.500 | 7.900 |" in markdown  # enforcement per hop
    assert "| SA (compiled) | 10 | 5 | 90.000 | 50.000 | 35.000 | 5.000 | 6.000 |" in markdown  # CPU per record
    assert "| 10 | 10 | 108.500 † | 69.500 | 0.64× | 29.500 | 9.0 † | 10.0 | 1.11× | 111.111 | 80.000 | 0.72× | 60.000 |" in markdown
    assert "its architecture = envoy-opa" in markdown  # W Avg beside the paper's
    assert "This run measured envoy-opa and compiled." in markdown
    figures = run_dir / "report" / "figures"
    for name in ("rtt_boxplots", "rtt_percentiles", "w_avg", "enforcement_per_hop", "time_split", "offered_vs_achieved", "cpu_per_record",
                 "engines", "bench"):
        assert (figures / f"{name}.png").stat().st_size > 5000
        assert f"figures/{name}.png" in markdown
    assert page.count("data:image/png;base64,") == 9


def test_the_bench_table_and_how_to_read_it(engines_report):
    _, paths, _ = engines_report
    markdown = compact(paths["markdown"].read_text())
    assert "Read the ratio, not the value: 1× is the floor itself, 1.3× means 30% more CPU than the floor" in markdown
    assert "Measured at the start of session 1 (2026-11-22T09:00:00+0000): 3 rounds of 1000 sequential records per part, 95 s." in markdown
    assert "| Part | Process | CPU | Floor | Floor's CPU | Ratio to the floor | Target | Verdict |" in markdown
    assert ("| compiled engine: Envoy deciding the hop | envoy-compiled/envoy | 0.28 ms CPU/request | Envoy, router filter only | 0.2 "
            "| 1.40× | ≤ 1.3× | NOT MET |") in markdown
    assert "| service hop, beyond its work | service | 0.5 ms CPU/request | service hop floor (Fastify + undici) | 0.4 | 1.25× | ≤ 1.5× | met |" in markdown
    assert "| Envoy, router filter only | bare-envoy | 0.2 ms CPU/request | | – | – | | |" in markdown  # a floor itself


def bench_text(run_dir: Path, meta: dict) -> str:
    """The bench section's text as the report would write it for this metadata."""
    (run_dir / "figures").mkdir(exist_ok=True)
    return "\n".join(str(content[0]) for kind, *content in bench_blocks(run_dir, meta, run_dir / "figures") if kind in ("h2", "p"))


def test_a_failed_bench_is_reported_and_an_earlier_sessions_bench_named(tmp_path):
    run_dir = tmp_path / "two-engines"
    shutil.copytree(TWO_ENGINES, run_dir)
    meta = json.loads((run_dir / "metadata.json").read_text())
    (run_dir / "raw" / "bench.csv").rename(run_dir / "raw" / "bench-session1.csv")  # what the runner keeps of session 1's
    meta["sessions"][0]["bench"]["csv"] = "bench-session1.csv"
    meta["sessions"].append({"started_at": "2026-11-23T09:00:00+0000", "bench": {"records": 1000, "rounds": 3, "error": "RuntimeError: bench: sink did not start"}})
    text = bench_text(run_dir, meta)
    assert "The bench failed in session 2: RuntimeError: bench: sink did not start" in text
    assert "Read the ratio" not in text  # no session left a bench.csv to show

    shutil.copy(run_dir / "raw" / "bench-session1.csv", run_dir / "raw" / "bench.csv")
    meta["sessions"][1]["bench"] = {"csv": "bench.csv", "records": 500, "rounds": 2, "seconds": 40.0, "targets_not_met": []}
    text = bench_text(run_dir, meta)
    assert "Measured at the start of session 2 (2026-11-23T09:00:00+0000): 2 rounds of 500 sequential records per part, 40 s." in text
    assert "Earlier sessions' measurements: `raw/bench-session1.csv`." in text


def test_a_run_without_bench_csv_has_no_bench_section(tmp_path):
    run_dir = tmp_path / "two-engines"
    shutil.copytree(TWO_ENGINES, run_dir)
    (run_dir / "raw" / "bench.csv").unlink()
    assert bench_blocks(run_dir, json.loads((run_dir / "metadata.json").read_text()), run_dir) == []


# ---- an open-loop run -----------------------------------------------------------------

OPEN_LOOP_COLUMNS = ["t_intended_ms", "t_send_ms", "rtt_ms", "service_time_ms", "status", "missed", "record", "expected", "hops",
                     "service_ms", "forward_ms", "back_ms", "entry_ms", "exit_ms"]  # as experiments/load/locustfile.py writes them

def open_loop_run(run_dir: Path, medians: dict) -> None:
    """A run of the open loop with Poisson arrivals, built from two-engines' metadata and
    cpu.csv: central-entity (envoy-opa) and the baseline at 10 req/s, 5 services, 3 repetitions;
    warm-up 1 s, window 2 s. Every sent request takes its repetition's median; the window's
    fourth request was sent 40 ms late, and in central-entity's first repetition its last one
    was missed (the sender late beyond its tolerance)."""
    meta = json.loads((TWO_ENGINES / "metadata.json").read_text())
    meta["run_id"] = run_dir.name
    meta["parameters"].update({"topologies": ["central-entity", "baseline"], "engines": ["envoy-opa"], "services": [5], "repetitions": 3,
                               "load": "open", "arrivals": "poisson", "max_in_flight": 1000, "late_tolerance_ms": 100.0})
    (run_dir / "raw").mkdir(parents=True)
    (run_dir / "metadata.json").write_text(json.dumps(meta))
    for (topology, engine), per_repetition in medians.items():
        for repetition, median in enumerate(per_repetition, 1):
            key = f"{topology}_{engine}_r10_n5_rep{repetition}" if engine else f"{topology}_r10_n5_rep{repetition}"
            cell_dir = run_dir / "raw" / key
            cell_dir.mkdir()
            shutil.copy(TWO_ENGINES / "raw" / "baseline_r10_n5_rep1" / "cpu.csv", cell_dir)
            cell = json.loads((TWO_ENGINES / "raw" / "baseline_r10_n5_rep1" / "cell.json").read_text())
            cell.update({"cell": {"topology": topology, "engine": engine, "rate": 10, "services": 5, "repetition": repetition},
                         "load": "open", "arrivals": "poisson", "max_in_flight": 1000, "late_tolerance_ms": 100.0, "seed": repetition})
            del cell["user_rate"]
            (cell_dir / "cell.json").write_text(json.dumps(cell))
            rows = []
            for k in range(30):  # 10 in the warm-up, 20 in the window
                intended = 1800000080000.0 + 100 * k
                if topology == "central-entity" and repetition == 1 and k == 29:
                    rows.append({"t_intended_ms": intended, "status": 0, "missed": "late", "record": "allowed", "expected": 200})
                    continue
                late = 40.0 if k == 13 else 0.0
                rows.append({"t_intended_ms": intended, "t_send_ms": intended + late, "rtt_ms": median + late, "service_time_ms": median,
                             "status": 200, "record": "allowed", "expected": 200, "hops": 5, "service_ms": 5.0,
                             "forward_ms": median - 8.0, "back_ms": 0.0, "entry_ms": 2.0, "exit_ms": 1.0})
            pd.DataFrame(rows, columns=OPEN_LOOP_COLUMNS).to_csv(cell_dir / "requests.csv.gz", index=False)


def test_an_open_loop_run_names_its_load_counts_its_misses_and_flags_disagreeing_repetitions(tmp_path):
    run_dir = tmp_path / "open-loop"
    # central-entity: mean 100, sample standard deviation 12, CV 12%; the baseline: 5%
    open_loop_run(run_dir, {("central-entity", "envoy-opa"): [88.0, 100.0, 112.0], ("baseline", None): [19.0, 20.0, 21.0]})
    paths = build(run_dir)
    tables = {path.stem: pd.read_csv(path) for path in (run_dir / "report" / "tables").glob("*.csv")}
    for name in ("cells", "table1", "repetitions"):
        assert set(tables[name]["load"]) == {"open loop, Poisson arrivals"}, name
    cells = tables["cells"].set_index(["topology", "repetition"])
    assert (cells.loc[("central-entity", 1), "scheduled"], cells.loc[("central-entity", 1), "missed"]) == (20, 1)
    assert not cells["saturated"].any()  # 19 of 20 sent: 95%, kept
    assert cells.loc[("baseline", 1), ["median", "median_service_time"]].tolist() == pytest.approx([19.0, 19.0])
    spread = tables["repetitions"].set_index("topology")
    assert spread["cv"].tolist() == pytest.approx([0.12, 0.05])
    assert spread["cv_flagged"].tolist() == [True, False]
    split = tables["time_split"].set_index("topology")
    assert split.loc["baseline", "send_lag_ms"] == pytest.approx(40 / 20)  # one request in 20 sent 40 ms late
    markdown = compact(paths["markdown"].read_text())
    assert "load: **open loop, Poisson arrivals** (at most 1000 requests in flight, a send more than 100 ms late is missed)" in markdown
    assert "The load is an open loop" in markdown
    assert "**1 of 120 scheduled requests were missed**" in markdown
    assert "**1 case(s) not saturated whose repetitions' medians vary by more than 10%**" in markdown
    assert "CE (envoy-opa) 10 req/s 5 services (12.0%)" in markdown
    assert "| CE (envoy-opa) | 10 | 5 | open loop, Poisson arrivals | 3 | 88.000 100.000 112.000 | 12.0% | over 10% |" in markdown
    assert "| baseline | 10 | 5 | open loop, Poisson arrivals | 3 | 19.000 20.000 21.000 | 5.0% | |" in markdown
    assert "| 1 of 20 |" in markdown
    assert "under open loop, Poisson arrivals (RTT from each record's intended send time)" in markdown
