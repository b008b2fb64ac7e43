"""The capacity search without a deployment: the step search against fake step functions
(doubling, bisection, the max-rate cap, a first step that fails, a noisy non-monotone step),
the held criteria (each failing alone beside a held twin), the runner's steps.csv and
metadata with stand-ins for the deployment and Locust, the report, table and figure of a
synthetic run folder, and the command line's errors."""

import csv
import io
import json
import math
import random
import shutil
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest

from experiments import __main__ as cli
from experiments.design import capacity
from experiments.design import targets as experiments_targets
from experiments.design.capacity import GAP, MAX_STEPS, Parameters, judge, result_of_steps, search
from experiments.design.matrix import Parameters as RunParameters
from experiments.design.matrix import ParameterError, resolve
from experiments.load.timing import DURATIONS
from experiments.report import capacity_report
from experiments.run import capacity_run
from tests.unit.experiments.markdown_text import compact


# ---- the search -------------------------------------------------------------------------------

def rates(result):
    return [rate for rate, _ in result.steps]


def check_invariants(result, max_rate, confirmations=capacity.CONFIRMATIONS):
    """What any search must leave: each rate probed in one run of steps, again only after a failed
    step and at most `confirmations` times; every held rate (one of its steps held) below every
    failed one (all failed); the capacity the highest held, and what steps.csv would say the same
    as what search said."""
    runs = [rate for k, (rate, _) in enumerate(result.steps) if k == 0 or result.steps[k - 1][0] != rate]
    assert len(runs) == len(set(runs))
    for k, (rate, _) in enumerate(result.steps[1:], 1):
        assert rate != result.steps[k - 1][0] or not result.steps[k - 1][1]  # again only after a failure
    assert max(Counter(rates(result)).values()) <= 1 + confirmations
    held = {rate for rate, ok in result.steps if ok}
    failed = set(rates(result)) - held
    if held and failed:
        assert max(held) < min(failed)
    assert result.capacity == (max(held) if held else None)
    assert result.lowest_failed == (min(failed) if failed else None)
    assert all(1 <= rate <= max_rate for rate in rates(result))
    rows = [{"step": k, "offered_rate": rate, "held": str(ok)} for k, (rate, ok) in enumerate(result.steps, 1)]
    assert vars(result_of_steps(rows)) == vars(result)


def test_doubling_then_bisection_to_within_ten_percent():
    result = search(lambda rate: rate <= 300, start_rate=50, max_rate=2000)
    assert result.steps == [(50, True), (100, True), (200, True), (400, False), (400, False), (300, True), (350, False), (350, False),
                            (325, False), (325, False)]
    assert (result.capacity, result.lowest_failed, result.first_failed, result.capped) == (300, 325, 400, False)
    assert result.converged and result.lowest_failed - result.capacity <= GAP * result.capacity
    check_invariants(result, 2000)


def test_bisection_stops_at_the_gap_not_before():
    result = search(lambda rate: rate <= 1234, start_rate=50, max_rate=2000)
    assert result.capacity <= 1234 < result.lowest_failed <= 1.1 * result.capacity
    # one rate fewer would have left the gap above 10%
    before = [(r, ok) for r, ok in result.steps if r != result.steps[-1][0]]
    held_before = result_of_steps([{"step": k, "offered_rate": r, "held": ok} for k, (r, ok) in enumerate(before, 1)]).capacity
    failed_before = min(r for r, ok in before if not ok)
    assert failed_before - held_before > GAP * held_before
    check_invariants(result, 2000)


def test_the_max_rate_caps_the_doubling_and_a_capacity_at_it_is_marked_capped():
    result = search(lambda rate: True, start_rate=50, max_rate=300)
    assert rates(result) == [50, 100, 200, 300]
    assert result.capped and result.capacity == 300 and result.lowest_failed is None and result.converged
    assert capacity.capacity_text(result) == "≥ 300"
    check_invariants(result, 300)
    # failing only at the cap: bisection between the last doubling and the cap
    result = search(lambda rate: rate < 300, start_rate=50, max_rate=300)
    assert rates(result)[:4] == [50, 100, 200, 300] and not result.capped and 270 <= result.capacity < 300
    check_invariants(result, 300)


def test_a_first_step_that_fails_halves_down_then_bisects():
    result = search(lambda rate: rate <= 20, start_rate=50, max_rate=2000)
    assert result.steps[:5] == [(50, False), (50, False), (25, False), (25, False), (12, True)]
    assert result.first_failed == 50 and result.capacity == 20 and result.lowest_failed == 21
    check_invariants(result, 2000)


