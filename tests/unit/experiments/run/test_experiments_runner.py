"""The runner's parts that need no deployment: which engine a cell deploys, which cells a
resumed run has finished, the bench a session measures before its cells, and the command
line's engines. Deployments, the bench and the Runner itself are replaced by stand-ins that
record what they were asked: nothing here starts a process."""

import io
import json
import shutil
import sys
import types
from pathlib import Path

import pytest

import experiments.run
from complyroute.client import Answer
from complyroute.runtime.local import deployment
from complyroute.runtime.target import TargetBusy
from experiments import __main__ as cli
from experiments.design.matrix import Cell, resolve
from experiments.run import loader, runner

SMALL_RUN = Path(__file__).resolve().parents[1] / "fixtures" / "small-run"


@pytest.fixture(autouse=True)
def described(monkeypatch):
    """The run's metadata without asking Envoy, OPA and Node.js for their versions."""
    monkeypatch.setattr(runner.metadata, "describe", lambda: {
        "taken_at": "2026-11-22T09:00:00+0000", "git": {"commit": None, "branch": None}, "versions": {},
        "machine": {"load_average_at_start": [0.1, 0.1, 0.1]}})


def new_runner(tmp_path, **given) -> runner.Runner:
    run = runner.Runner(tmp_path / "run", resolve("quick", **given), out=io.StringIO())
    run.raw.mkdir(parents=True)
    run.start_session()
    return run


@pytest.fixture
def deployments(monkeypatch):
    """deployment.deploy and the check record, standing in for real processes; records each topology deployed."""
    deployed = []

    def deploy(topology, rule_set, out, restart):
        deployed.append(topology)
        return {"run_dir": f"runs/{topology.name}", "parts": [], "engine": deployed_engine.get(topology.name, topology.engine["kind"]),
                "entry_url": "http://127.0.0.1:8080/process", "bring_up_seconds": 1.0, "memory_mib": {"total": 100}}

    deployed_engine = {}
    monkeypatch.setattr(deployment, "running", lambda: None)
    monkeypatch.setattr(deployment, "deploy", deploy)
    monkeypatch.setattr(loader, "send", lambda url, labels, body, request_id, timeout, policies: Answer(
        200, {"path": [{"instance": f"svc-{k}"} for k in range(len(deployed[-1].instances))]}, ""))
    return deployed, deployed_engine


@pytest.mark.parametrize("engine", ["envoy-opa", "envoy-compiled"])
def test_a_cell_deploys_its_engine(tmp_path, deployments, engine):
    deployed, _ = deployments
    new_runner(tmp_path).deploy(Cell("central-entity", engine, 100, 5, 1), io.StringIO())
    assert deployed[-1].engine["kind"] == engine
    assert deployed[-1].engine["decision_timeout"] == "2s"  # the manifest's other engine settings are kept


def test_the_baseline_deploys_its_manifest_as_it_is(tmp_path, deployments):
    deployed, _ = deployments
    new_runner(tmp_path).deploy(Cell("baseline", None, 100, 5, 1), io.StringIO())
    assert deployed[-1].kind == "baseline"


def test_a_deployment_under_another_engine_fails_the_cell(tmp_path, deployments):
    _, deployed_engine = deployments
    deployed_engine["central-entity"] = "envoy-opa"  # as if the override had been lost on the way
    with pytest.raises(loader.CellFailed, match="deployed with engine envoy-opa instead of envoy-compiled"):
        new_runner(tmp_path).deploy(Cell("central-entity", "envoy-compiled", 100, 5, 1), io.StringIO())


def test_a_resumed_run_finds_cells_finished_before_engines_were_run(tmp_path):
    raw = tmp_path / "raw"
    (raw / "central-entity_r100_n5_rep1").mkdir(parents=True)
    (raw / "central-entity_r100_n5_rep1" / "cell.json").write_text("{}")
    (raw / "sidecar_r100_n5_rep1").mkdir()
    (raw / "sidecar_r100_n5_rep1" / "failed.json").write_text("{}")  # failed: run again
    assert runner.finished_cell(raw, Cell("central-entity", "envoy-opa", 100, 5, 1))
    assert not runner.finished_cell(raw, Cell("central-entity", "envoy-compiled", 100, 5, 1))
    assert not runner.finished_cell(raw, Cell("sidecar", "envoy-opa", 100, 5, 1))


