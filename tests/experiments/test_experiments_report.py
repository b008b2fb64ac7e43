"""The report built from the committed raw-results fixture (fixtures/README.md): its tables
checked against values worked out by hand, its documents and figures written."""

import shutil
from pathlib import Path

import pandas as pd
import pytest

from experiments.__main__ import main
from experiments.report import build

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "small-run"


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("results") / "small-run"
    shutil.copytree(FIXTURE, run_dir)
    paths = build(run_dir)
    tables = {path.stem: pd.read_csv(path) for path in (run_dir / "report" / "tables").glob("*.csv")}
    return run_dir, paths, tables


def case(table, topology, services):
    rows = table[(table["topology"] == topology) & (table["services"] == services)]
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
    markdown = paths["markdown"].read_text()
    page = paths["html"].read_text()
    for heading in ("Table I", "W Avg: ours and the paper", "Where the time goes", "CPU per record", "Failed cells", "Method"):
        assert heading in markdown and heading in page
    assert "| Arch. | Call Freq. (req/s) | Num. Serv. | Min (ms) | Q1 (ms) | Median (ms) | Q3 (ms) | p95 (ms) | Max (ms) | Mean (ms) | STD | W Avg (ms) |" in markdown
    assert "| CE | 10 | 5 | 50.000 | 55.000 | 60.000 | 65.000 | 69.000 | 70.000 | 60.000 |" in markdown
    assert "| 10 † |" in markdown  # the saturated case is marked
    assert "svc-03 exited" in markdown
    figures = run_dir / "report" / "figures"
    for name in ("rtt_boxplots", "w_avg", "enforcement_per_hop", "time_split", "offered_vs_achieved", "cpu_per_record"):
        assert (figures / f"{name}.png").stat().st_size > 5000
        assert (figures / f"{name}.svg").exists()
        assert f"figures/{name}.png" in markdown
    assert page.count("data:image/png;base64,") == 6
    assert "<img" in page and "src='figures/" not in page  # self-contained


def test_report_command_accepts_a_run_folder(tmp_path, capsys):
    run_dir = tmp_path / "small-run"
    shutil.copytree(FIXTURE, run_dir)
    assert main(["report", str(run_dir)]) == 0
    assert str(run_dir / "report" / "report.html") in capsys.readouterr().out
    assert main(["--results", str(tmp_path), "report", "no-such-run"]) == 2
