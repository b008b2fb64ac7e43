"""The fault schedule, a kill's record and the soak's accounting, without a deployment."""

import csv
import subprocess
from pathlib import Path

from complyroute.runtime.local import faults
from experiments.run import soak

STATE = {"parts": [
    {"name": "control/bundles", "kind": "control"}, {"name": "entry/opa", "kind": "opa"}, {"name": "entry/envoy", "kind": "envoy"},
    {"name": "router-node-1-1/opa", "kind": "opa"}, {"name": "router-node-1-1/envoy", "kind": "envoy"},
    {"name": "svc-01", "kind": "service"}, {"name": "svc-02", "kind": "service"},
]}


def test_schedule_hits_every_kind_of_part_and_reloads_allowed():
    schedule = faults.schedule(STATE, duration=40, every=2, start=1, seed=3)
    assert [f.at for f in schedule] == [1 + 2 * n for n in range(20)]
    assert {f.kind for f in schedule} == {"kill", "pause", "reload"}
    def kinds_hit(fault_kind):
        return {faults.part_kind(STATE, next(p for p in STATE["parts"] if p["name"] == f.target)) for f in schedule if f.kind == fault_kind}

    assert kinds_hit("kill") == kinds_hit("pause") == {"service", "envoy", "router", "opa"}
    assert schedule[1].kind == "pause" and schedule[1].target.endswith("/opa")  # pauses begin with an OPA
    assert all(f.seconds == 2.0 for f in schedule if f.kind == "pause")
    assert "control/bundles" not in {f.target for f in schedule}
    assert schedule == faults.schedule(STATE, duration=40, every=2, start=1, seed=3)  # seeded


def _killed_part(monkeypatch, restarts: bool):
    """A real process in a group of its own as a part's; supervisord's view and the health check
    scripted: after the kill a new pid and a healthy part, or nothing running and no answer."""
    victim = subprocess.Popen(["sleep", "60"], start_new_session=True)
    replacement = subprocess.Popen(["sleep", "60"], start_new_session=True) if restarts else None
    alive = lambda: victim.poll() is None  # noqa: E731 -- read at each call
    monkeypatch.setattr(faults, "_current_pid", lambda state, name: victim.pid if alive() else (replacement.pid if replacement else None))
    monkeypatch.setattr(faults, "_healthy", lambda part: replacement is not None and not alive())
    return victim, replacement


def test_a_killed_part_restarted_and_answering_again_is_recovered_allowed(monkeypatch):
    victim, replacement = _killed_part(monkeypatch, restarts=True)
    try:
        record = faults.inject(STATE, faults.Fault(0.0, "kill", "svc-01"), 0.0, recovery_timeout=5)
    finally:
        replacement.kill()
    assert victim.wait(5) == -9 and record.died_at is not None
    assert record.old_pid == victim.pid and record.new_pid == replacement.pid
    assert record.error is None and 0 <= record.restart_s <= record.recovery_s


def test_a_killed_part_nobody_restarts_is_recorded_not_recovered_denied(monkeypatch):
    victim, _ = _killed_part(monkeypatch, restarts=False)
    record = faults.inject(STATE, faults.Fault(0.0, "kill", "svc-01"), 0.0, recovery_timeout=0.3)
    assert victim.wait(5) == -9
    assert record.new_pid is None and record.restart_s is None and record.recovery_s is None
    assert record.error == "not healthy again within 0 s"


def test_soak_accounts_every_request_and_attributes_losses_to_faults_allowed(tmp_path):
    with (tmp_path / "requests.csv").open("w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(["t_send_ms", "rtt_ms", "status", "record", "expected"])
        for t, status in [(100.0, 200), (101.0, 503), (101.5, 0), (102.0, 200), (103.5, 451), (104.0, 503)]:
            writer.writerow([t * 1000, 10, status, "allowed", 451 if t == 103.5 else 200])
    (tmp_path / "locust.log").write_text("Type     Name    # reqs      # fails |    Avg\n"
                                         "POST     /process     6   3(50.00%) |     32\n         Aggregated     6   3(50.00%) |     32\n")
    records = [faults.FaultRecord("kill", "entry/opa", "opa", 1.0, 100.9, restart_s=0.02, recovery_s=0.2),
               faults.FaultRecord("reload", "policy", "policy", 3.0, 103.0, recovery_s=0.1)]
    summary = soak.analyse(tmp_path, records, 99.0, soak.Parameters(duration=10, warmup=0, fault_every=2))
    assert summary["all_accounted"] and summary["requests"] == 6
    assert summary["outcomes"] == {"as expected": 3, "status 503": 2, "connection error or timeout": 1}
    assert [f["lost"] for f in summary["faults"]] == [2, 1]
    assert summary["faults"][0]["outage_s"] == 0.61  # until the lost request at 101.5 s gave up (10 ms)
    assert summary["mttr_s"] == 0.2 and summary["mttf_s"] == 1.8 and summary["availability"] == 0.9
    assert summary["lost_per_failure"] == 2 and summary["lost_before_first_fault"] == 0


def test_soak_user_rate_sets_how_many_users_hold_the_rate_allowed(monkeypatch):
    from experiments import __main__ as cli
    ran = []
    monkeypatch.setattr(soak, "run", lambda parameters, results, run_id=None: ran.append(parameters) or (None, []))
    assert cli.main(["soak", "--rate", "50", "--user-rate", "2"]) == 0
    assert ran[0].user_rate == 2 and ran[0].users == 25
    command = soak.locust_command({"entry_url": "https://127.0.0.1:8080", "topology": "sidecar-5"}, Path("/tmp/x"), ran[0])
    assert command[command.index("--users") + 1] == "25" and float(command[command.index("--user-rate") + 1]) == 2


def test_soak_user_rate_below_one_or_above_the_rate_is_refused_denied(monkeypatch, capsys):
    from experiments import __main__ as cli
    monkeypatch.setattr(soak, "run", lambda parameters, results, run_id=None: (_ for _ in ()).throw(AssertionError("ran")))
    for given in (["--user-rate", "0.5"], ["--rate", "20", "--user-rate", "30"]):
        assert cli.main(["soak", *given]) == 2
        assert "--user-rate" in capsys.readouterr().err