def test_nothing_held_gives_no_capacity_below_the_lowest_rate_tried():
    result = search(lambda rate: False, start_rate=50, max_rate=2000)
    assert rates(result) == [50, 50, 25, 25, 12, 12, 6, 6]
    assert result.capacity is None and not result.capped and not result.converged
    assert capacity.capacity_text(result) == "< 6"
    check_invariants(result, 2000)


def spiking_once_at(spiked: int, knee: int = 300):
    """A step function holding up to `knee` whose first step at `spiked` fails (a latency spike of
    the machine's), as 100 req/s did in capacity-n5-20261130."""
    tried = Counter()

    def step(rate):
        tried[rate] += 1
        return rate <= knee and not (rate == spiked and tried[rate] == 1)
    return step


@pytest.mark.parametrize("confirmations, capacity_found", [(1, 300), (0, 93)],
                         ids=["confirmed-the-spike-is-passed-allowed", "unconfirmed-the-spike-ends-the-doubling-denied"])
def test_a_step_that_fails_once_is_run_again_before_its_rate_counts_as_failed(confirmations, capacity_found):
    result = search(spiking_once_at(100), start_rate=50, max_rate=2000, confirmations=confirmations)
    assert result.steps[:3] == [(50, True), (100, False), (100, True) if confirmations else (75, True)]
    assert result.capacity == capacity_found and result.converged
    assert result.first_failed == (400 if confirmations else 100)  # the first rate that failed, every step of it
    check_invariants(result, 2000, confirmations)


def test_a_rate_whose_every_step_fails_below_its_knee_still_gives_a_held_rate_within_the_gap():
    noisy = lambda rate: rate <= 300 and rate != 200  # noqa: E731 - a failure below the knee, at every step of the rate
    result = search(noisy, start_rate=50, max_rate=2000)
    assert result.steps[:4] == [(50, True), (100, True), (200, False), (200, False)]
    assert result.capacity == 187 and result.lowest_failed == 200 and result.converged
    check_invariants(result, 2000)


@pytest.mark.parametrize("seed", range(40))
def test_a_randomly_noisy_step_terminates_and_keeps_the_bracket(seed):
    draw = random.Random(seed)
    knee = draw.randint(30, 1500)

    def step(rate):  # around the knee, a step holds or not by chance
        return draw.random() < 1 / (1 + math.exp((rate - knee) / (0.15 * knee)))

    result = search(step, start_rate=50, max_rate=2000)
    assert 1 <= len(result.steps) <= MAX_STEPS
    check_invariants(result, 2000)
    if result.capacity is not None and result.lowest_failed is not None and len(result.steps) < MAX_STEPS:
        assert result.converged


def test_a_start_above_the_max_is_refused():
    with pytest.raises(ParameterError):
        search(lambda rate: True, start_rate=100, max_rate=50)


# ---- held or not ------------------------------------------------------------------------------

HELD = dict(offered_rate=100, achieved_rate=99.0, scheduled=1000, errors=5, missed=4, p99_ms=300.0, p99_bound_ms=500.0)


def test_the_held_twin_holds_and_the_boundaries_hold():
    assert judge(**HELD) == (True, [])
    assert judge(**{**HELD, "achieved_rate": 95.0, "errors": 6, "missed": 4, "p99_ms": 500.0}) == (True, [])


@pytest.mark.parametrize("change, reason", [
    ({"achieved_rate": 94.9}, "achieved 94.9% of offered < 95%"),  # the sender's schedule short, nothing missed
    ({"errors": 7, "missed": 4}, "errors+missed 1.1% > 1%"),
    ({"errors": 0, "missed": 11}, "errors+missed 1.1% > 1%"),
    ({"p99_ms": 501.0}, "p99 501 ms > 500 ms"),
    ({"p99_ms": float("nan")}, "no record delivered (no p99)"),
])
def test_each_criterion_failing_alone_fails_the_step_and_is_named(change, reason):
    held, reasons = judge(**{**HELD, **change})
    assert not held and reasons == [reason]


def test_every_criterion_failing_is_named():
    held, reasons = judge(offered_rate=400, achieved_rate=200, scheduled=4000, errors=100, missed=2000, p99_ms=5000, p99_bound_ms=500)
    assert not held and [r.split(" ")[0] for r in reasons] == ["achieved", "errors+missed", "p99"]


# ---- parameters and the command line ----------------------------------------------------------