# ---- the bench of a session -------------------------------------------------------------

class Row:
    def __init__(self, part, verdict):
        self.part, self.verdict = part, verdict


@pytest.fixture
def bench(monkeypatch):
    """experiments.run.bench standing in: writes a one-line CSV, or raises what `failure` holds."""
    calls, failure = [], []

    def run(rule_set, out_file, records, rounds, out):
        assert rule_set.chosen == "policies"  # the bench measures the shipped rule set, whatever the cells deploy
        calls.append({"out_file": out_file, "records": records, "rounds": rounds})
        print("bench: measuring", file=out)
        if failure:
            raise failure[0]
        out_file.write_text(f"part,verdict\nsession {len(calls)},met\n")
        return [Row("service hop, beyond its work", "met"), Row("compiled engine: Envoy deciding the hop", "NOT MET")]

    stand_in = types.SimpleNamespace(run=run)
    monkeypatch.setitem(sys.modules, "experiments.run.bench", stand_in)
    monkeypatch.setattr(experiments.run, "bench", stand_in, raising=False)
    monkeypatch.setattr(deployment, "running", lambda: None)
    return calls, failure


def sessions(run: runner.Runner) -> list[dict]:
    return json.loads((run.run_dir / "metadata.json").read_text())["sessions"]


def test_a_session_measures_the_bench_at_the_runs_size(tmp_path, bench):
    calls, _ = bench
    run = new_runner(tmp_path)
    run.measure_bench()
    assert calls == [{"out_file": run.raw / "bench.csv", "records": 1000, "rounds": 3}]
    recorded = sessions(run)[-1]["bench"]
    assert (recorded["csv"], recorded["records"], recorded["rounds"]) == ("bench.csv", 1000, 3)
    assert recorded["targets_not_met"] == ["compiled engine: Envoy deciding the hop"]
    assert "bench: measuring" in (run.raw / "bench.log").read_text()
    assert "targets not met: compiled engine: Envoy deciding the hop" in run.out.getvalue()


def test_bench_rounds_zero_runs_no_bench_and_says_so(tmp_path, bench):
    calls, _ = bench
    run = new_runner(tmp_path, bench_rounds=0)
    run.measure_bench()
    assert calls == [] and not (run.raw / "bench.csv").exists()
    assert sessions(run)[-1]["bench"] == {"skipped": "--bench-rounds 0"}
    assert "no bench" in run.out.getvalue()


def test_a_resumed_session_keeps_the_earlier_bench(tmp_path, bench):
    run = new_runner(tmp_path, bench_records=200, bench_rounds=1)
    run.measure_bench()
    run.start_session()  # resumed
    run.measure_bench()
    assert (run.raw / "bench-session1.csv").read_text().endswith("session 1,met\n")
    assert (run.raw / "bench.csv").read_text().endswith("session 2,met\n")
    assert [s["bench"]["csv"] for s in sessions(run)] == ["bench-session1.csv", "bench.csv"]
    assert (run.raw / "bench.log").read_text().count("---- session") == 2


def test_a_failed_bench_is_recorded_and_the_cells_still_run(tmp_path, bench):
    _, failure = bench
    failure.append(RuntimeError("bench: sink did not start; its log is in runs/bench"))
    run = new_runner(tmp_path)
    run.measure_bench()  # does not raise
    assert sessions(run)[-1]["bench"]["error"] == "RuntimeError: bench: sink did not start; its log is in runs/bench"
    assert not (run.raw / "bench.csv").exists()
    assert "the bench failed" in run.out.getvalue()


def test_no_bench_while_another_deployment_runs(tmp_path, bench, monkeypatch):
    calls, _ = bench
    monkeypatch.setattr(deployment, "running", lambda: {"topology": "sidecar", "run_dir": "runs/sidecar-5"})
    with pytest.raises(TargetBusy, match="another deployment is running"):
        new_runner(tmp_path).measure_bench()
    assert calls == []


# ---- the command line -------------------------------------------------------------------

@pytest.fixture
def started(monkeypatch):
    """The parameters `run` would start a Runner with, without running it."""
    runs = []

    class NotRunning:
        def __init__(self, run_dir, parameters, target):
            runs.append((run_dir, parameters))

        def run(self):
            return 0

    monkeypatch.setattr(cli, "Runner", NotRunning)
    return runs


