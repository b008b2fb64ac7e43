"""`make bench`'s measurement, real and small: every part of a hop and its floor (real Envoy,
OPA and service processes) started on the bench's own ports and sockets, 100 records each for
one round, then the policy's `opa bench` against the baseline commit (at 5 services only: the
50-service cases are the same code over larger deployments, and asking their decision spaces and
benching them took half of this test's CPU; and measured in the central entity alone, each
deciding topology's answers checked: `opa bench` runs a second per case, and the other three
topologies' six cases of both rule sets took 20 of the remaining 47 CPU-s); the CSV it writes,
and the run report's section that shows it. Its ports are clear of a deployment's (own_network): `make test-scale` runs it beside the
deployments of 50 services (the scale marker: `make test` leaves it out).

An experiments run measures it before its cells (runner.measure_bench, with the bench standing
in: tests/unit/experiments/run/test_experiments_runner.py); the real run end to end
(tests/e2e/experiments/test_experiments_run_e2e.py) takes --bench-rounds 0, so that this minute and
more is spent beside the deployments instead of between them."""

import io

import pytest

from complyroute.policy.ruleset import RuleSet

from experiments.analysis import bench_sum
from experiments.report.report import bench_blocks
from experiments.run import bench, bench_parts

from .helpers import STARVED_MACHINE_TIMEOUTS

pytestmark = [pytest.mark.own_network, pytest.mark.scale]


def test_the_bench_measures_every_part_against_its_floor_and_the_report_shows_it(tmp_path):
    csv_file = tmp_path / "raw" / "bench.csv"
    log = io.StringIO()
    rows = bench.run(RuleSet.of("policies"), out_file=csv_file, records=100, rounds=1, out=log, policy_sizes=(5,),
                     policy_topologies=("central-entity",), engine_settings=STARVED_MACHINE_TIMEOUTS)
    assert "bench: round 1/1 measured" in log.getvalue()
    measured = bench_sum.read(csv_file)
    assert list(measured["part"]) == [row.part for row in rows]
    assert "compiled engine: Envoy deciding the hop" in set(measured["part"]) and (measured["value"] >= 0).all()
    # The parts a record of the central entity crosses, again with their records paced as at a cell's rate.
    assert "bench: paced round 1/1 measured" in log.getvalue()
    paced = measured[measured["unit"] == bench_sum.PACED_UNIT]
    assert set(paced["process"]) == bench_sum.processes()
    assert (paced["value"] > 0).all()
    # The entry's full decision and label token through ext_authz beside the plugin's floor, and its decision log beside that.
    entry = measured.set_index("part").loc[[bench_parts.ENTRY_OPA, "the entry's decision and label token, with its decision log: OPA"]]
    assert list(entry["floor"]) == ["OPA allowing everything, through ext_authz", bench_parts.ENTRY_OPA]
    assert (entry["value"] > 0).all() and entry["floor_value"].notna().all()
    # What the access log and hop counters cost a hop, under each engine, beside the same points without them.
    observability = measured[measured["part"].str.startswith("access log and hop counters")]
    assert len(observability) == 2 and (observability["target"] == bench.OBSERVABILITY_TARGET).all()
    assert observability["floor"].str.contains("alternately without them").all()
    # This rule set against the baseline commit's, an allowed and a denied record, in the central entity.
    policy = [part for part in measured["part"] if part.startswith("policy: ")]
    assert policy == ["policy: central-entity-5 allowed", "policy: central-entity-5 denied"], policy
    meta = {"sessions": [{"started_at": "2026-11-27T12:00:00+0000",
                          "bench": {"csv": "bench.csv", "records": 100, "rounds": 1, "seconds": 80.0, "targets_not_met": []}}]}
    (tmp_path / "figures").mkdir()
    blocks = bench_blocks(tmp_path, meta, tmp_path / "figures")
    assert blocks[0] == ("h2", "What each part of a hop costs, beside its floor")
    table = next(content[0] for kind, *content in blocks if kind == "table")
    assert "compiled engine: Envoy deciding the hop" in table.to_string()
    assert "1 rounds of 100 sequential records per part" in "\n".join(str(content[0]) for kind, *content in blocks if kind == "p")
    [figure] = [content[0] for kind, *content in blocks if kind == "figure"]
    assert figure.stat().st_size > 5000
