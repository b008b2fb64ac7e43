"""A tiny capacity search end to end (about 55 s): the central entity under envoy-opa and the
baseline (searched first and again last), 5 services, steps of 1 + 3 s from 20 req/s to at most 40 (the max rate) and at most
3 steps per search, against real Envoy, OPA and service processes, through the command line;
the table and steps.csv. Whether a step holds depends on how busy the shared machine is (a CE
step at 20 req/s once failed with a p99 of 1.4 s while other tests ran): the test asserts that
the search, the rows and the table agree, not which steps held."""

import csv
import json
import re
import subprocess
import sys

import pytest

from complyroute.topology.manifest import REPO

pytestmark = pytest.mark.scale


def test_a_tiny_search_of_the_central_entity_and_the_baseline(tmp_path, no_deployment):
    run = subprocess.run(
        [sys.executable, "-m", "experiments", "--results", str(tmp_path), "capacity", "--topologies", "ce", "--engines", "envoy-opa",
         "--services", "5", "--start-rate", "20", "--max-rate", "40", "--step-seconds", "3", "--step-warmup", "1", "--max-steps", "3",
         "--run-id", "tiny"],
        cwd=REPO, capture_output=True, text=True, timeout=240,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    run_dir = tmp_path / "tiny"
    with (run_dir / "raw" / "steps.csv").open() as file:
        steps = list(csv.DictReader(file))
    searches = [(row["topology"], row["engine"]) for row in steps]
    assert sorted(set(searches)) == [("baseline", "none"), ("central-entity", "envoy-opa")]
    for topology, engine in set(searches):
        rows = [row for row in steps if (row["topology"], row["engine"]) == (topology, engine)]
        assert [row["step"] for row in rows] == [str(k) for k in range(1, len(rows) + 1)]
        assert rows[0]["offered_rate"] == "20" and 1 <= len(rows) <= 3
        # the search's path: 40 after 20 held; 20 again after 20 failed (its confirmation), and 10 after it failed too
        offered = [int(row["offered_rate"]) for row in rows]
        held = [row["held"] == "True" for row in rows]
        if len(rows) > 1:
            assert offered[1] == (40 if held[0] else 20)
        if len(rows) > 2 and offered[:2] == [20, 20]:
            assert offered[2] == (40 if held[1] else 10)
        for row in rows:
            # 3 s measured: every request of the window scheduled, each sent or missed, the verdict consistent
            assert int(row["scheduled"]) == 3 * int(row["offered_rate"])
            assert int(row["sent"]) + int(row["missed"]) == int(row["scheduled"])
            assert (row["held"] == "True") == (row["why_not"] == "")
            if row["p99_ms"]:
                assert 0 < float(row["p50_ms"]) <= float(row["p99_ms"])
        step_dir = run_dir / "raw" / f"{topology}{'_' + engine if engine != 'none' else ''}_n5" / "step01_r20"
        assert (step_dir / "requests.csv.gz").exists() and json.loads((step_dir / "step.json").read_text())["locust"]["exit_code"] == 0
    with (run_dir / "report" / "tables" / "capacity.csv").open() as file:
        table = {row["topology"]: row for row in csv.DictReader(file)}
    assert set(table) == {"central-entity", "baseline"}
    capacity = {}
    for topology, row in table.items():
        held = [int(s["offered_rate"]) for s in steps if s["topology"] == topology and s["held"] == "True"]
        capacity[topology] = max(held) if held else None
        assert row["capacity"] == (str(capacity[topology]) if held else "")
    # A share once both held a rate, none while either held none: beside make test's other streams the
    # baseline once held none of 20, 20 and 10 req/s (p99 over 500 ms, a send missed, both cores busy).
    for topology, row in table.items():
        both = capacity[topology] is not None and capacity["baseline"] is not None
        assert row["share_of_baseline"] == (str(capacity[topology] / capacity["baseline"]) if both else ""), (row, steps)
    meta = json.loads((run_dir / "metadata.json").read_text())
    assert meta["outcome"] == "finished" and meta["versions"]["locust"] == "2.47.0"
    assert [(s["topology"], s["closing"]) for s in meta["searches"]] == [("baseline", False), ("central-entity", False), ("baseline", True)]
    with (run_dir / "raw" / "closing-steps.csv").open() as file:
        closing = list(csv.DictReader(file))
    assert closing and {row["topology"] for row in closing} == {"baseline"} and closing[0]["offered_rate"] == "20"
    markdown = (run_dir / "report" / "capacity.md").read_text()
    rows = re.sub(r" {2,}", " ", markdown)  # tabulate pads each column to its widest cell
    assert "## Capacity" in markdown and "| CE | envoy-opa | 5 |" in rows
    assert "## The baseline, first and last" in markdown and "At 5 services the baseline held" in markdown
    assert (run_dir / "report" / "figures" / "capacity_latency.png").exists()
    assert run.stdout.count(" step ") == len(steps) + len(closing)  # a progress line per step