def test_an_unknown_engine_is_refused_on_the_command_line(tmp_path, started, capsys):
    assert cli.main(["--results", str(tmp_path), "run", "--profile", "quick", "--engines", "compiled"]) == 2
    assert "engine 'compiled' is not one of ['envoy-opa', 'envoy-compiled']" in capsys.readouterr().err
    assert started == []
    assert cli.main(["--results", str(tmp_path), "run", "--profile", "quick", "--engines", "envoy-compiled"]) == 0
    assert started[-1][1].engines == ["envoy-compiled"]


def test_resuming_a_run_recorded_before_engines_keeps_envoy_opa(tmp_path, started, capsys):
    shutil.copytree(SMALL_RUN, tmp_path / "small-run")
    resume = ["--results", str(tmp_path), "run", "--run-id", "small-run"]
    assert cli.main([*resume, "--engines", "envoy-opa", "envoy-compiled"]) == 2
    assert "--engines ['envoy-opa', 'envoy-compiled'] (the run has ['envoy-opa'])" in capsys.readouterr().err
    assert started == []
    assert cli.main([*resume, "--engines", "envoy-opa"]) == 0
    assert cli.main(resume) == 0
    assert [parameters.engines for _, parameters in started] == [["envoy-opa"], ["envoy-opa"]]


def test_a_run_resumed_with_more_repetitions_runs_them_allowed(tmp_path, started):
    shutil.copytree(SMALL_RUN, tmp_path / "small-run")  # a run of 2 repetitions
    assert cli.main(["--results", str(tmp_path), "run", "--run-id", "small-run", "--repetitions", "3"]) == 0
    assert started[-1][1].repetitions == 3


def test_a_run_resumed_with_fewer_repetitions_is_refused_denied(tmp_path, started, capsys):
    shutil.copytree(SMALL_RUN, tmp_path / "small-run")
    assert cli.main(["--results", str(tmp_path), "run", "--run-id", "small-run", "--repetitions", "1"]) == 2
    assert "--repetitions 1 (the run has 2)" in capsys.readouterr().err and started == []


def test_the_session_that_adds_repetitions_records_them(tmp_path):
    run = new_runner(tmp_path, repetitions=1)
    resumed = runner.Runner(run.run_dir, resolve("quick", repetitions=3), out=io.StringIO())
    resumed.start_session()
    meta = json.loads((run.run_dir / "metadata.json").read_text())
    assert meta["parameters"]["repetitions"] == 3
    assert "repetitions_added" not in meta["sessions"][0] and meta["sessions"][1]["repetitions_added"] == 2


def test_a_bench_that_cannot_load_is_a_failed_bench(tmp_path, monkeypatch):
    monkeypatch.setattr(deployment, "running", lambda: None)
    monkeypatch.delattr(experiments.run, "bench", raising=False)
    monkeypatch.setitem(sys.modules, "experiments.run.bench", None)  # importing it raises ImportError
    run = new_runner(tmp_path)
    run.measure_bench()
    assert sessions(run)[-1]["bench"]["error"].startswith("ModuleNotFoundError")


# ---- the load of a cell ------------------------------------------------------------------

def test_a_cell_records_its_open_loop_and_the_run_its_locust(tmp_path):
    run = new_runner(tmp_path, arrivals="poisson")
    cell = Cell("sidecar", "envoy-opa", 100, 5, 1)
    load = run.load_of(cell)
    assert (load["load"], load["arrivals"], load["max_in_flight"], load["late_tolerance_ms"]) == ("open", "poisson", 1000, 100)
    assert load["seed"] == run.load_of(Cell("sidecar", "envoy-opa", 100, 5, 1))["seed"] != run.load_of(Cell("sidecar", "envoy-opa", 100, 5, 2))["seed"]
    assert json.loads((run.run_dir / "metadata.json").read_text())["locust"]["load"] == "open"


def test_a_closed_loop_cell_records_its_user_rate(tmp_path):
    run = new_runner(tmp_path, load="closed", user_rate=5)
    assert run.load_of(Cell("sidecar", "envoy-opa", 100, 5, 1)) == {"load": "closed", "user_rate": 5}
    assert json.loads((run.run_dir / "metadata.json").read_text())["locust"]["load"] == "closed"


