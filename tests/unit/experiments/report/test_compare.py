"""python -m experiments compare RUN_A RUN_B on small synthetic run folders: a real shift is found
with its interval excluding 0, an identical twin is not, and runs that cannot be compared are refused."""

import gzip
import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from experiments.__main__ import main
from experiments.report import compare
from tests.unit.experiments.markdown_text import compact

WARMUP_S, DURATION_S, RATE = 1, 20, 50
COLUMNS = ["t_send_ms", "rtt_ms", "status", "record", "expected", "hops", "service_ms", "forward_ms", "back_ms", "entry_ms", "exit_ms"]
T0 = 1_800_000_000_000.0


def write_run(run_dir: Path, cases: dict, seed: int) -> Path:
    """A run folder as the runner leaves it, one repetition per case: RATE records a second
    for WARMUP_S + DURATION_S s with exponential RTTs of mean `rtt` ms, and a deployment using
    `cpu` ms of CPU per record (±10% a second)."""
    rng = np.random.default_rng(seed)
    (run_dir / "raw").mkdir(parents=True)
    (run_dir / "metadata.json").write_text(json.dumps({"run_id": run_dir.name, "created_at": "2026-11-22T10:00:00+0000",
                                                       "parameters": {"warmup": WARMUP_S, "duration": DURATION_S}}))
    for (topology, engine, services), (rtt, cpu) in cases.items():
        cell = run_dir / "raw" / f"{topology}_{engine or ''}_r{RATE}_n{services}_rep1"
        cell.mkdir()
        count = RATE * (WARMUP_S + DURATION_S)
        sends = T0 + np.arange(count) * 1000 / RATE
        rtts = rng.exponential(rtt, count)
        requests = pd.DataFrame({"t_send_ms": sends, "rtt_ms": rtts, "status": 200, "record": "allowed", "expected": 200,
                                 "hops": services, "service_ms": 1.0, "forward_ms": rtts - 1, "back_ms": 0.0, "entry_ms": 0.0, "exit_ms": 0.0})
        with gzip.open(cell / "requests.csv.gz", "wt") as out:
            requests[COLUMNS].to_csv(out, index=False)
        seconds = np.arange(WARMUP_S + DURATION_S + 2)
        used = np.concatenate([[0.0], np.cumsum(RATE * cpu / 1000 * rng.uniform(0.9, 1.1, len(seconds) - 1))])
        pd.DataFrame({"t_ms": T0 + 1000 * seconds, "machine_busy_s": used * 1.2, "locust_s": used * 0.1, "deployment_s": used,
                      "service_s": used * 0.5, "envoy_s": used * 0.25, "opa_s": used * 0.25}).to_csv(cell / "cpu.csv", index=False)
        (cell / "cell.json").write_text(json.dumps({
            "cell": {"topology": topology, "engine": engine, "rate": RATE, "services": services, "repetition": 1},
            "offered_rate": RATE, "users": 5, "warmup_s": WARMUP_S, "duration_s": DURATION_S,
            "deployment": {"parts": 7, "bring_up_seconds": 1.0, "memory_mib": {"total": 100.0}}}))
    return run_dir


CE = ("central-entity", "envoy-opa", 5)
BASELINE = ("baseline", None, 5)


@pytest.fixture
def runs(tmp_path):
    before = write_run(tmp_path / "before", {CE: (30.0, 10.0), BASELINE: (12.0, 5.0)}, seed=1)
    # The central entity got 30% slower and costs half again the CPU; the baseline did not change.
    after = write_run(tmp_path / "after", {CE: (39.0, 15.0), BASELINE: (12.0, 5.0)}, seed=2)
    return before, after


def row(table: pd.DataFrame, case: tuple, measure: str) -> pd.Series:
    topology, engine, services = case
    found = table[(table["topology"] == topology) & (table["engine"] == (engine or "none")) & (table["measure"] == measure)]
    assert len(found) == 1
    return found.iloc[0]


def test_a_real_shift_has_its_interval_excluding_zero(runs):
    table = compare.compare(*runs)
    for measure in ("median", "p95", "cpu_per_record"):
        shifted = row(table, CE, measure)
        assert shifted["shift"] and 0 < shifted["low"] <= shifted["change"] <= shifted["high"], measure
    assert row(table, CE, "median")["relative"] == pytest.approx(0.3, abs=0.12)
    assert row(table, CE, "cpu_per_record")["relative"] == pytest.approx(0.5, abs=0.1)
    carried = row(table, CE, "rate")
    assert carried["change"] == 0 and not carried["shift"]  # both carried their 50 records a second
    assert not row(table, BASELINE, "median")["shift"]  # the same distribution, other samples


def test_the_cost_per_hop_before_and_after(runs):
    hops = compare.per_hop(*runs).set_index("measure")
    # CPU: (10 - 5) / 5 = 1 ms a hop before, (15 - 5) / 5 = 2 after; RTT: the medians of exponentials (ln 2 x mean).
    assert hops.loc["cpu_per_hop", "before"] == pytest.approx(1.0, abs=0.15)
    assert hops.loc["cpu_per_hop", "after"] == pytest.approx(2.0, abs=0.15)
    assert hops["shift"].all() and (hops["low"] > 0).all()


def test_an_identical_twin_has_its_interval_including_zero(runs, tmp_path):
    before, _ = runs
    twin = shutil.copytree(before, tmp_path / "twin")
    table = compare.compare(before, twin)
    assert not table["shift"].any()
    assert not compare.per_hop(before, twin)["shift"].any()
    spread = table[table["measure"] != "rate"]
    assert (spread["change"] == 0).all() and (spread["low"] < 0).all() and (spread["high"] > 0).all()


def test_the_command_writes_markdown_and_a_figure(runs, tmp_path, capsys):
    before, after = runs
    out = tmp_path / "out"
    assert main(["compare", str(before), str(after), "--out", str(out)]) == 0
    assert f"compare: {out / 'compare.md'}" in capsys.readouterr().out
    text = compact((out / "compare.md").read_text())
    assert "| CE (envoy-opa) | 50 | 5 |" in text and "✱" in text
    assert (out / "figures" / "compare.png").exists() and (out / "compare.csv").exists()


def test_the_bench_before_and_after(runs):
    before, after = runs
    for run, value in ((before, 0.62), (after, 0.31)):
        pd.DataFrame([{"part": "decision through ext_authz: Envoy", "value": value, "unit": "ms CPU/request"}]).to_csv(
            run / "raw" / "bench.csv", index=False)
    bench = compare.bench_before_after(before, after)
    assert bench.iloc[0]["change"] == pytest.approx(-0.31) and bench.iloc[0]["ratio"] == pytest.approx(0.5)


def test_a_missing_run_and_runs_without_a_common_case_are_refused(runs, tmp_path, capsys):
    before, _ = runs
    assert main(["compare", str(before), str(tmp_path / "nowhere")]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "no run at" in error
    other = write_run(tmp_path / "other", {("sidecar", "envoy-opa", 10): (50.0, 20.0)}, seed=3)
    assert main(["compare", str(before), str(other)]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "no case" in error and "in common" in error
