"""The soak, short (about 40 s): a held rate of mixed records through a supervised
dynamic-router-3 deployment while a service, an Envoy, a router or an OPA is killed or paused
and the rules are reloaded."""

import csv

import pytest

from complyroute.runtime.local import deployment
from experiments.run import soak

pytestmark = pytest.mark.scale


def test_quick_soak_restarts_killed_parts_accounts_for_every_request_audits_clean_and_never_delivers_a_denied_record(tmp_path):
    folder, [summary] = soak.run(soak.Parameters(**soak.QUICK), tmp_path)
    print((folder / "report.md").read_text())
    assert deployment.read_state() is None and not deployment.processes_using(summary["run_dir"])
    # Every request Locust sent has its row, and every row an outcome.
    assert summary["all_accounted"] and summary["requests"] > 100
    assert sum(summary["outcomes"].values()) == summary["requests"]
    assert {"kill", "pause", "reload"} <= {f["kind"] for f in summary["faults"]}
    # Every killed part was started again by supervisord within 2 s (restart_s: its new pid seen;
    # 0.035 s under a load average of 30 on 2 cores) and answered again. How long it then took to
    # answer is the part's own start, the report's figure and no bound here: under that load a Node
    # service took 3.3 s to listen again.
    for fault in summary["faults"]:
        assert fault["recovery_s"] is not None, fault
        if fault["kind"] == "kill":
            assert fault["restart_s"] is not None and fault["restart_s"] <= min(2.0, fault["recovery_s"]), fault
    assert summary["audit"]["exit_code"] == 0 and summary["audit"]["clean"]
    assert summary["audit"]["forbidden"] == 0 and summary["audit"]["undecided"] == 0 and summary["audit"]["lines"] > 0
    assert summary["outcomes"].get("as expected", 0) > summary["requests"] / 2

    # The denied twin: the records the rules deny (451 expected) are never answered 200, whatever
    # fault was under way. A part down means refusals (503, 502, no answer), never a delivery.
    with (folder / summary["folder"] / "requests.csv").open() as file:
        rows = list(csv.DictReader(file))
    denied = [row for row in rows if row["expected"] == "451"]
    assert denied, "the mixed load sent records the rules deny"
    assert not [row for row in denied if row["status"] == "200"]
    assert {row["status"] for row in rows if row["status"] != row["expected"]} <= {"0", "502", "503"}