def test_parameters_always_add_the_baseline_first_and_last_and_take_aliases():
    parameters = Parameters(topologies=["ce", "sa"], engines=["envoy-opa"], services=[5, 10])
    assert parameters.topologies == ["baseline", "central-entity", "sidecar"]
    assert parameters.searches() == [
        ("baseline", None, 5, False), ("central-entity", "envoy-opa", 5, False), ("sidecar", "envoy-opa", 5, False), ("baseline", None, 5, True),
        ("baseline", None, 10, False), ("central-entity", "envoy-opa", 10, False), ("sidecar", "envoy-opa", 10, False), ("baseline", None, 10, True)]
    assert Parameters(topologies=["baseline"]).searches() == [("baseline", None, 5, False), ("baseline", None, 10, False)]


def test_without_the_closing_baseline_each_search_runs_once_denied():
    parameters = Parameters(topologies=["ce"], engines=["envoy-opa"], services=[5], closing_baseline=False)
    assert parameters.searches() == [("baseline", None, 5, False), ("central-entity", "envoy-opa", 5, False)]


@pytest.mark.parametrize("args, words", [
    (["--start-rate", "0"], "--start-rate"),
    (["--start-rate", "100", "--max-rate", "50"], "--max-rate"),
    (["--topologies", "nope"], "topology 'nope'"),
    (["--engines", "envoy-magic"], "engine 'envoy-magic'"),
    (["--services", "0"], "services"),
    (["--step-seconds", "0"], "--step-seconds"),
    (["--p99-bound-ms", "-1"], "--p99-bound-ms"),
    (["--max-steps", "0"], "--max-steps"),
    (["--replicas", "0"], "--replicas"),
    (["--work-iterations", "-1"], "--work-iterations"),
    (["--report", "no-such-run"], "no capacity run"),
    (["--report", "an-experiment-run"], "no capacity run at"),  # an experiment run: its metadata, no steps
])
def test_bad_arguments_get_one_line_and_exit_2(tmp_path, capsys, args, words):
    (tmp_path / "an-experiment-run").mkdir()
    (tmp_path / "an-experiment-run" / "metadata.json").write_text("{}")
    assert cli.main(["--results", str(tmp_path), "capacity", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and words in err and err.count("\n") == 1


# ---- the runner, with stand-ins for the deployment and Locust ---------------------------------

KNEE = 150  # the stand-in deployment answers in 10 ms up to this rate, in 900 ms above


@pytest.fixture
def stand_ins(monkeypatch):
    monkeypatch.setattr(capacity_run.metadata, "describe", lambda: {
        "taken_at": "2026-11-26T03:00:00+0000", "git": {"commit": "abc", "dirty": False}, "versions": {"locust": "2.47.0"},
        "machine": {"cores": 2, "load_average_at_start": [0.1, 0.1, 0.1]}})
    monkeypatch.setattr(capacity_run, "SETTLE_S", 0)
    deployed = []

    def deploy(self, cell, log):
        deployed.append((cell.topology, cell.engine, cell.services))
        return {"run_dir": "runs/stand-in", "parts": [], "engine": cell.engine, "entry_url": "http://127.0.0.1:8080/process"}

    def load(self, cell, step_dir, state, advance, seconds=None):
        seconds = (self.parameters.warmup + self.parameters.duration if seconds is None else seconds) + 1
        rtt = 10.0 if cell.rate <= KNEE else 900.0
        with (step_dir / "requests.csv").open("w", newline="") as file:
            writer = csv.writer(file)
            writer.writerow(["t_intended_ms", "t_send_ms", "rtt_ms", "service_time_ms", "status", "missed", "record", "expected", "hops",
                             *DURATIONS])
            for k in range(cell.rate * seconds):
                t = 1_000_000 + k * 1000 / cell.rate
                writer.writerow([t, t, rtt, rtt, 200, "", "allowed", 200, cell.services, *[""] * len(DURATIONS)])
        (step_dir / "cpu.csv").write_text("t_ms,machine_busy_s,locust_s,deployment_s,service_s,envoy_s,opa_s,control_s\n" + "".join(
            f"{1_000_000 + t * 1000},{1.5 * t},{0.1 * t},{t},{t},0,0,0\n" for t in range(seconds + 1)))
        return {"command": ["locust"], "exit_code": 0}

    monkeypatch.setattr(capacity_run.CapacityRunner, "deploy", deploy)
    monkeypatch.setattr(capacity_run.CapacityRunner, "load", load)
    monkeypatch.setattr(capacity_run.CapacityRunner, "undeploy", lambda self, log: None)
    return deployed


def test_a_run_steps_each_deployment_writes_steps_csv_metadata_and_the_report(tmp_path, stand_ins, monkeypatch):
    built = []
    monkeypatch.setattr(capacity_run, "build_report", lambda run_dir: built.append(run_dir) or {"html": "h", "markdown": "m"})
    out = io.StringIO()
    parameters = Parameters(topologies=["ce"], engines=["envoy-opa"], services=[5], start_rate=50, max_rate=2000, step_seconds=2,
                            step_warmup=1)
    code, run_dir = capacity_run.run(parameters, tmp_path, "cap", out=out)
    assert code == 0, out.getvalue()
    # One deployment per search: the baseline first, then the topology, then the baseline again.
    assert stand_ins == [("baseline", None, 5), ("central-entity", "envoy-opa", 5), ("baseline", None, 5)]
    with (run_dir / "raw" / "steps.csv").open() as file:
        rows = list(csv.DictReader(file))
    assert [r["offered_rate"] for r in rows if r["topology"] == "central-entity"] == ["50", "100", "200", "200", "150", "175", "175", "162", "162"]  # each failed rate twice
    assert {r["engine"] for r in rows} == {"envoy-opa", "none"}
    first_failed = next(r for r in rows if r["held"] == "False")
    assert first_failed["why_not"] == "p99 900 ms > 500 ms" and first_failed["p99_ms"] == "900.0"
    assert rows[0]["held"] == "True" and rows[0]["scheduled"] == "100" and rows[0]["achieved_share"] == "1.0"
    assert rows[0]["cpu_machine"] == "1.5"
    assert (run_dir / "raw" / "central-entity_envoy-opa_n5" / "step01_r50" / "requests.csv.gz").exists()
    # The priming load ran at half the start rate before the first step, and is no step.
    assert (run_dir / "raw" / "central-entity_envoy-opa_n5" / "prime_r25" / "requests.csv.gz").exists()
    meta = json.loads((run_dir / "metadata.json").read_text())
    assert [s["primed_at_rate"] for s in meta["searches"]] == [25, 25, 25]
    assert meta["outcome"] == "finished" and meta["parameters"]["p99_bound_ms"] == 500.0 and meta["machine"]["cores"] == 2
    assert [(s["topology"], s["closing"], s["capacity"], s["lowest_failed"]) for s in meta["searches"]] == [
        ("baseline", False, 150, 162), ("central-entity", False, 150, 162), ("baseline", True, 150, 162)]
    # The closing search's steps are apart: steps.csv has one search per topology, engine and chain length.
    with (run_dir / "raw" / "closing-steps.csv").open() as file:
        closing = list(csv.DictReader(file))
    assert {r["topology"] for r in closing} == {"baseline"} and [r["offered_rate"] for r in closing] == [
        r["offered_rate"] for r in rows if r["topology"] == "baseline"]
    assert (run_dir / "raw" / "baseline_n5_closing" / "step01_r50" / "requests.csv.gz").exists()
    lines = out.getvalue().splitlines()
    assert sum("step" in line and "req/s:" in line for line in lines) == len(rows) + len(closing)  # a line per step
    assert any(line.startswith("capacity: baseline 5 services (closing): 150 req/s") for line in lines)
    assert any(line.startswith("capacity: CE (envoy-opa) 5 services: 150 req/s") for line in lines)
    table = capacity_report.capacity_table(capacity_report.read_steps(run_dir), GAP)
    assert table[["topology", "capacity", "share_of_baseline"]].values.tolist() == [["central-entity", 150, 1.0], ["baseline", 150, 1.0]]
    assert built == [run_dir]  # the report itself: below, on a synthetic run


def test_without_the_closing_search_the_run_has_no_closing_steps_denied(tmp_path, stand_ins):
    parameters = Parameters(topologies=["ce"], engines=["envoy-opa"], services=[5], start_rate=50, max_rate=100, step_seconds=2,
                            step_warmup=1, closing_baseline=False)
    code, run_dir = capacity_run.run(parameters, tmp_path, "unclosed", out=io.StringIO())
    assert code == 0
    assert [s["closing"] for s in json.loads((run_dir / "metadata.json").read_text())["searches"]] == [False, False]
    assert (run_dir / "raw" / "steps.csv").exists() and not (run_dir / "raw" / "closing-steps.csv").exists()


def test_without_priming_the_first_step_is_the_first_load_denied(tmp_path, stand_ins):
    parameters = Parameters(topologies=["ce"], engines=["envoy-opa"], services=[5], start_rate=50, max_rate=100, step_seconds=2,
                            step_warmup=1, prime=False)
    code, run_dir = capacity_run.run(parameters, tmp_path, "unprimed", out=io.StringIO())
    assert code == 0
    assert not list((run_dir / "raw").glob("*/prime_r*"))
    assert [s["primed_at_rate"] for s in json.loads((run_dir / "metadata.json").read_text())["searches"]] == [None, None, None]


def test_an_existing_run_is_not_overwritten(tmp_path, stand_ins, capsys):
    (tmp_path / "taken").mkdir()
    assert cli.main(["--results", str(tmp_path), "capacity", "--run-id", "taken"]) == 2
    assert "already exists" in capsys.readouterr().err


# ---- the report of a synthetic run folder -----------------------------------------------------

def synthetic_run(tmp_path):
    run_dir = tmp_path / "capacity-synthetic"
    (run_dir / "raw").mkdir(parents=True)
    parameters = Parameters(topologies=["ce"], engines=["envoy-opa", "envoy-compiled"], services=[5, 10])
    (run_dir / "metadata.json").write_text(json.dumps({
        "run_id": run_dir.name, "kind": "capacity", "parameters": vars(parameters), "outcome": "finished", "searches": [],
        "machine": {"cores": 2}, "versions": {}, "git": {"commit": "abc"}}))
    knees = {("central-entity", "envoy-opa", 5): 180, ("central-entity", "envoy-compiled", 5): 290, ("baseline", "none", 5): 420,
             ("central-entity", "envoy-opa", 10): 70, ("central-entity", "envoy-compiled", 10): 95, ("baseline", "none", 10): 2000}
    with (run_dir / "raw" / "steps.csv").open("w", newline="") as file:
        writer = csv.DictWriter(file, capacity.STEP_COLUMNS)
        writer.writeheader()
        for (topology, engine, services), knee in knees.items():
            result = search(lambda rate: rate <= knee, 50, 2000)
            for index, (rate, held) in enumerate(result.steps, 1):
                p99 = 100 + 300 * rate / knee
                writer.writerow({"topology": topology, "engine": engine, "services": services, "step": index, "offered_rate": rate,
                                 "scheduled": rate * 10, "sent": rate * 10, "achieved_rate": rate, "achieved_share": 1.0, "errors": 0,
                                 "missed": 0, "loss_share": 0.0, "p50_ms": p99 / 5, "p95_ms": p99 / 2, "p99_ms": round(p99, 1),
                                 "held": held, "why_not": "" if held else f"p99 {p99:.0f} ms > 500 ms", "cpu_machine": 1.2,
                                 "cpu_locust": 0.1, "cpu_deployment": 1.0, "started_at": "2026-11-26T03:00:00+0000"})
    return run_dir


def test_the_report_table_figure_and_csv_of_a_synthetic_run(tmp_path, monkeypatch):
    run_dir = synthetic_run(tmp_path)
    paths = capacity_report.build(run_dir)
    table = capacity_report.read_steps(run_dir)
    assert len(table) > 12
    capacity_csv = list(csv.DictReader((run_dir / "report" / "tables" / "capacity.csv").open()))
    assert [(r["topology"], r["engine"], r["services"], r["capacity"]) for r in capacity_csv] == [
        ("central-entity", "envoy-opa", "5", "175"), ("central-entity", "envoy-compiled", "5", "275"), ("baseline", "none", "5", "400"),
        ("central-entity", "envoy-opa", "10", "68"), ("central-entity", "envoy-compiled", "10", "93"),
        ("baseline", "none", "10", "2000")]
    share = {(r["engine"], r["services"]): r["share_of_baseline"] for r in capacity_csv}
    assert float(share[("envoy-compiled", "5")]) == pytest.approx(275 / 400)
    assert capacity_csv[-1]["capped"] == "True" and capacity_csv[0]["first_failed"] == "200"
    markdown = compact(paths["markdown"].read_text())
    assert "| CE | envoy-opa | 5 | 175 |" in markdown and "| baseline | none | 10 | ≥ 2000 |" in markdown
    assert "at 200 req/s: p99" in markdown and "| 69% |" in markdown
    assert "(other processes: 0.10 cores)" in markdown  # 1.2 busy, 0.1 Locust, 1.0 the deployment
    assert "≤ 3%" in markdown  # a share of a capped baseline is at most that
    assert "](figures/capacity_latency.png)" in markdown
    for suffix in ("png", "svg"):
        assert (run_dir / "report" / "figures" / f"capacity_latency.{suffix}").stat().st_size > 1000
    assert "data:image/png;base64," in paths["html"].read_text()
    # rebuilt through the command line alike
    built = []
    monkeypatch.setattr(capacity_run, "build_report", lambda run_dir: built.append(run_dir) or paths)
    assert cli.main(["capacity", "--report", str(run_dir)]) == 0 and built == [run_dir]


@pytest.mark.parametrize("confirmed, first_failed", [(True, "400"), (False, "100")],
                         ids=["a-confirmed-spike-is-no-failure-allowed", "an-unconfirmed-spike-is-the-first-failure-denied"])
def test_the_table_names_the_first_rate_that_failed_every_step(tmp_path, confirmed, first_failed):
    run_dir = synthetic_run(tmp_path)
    steps = capacity_report.read_steps(run_dir)
    search_rows = steps[(steps["topology"] == "central-entity") & (steps["engine"] == "envoy-compiled") & (steps["services"] == 5)]
    assert search_rows.iloc[1]["offered_rate"] == 100 and search_rows.iloc[1]["held"]
    rows = search_rows.copy()  # the step at 100 req/s failed first on a spike, then held when run again (confirmed)
    rows.loc[rows.index[1], ["held", "why_not"]] = [False, "p99 510 ms > 500 ms"]
    if confirmed:
        rows = pd.concat([rows.iloc[:2], search_rows.iloc[[1]], rows.iloc[2:]]).assign(step=lambda frame: range(1, len(frame) + 1))
    [row] = capacity_report.capacity_table(rows, GAP).to_dict("records")
    assert str(row["first_failed"]) == first_failed and row["capacity"] == 275
    assert row["first_failed_why"].startswith("p99") and (row["first_failed_why"] == "p99 510 ms > 500 ms") == (not confirmed)


def with_closing_baseline(run_dir, knee):
    """The synthetic run's baseline at 5 services searched again 40 minutes later, holding up to `knee`."""
    with (run_dir / "raw" / "closing-steps.csv").open("w", newline="") as file:
        writer = csv.DictWriter(file, capacity.STEP_COLUMNS)
        writer.writeheader()
        for index, (rate, held) in enumerate(search(lambda rate: rate <= knee, 50, 2000).steps, 1):
            writer.writerow({"topology": "baseline", "engine": "none", "services": 5, "step": index, "offered_rate": rate,
                             "scheduled": rate * 10, "sent": rate * 10, "achieved_rate": rate, "achieved_share": 1.0, "errors": 0,
                             "missed": 0, "loss_share": 0.0, "p50_ms": 20, "p95_ms": 50, "p99_ms": 100 if held else 900, "held": held,
                             "why_not": "" if held else "p99 900 ms > 500 ms", "cpu_machine": 1.2, "cpu_locust": 0.1,
                             "cpu_deployment": 1.0, "started_at": "2026-11-26T03:40:00+0000"})


def test_the_baseline_searched_again_as_it_was_says_the_machine_held_its_speed_allowed(tmp_path):
    run_dir = synthetic_run(tmp_path)
    with_closing_baseline(run_dir, 420)
    markdown = compact(capacity_report.build(run_dir)["markdown"].read_text())
    assert "## The baseline, first and last" in markdown
    assert ("At 5 services the baseline held 400 req/s searched first, and 400 searched again 40 min later, after the enforcing "
            "topologies (+0%): within the search's resolution (10%)") in markdown
    drift = list(csv.DictReader((run_dir / "report" / "tables" / "baseline_drift.csv").open()))
    assert drift == [{"services": "5", "first": "400", "closing": "400", "minutes_between": "40.0", "change": "0.0"}]
    # The shares stay against the first search.
    capacity_csv = {(r["engine"], r["services"]): r for r in csv.DictReader((run_dir / "report" / "tables" / "capacity.csv").open())}
    assert float(capacity_csv[("envoy-compiled", "5")]["share_of_baseline"]) == pytest.approx(275 / 400)


def test_the_baseline_searched_again_slower_says_the_shares_carry_that_doubt_denied(tmp_path):
    run_dir = synthetic_run(tmp_path)
    with_closing_baseline(run_dir, 300)
    markdown = compact(capacity_report.build(run_dir)["markdown"].read_text())
    assert "400 req/s searched first, and 300 searched again 40 min later" in markdown
    assert "(-25%): beyond the search's resolution (10%)" in markdown and "within the search's resolution" not in markdown


def test_a_run_without_a_closing_baseline_has_no_such_section_denied(tmp_path):
    run_dir = synthetic_run(tmp_path)
    markdown = capacity_report.build(run_dir)["markdown"].read_text()
    assert "first and last" not in markdown and not (run_dir / "report" / "tables" / "baseline_drift.csv").exists()


def test_a_run_without_its_baseline_yet_has_a_table_without_shares(tmp_path):
    run_dir = synthetic_run(tmp_path)
    steps = capacity_report.read_steps(run_dir)
    table = capacity_report.capacity_table(steps[steps["topology"] != "baseline"], GAP)
    assert len(table) == 4 and table["share_of_baseline"].isna().all()
    assert set(capacity_report.capacity_view(table, steps)["of the baseline's"]) == {"–"}


class KubernetesStandIn:
    """A k8s target as the runner sees it, its context already asked."""

    name, runs_here, port_forwarded = "k8s", False, True

    def describe(self):
        return {"target": "k8s", "context": "local", "server": "https://10.250.250.1:36443", "nodes": ["complyroute-node"],
                "deploys_to": ["complyroute-node"], "one_node": True, "entry": "kubectl port-forward to the entry's Service",
                "image": "complyroute/service:0.1.0"}


def test_a_capacity_run_on_k8s_names_its_target_in_metadata_and_report(tmp_path, stand_ins):
    parameters = Parameters(topologies=["ce"], engines=["envoy-opa"], services=[5], start_rate=50, max_rate=100, step_seconds=2,
                            step_warmup=1)
    code, run_dir = capacity_run.run(parameters, tmp_path, "cap-k8s", out=io.StringIO(), target=KubernetesStandIn())
    assert code == 0
    meta = json.loads((run_dir / "metadata.json").read_text())
    assert meta["target"]["target"] == "k8s" and meta["target"]["context"] == "local"
    assert meta["unmeasured"] == experiments_targets.unmeasured(KubernetesStandIn())  # what it cannot measure: pods, port-forwarded
    assert len(meta["unmeasured"]) == 2
    markdown = compact((run_dir / "report" / "capacity.md").read_text())
    assert "Target: **k8s**: kubectl context `local`, API server https://10.250.250.1:36443, nodes complyroute-node" in markdown
    assert "Not measured on this target: the deployment's CPU time and memory, by part or in total" in markdown


def test_a_capacity_run_recorded_before_targets_reports_local(tmp_path):
    markdown = compact(capacity_report.build(synthetic_run(tmp_path))["markdown"].read_text())
    assert "Target: **local** (processes on this machine" in markdown and "Not measured on this target" not in markdown


def test_the_report_says_a_priming_load_ran_allowed_or_did_not_denied():
    assert "one step's load at 50% of the start rate, not judged" in capacity_report.priming({"prime": True})
    assert capacity_report.priming({"prime": False}).startswith("No priming load")
    assert capacity_report.priming({}).startswith("No priming load")  # runs from before the priming load


def test_a_runs_report_prices_enforcement_in_the_baselines_capacity_from_capacity_runs(tmp_path, capsys):
    searched = synthetic_run(tmp_path)
    run_dir = tmp_path / "two-engines"
    shutil.copytree(Path(__file__).resolve().parents[1] / "fixtures" / "two-engines", run_dir)
    table = capacity_report.capacity_of_runs([searched])
    assert cli.main(["report", str(run_dir), "--capacity", str(searched)]) == 0
    markdown = compact((run_dir / "report" / "report.md").read_text())
    for engine, name in (("envoy-opa", "envoy-opa"), ("envoy-compiled", "compiled")):
        shares = table[table["engine"] == engine].set_index("services")["share_of_baseline"]
        low, high = shares.min(), shares.max()
        assert f"**{name}**: the deployment's CPU per record" in markdown
        # CE's share at 10 services is the lowest: the baseline held every step there, 2000 req/s
        assert (f"its searched capacity is {low:.1%} (CE, {shares.idxmin()} services) to {high:.1%} (CE, {shares.idxmax()} services) "
                "of the baseline's at the same chain length (capacity run `capacity-synthetic`), at most: the baseline held every "
                "rate its search offered") in markdown
    assert "which enforcement cannot earn" not in markdown  # every share at most 100%
    # kept in the run's folder: a later report without --capacity, as the sample's test makes, has the share too
    kept = run_dir / capacity.KEPT_CAPACITY / searched.name
    assert sorted(path.relative_to(kept).as_posix() for path in kept.rglob("*") if path.is_file()) == ["metadata.json", "raw/steps.csv"]
    assert cli.main(["report", str(run_dir)]) == 0
    assert compact((run_dir / "report" / "report.md").read_text()) == markdown
    # a folder that is not a capacity run is refused, and the run keeps what it kept
    assert cli.main(["report", str(run_dir), "--capacity", str(run_dir)]) == 2
    assert "is not a capacity run with steps" in capsys.readouterr().err
    assert kept.is_dir()


def test_a_share_over_the_baselines_capacity_is_called_what_it_is(tmp_path):
    """An enforcing topology cannot hold more than the baseline, which does the same work without enforcing: a
    share over 100% is the machine's load between the searches."""
    from experiments.report.findings_report import price_items
    from experiments.analysis import findings as run_findings

    table = capacity_report.capacity_of_runs([synthetic_run(tmp_path)])
    table.loc[table["topology"] == "baseline", "capacity"] = 50  # the baseline searched while the machine was busy
    table["share_of_baseline"] = table["capacity"] / table["services"].map(table[table["topology"] == "baseline"].set_index("services")["capacity"])
    cpu = pd.DataFrame({"topology": ["central-entity"], "engine": ["envoy-opa"], "rate": 100, "services": 5, "total_ms": [3.0],
                        "baseline_total_ms": [1.0], "enforcement_per_hop_ms": [0.4]})
    text = price_items(run_findings.price(cpu, table), table, "")[0]
    assert ("a share over 100%, which enforcement cannot earn, says the searches found the machine unequally busy (other processes at "
            "each search's first failed step: 0.10 to 0.10 cores)") in text  # steps of 1.2 cores busy: Locust 0.1, the deployment 1.0


def test_a_report_without_a_capacity_run_names_the_commands_that_would_give_the_share(tmp_path):
    run_dir = tmp_path / "two-engines"
    shutil.copytree(Path(__file__).resolve().parents[1] / "fixtures" / "two-engines", run_dir)
    assert cli.main(["report", str(run_dir)]) == 0
    markdown = compact((run_dir / "report" / "report.md").read_text())
    run = json.loads((run_dir / "metadata.json").read_text())["parameters"]
    command = capacity.command_for(RunParameters.from_json(run))
    assert "its searched capacity is" not in markdown
    assert ("its share of the baseline's capacity needs a capacity run, and none is kept with this run: "
            f"`{command}`") in markdown
    assert "then `python -m experiments report two-engines --capacity CAPACITY_RUN`" in markdown


def test_the_capacity_command_for_a_run_names_what_differs_from_the_searchs_defaults():
    assert capacity.command_for(resolve("quick")) == "python -m experiments capacity"  # make experiment's: 5 and 10 services
    narrow = resolve("quick", topologies=["ce", "baseline"], engines=["envoy-compiled"], services=[5])
    assert capacity.command_for(narrow) == ("python -m experiments capacity --topologies central-entity --engines envoy-compiled "
                                            "--services 5")


def test_run_refuses_a_capacity_run_that_is_not_one_before_any_cell_starts(tmp_path, capsys):
    code = cli.main(["--results", str(tmp_path), "run", "--profile", "quick", "--topologies", "ce", "--rates", "20", "--services", "5",
                     "--run-id", "refused", "--capacity", str(tmp_path / "nothing")])
    assert code == 2 and "is not a capacity run with steps" in capsys.readouterr().err
    assert not (tmp_path / "refused" / "metadata.json").exists()  # no session started, no cell


def test_run_keeps_a_capacity_run_and_its_report_prices_enforcement_with_it(tmp_path):
    """The allowed twin: `run --capacity` (make experiment capacity=...) on a run whose cells are all finished."""
    searched = synthetic_run(tmp_path)
    run_dir = tmp_path / "two-engines"
    shutil.copytree(Path(__file__).resolve().parents[1] / "fixtures" / "two-engines", run_dir)
    assert cli.main(["--results", str(tmp_path), "run", "--run-id", "two-engines", "--capacity", str(searched)]) == 0
    assert (run_dir / capacity.KEPT_CAPACITY / searched.name / "raw" / "steps.csv").exists()
    assert "(capacity run `capacity-synthetic`)" in (run_dir / "report" / "report.md").read_text()