def loads_of_a_cell(tmp_path, deployments, monkeypatch, **given) -> tuple[list, Path]:
    """Run one cell with stand-ins for Locust and the deployment: the loads asked, as (rate, seconds), and the cell's folder."""
    run = new_runner(tmp_path, **given)
    asked = []

    def load(cell, cell_dir, state, advance, seconds=None):
        asked.append((cell.rate, seconds))
        (cell_dir / "requests.csv").write_text("t_intended_ms\n")
        return {"exit_code": 0}

    monkeypatch.setattr(run, "load", load)
    monkeypatch.setattr(run, "undeploy", lambda log: None)
    monkeypatch.setattr(loader, "SETTLE_S", 0)
    monkeypatch.setattr(runner.stats, "summarize_cell", lambda cell_dir: {"achieved_rate": 100.0, "scheduled": 2000, "missed": 0,
                                                                          "median": 10.0, "error_rate": 0.0, "saturated": False})
    cell = Cell("central-entity", "envoy-opa", 100, 5, 1)
    run.run_cell(cell, types.SimpleNamespace(update=lambda seconds: None))
    return asked, run.raw / cell.key


def test_a_cell_is_primed_on_its_fresh_deployment_before_its_load_allowed(tmp_path, deployments, monkeypatch):
    asked, cell_dir = loads_of_a_cell(tmp_path, deployments, monkeypatch)
    assert asked == [(100, 10), (100, None)]  # the default 800 records at its rate: 8 s, so the least 10 s; then its own load
    assert (cell_dir / "prime" / "requests.csv.gz").exists() and (cell_dir / "requests.csv.gz").exists()
    assert json.loads((cell_dir / "cell.json").read_text())["primed"] == {"rate": 100, "seconds": 10}


@pytest.mark.parametrize("prime, rate, seconds", [(800, 100, 10), (800, 20, 40), (800, 500, 10), (801, 20, 41), (0, 20, 0)])
def test_a_prime_lasts_its_records_at_the_cells_rate_and_ten_seconds_at_least(prime, rate, seconds):
    assert resolve("quick", prime=prime).prime_seconds(rate) == seconds


def test_a_run_with_prime_zero_loads_its_cells_cold_denied(tmp_path, deployments, monkeypatch):
    asked, cell_dir = loads_of_a_cell(tmp_path, deployments, monkeypatch, prime=0)
    assert asked == [(100, None)]
    assert not (cell_dir / "prime").exists() and "primed" not in json.loads((cell_dir / "cell.json").read_text())


def test_a_run_recorded_before_priming_resumes_unprimed():
    assert runner.Parameters.from_json({**resolve("quick").to_json(), "prime": 0}).prime == 0
    recorded = resolve("quick").to_json()
    del recorded["prime"]
    assert runner.Parameters.from_json(recorded).prime == 0


TWO_ENGINES = Path(__file__).resolve().parents[1] / "fixtures" / "two-engines"


def finished_run(tmp_path) -> runner.Runner:
    """The two-engines fixture resumed: every cell finished, so run() only writes the report."""
    run_dir = tmp_path / "results" / "two-engines"
    shutil.copytree(TWO_ENGINES, run_dir)
    parameters = runner.Parameters.from_json(json.loads((run_dir / "metadata.json").read_text())["parameters"])
    return runner.Runner(run_dir, parameters, out=io.StringIO())


def test_a_finished_run_without_a_capacity_run_says_which_commands_would_price_it_in_capacity(tmp_path):
    run = finished_run(tmp_path)
    assert run.run() == 0
    results = tmp_path / "results"
    # its chain lengths and engines are the search's defaults, its topologies not
    assert (f"needs a capacity run: python -m experiments --results {results} capacity --topologies central-entity sidecar, "
            f"then python -m experiments --results {results} report two-engines --capacity CAPACITY_RUN") in run.out.getvalue()


def test_a_finished_run_that_keeps_a_capacity_run_says_no_more_of_it(tmp_path):
    from experiments.report.capacity_report import keep_capacity
    from tests.unit.experiments.design.test_capacity import synthetic_run

    run = finished_run(tmp_path)
    keep_capacity(run.run_dir, [synthetic_run(tmp_path)])
    assert run.run() == 0
    assert "needs a capacity run" not in run.out.getvalue()
    assert "its searched capacity is" in (run.run_dir / "report" / "report.md").read_text()
