"""What a soak of compliant sets measures, without a deployment (experiments/run/sets.py): the
replicated manifest, each step's balance read from audit lines, and a kill's losses told apart
(inside the killed instance, on their way into it, beyond), each class beside a twin that is not it."""

import json

import pytest

from experiments.run import sets
from experiments.run.sets import BEYOND, INSIDE, ON_ITS_WAY

STEPS = ["step-01", "step-02", "step-03"]
STEP_OF = {"svc-01-1": "step-01", "svc-01-2": "step-01", "svc-02-1": "step-02", "svc-02-2": "step-02", "svc-03-1": "step-03",
           "svc-03-2": "step-03"}
KILLED_AT = DIED_AT = 1000.0  # the signal, and when the process was seen exited (apart in the tests that need it)


def row(status=503, code="HOP_UNAVAILABLE", t=999.9, rtt=0.2, expected=200, request_id="r"):
    return {"t": t, "rtt": rtt, "status": status, "code": code, "expected": expected, "request_id": request_id}


# ---- the manifest ---------------------------------------------------------------------------------

def test_every_step_gets_its_replicas_alike_and_one_replica_keeps_the_generated_ids():
    topology = sets.load_manifest("dynamic-router-3", 3, "envoy-compiled", replicas=2, work_iterations=2000)
    assert [i.id for i in topology.instances] == ["svc-01-1", "svc-01-2", "svc-02-1", "svc-02-2", "svc-03-1", "svc-03-2"]
    assert {len(topology.instances_of(step)) for step in topology.steps} == {2}
    first, second = topology.instances_of("step-02")
    assert (first.region, first.certifications, first.purposes) == (second.region, second.certifications, second.purposes)
    assert first.node != second.node  # spread over the service nodes
    assert topology.workload == {"work_iterations": 2000} and topology.engine["kind"] == "envoy-compiled"
    # Denied twin: one replica is the manifest as `make deploy` loads it, its own work kept.
    single = sets.load_manifest("dynamic-router-3", 3, None, replicas=1)
    assert [i.id for i in single.instances] == ["svc-01", "svc-02", "svc-03"] and single.workload == {"work_iterations": 100}


# ---- balance ------------------------------------------------------------------------------------------

def write_audit(run_dir, lines_by_instance):
    (run_dir / "audit").mkdir()
    for instance, lines in lines_by_instance.items():
        (run_dir / "audit" / f"{instance}.jsonl").write_text(
            "".join(json.dumps({"ts": ts * 1000, "instance": instance, "step": STEP_OF[instance], "request_id": rid}) + "\n"
                    for ts, rid in lines) + '{"ts": 1, "instance": "partial')  # a killed instance's torn last line


def test_balance_counts_each_instances_share_of_its_step_from_the_audit_lines(tmp_path):
    write_audit(tmp_path, {"svc-01-1": [(1, f"a{n}") for n in range(55)], "svc-01-2": [(1, f"b{n}") for n in range(45)]})
    index = sets.audit_index(tmp_path)
    assert len(index) == 100 and index["a0"] == [(1.0, "svc-01-1", "step-01")]
    shares = sets.balance(index)
    assert shares == {"step-01": {"svc-01-1": 0.55, "svc-01-2": 0.45}}
    assert sets.balanced(shares)


def test_a_step_outside_the_tolerance_is_not_balanced_denied(tmp_path):
    write_audit(tmp_path, {"svc-01-1": [(1, f"a{n}") for n in range(61)], "svc-01-2": [(1, f"b{n}") for n in range(39)]})
    assert not sets.balanced(sets.balance(sets.audit_index(tmp_path)))
    assert not sets.balanced({}), "no records: no balance shown"


# ---- a kill's losses told apart ---------------------------------------------------------------------

def test_a_record_the_killed_instance_had_received_before_the_kill_was_inside_it():
    lines = [(999.5, "svc-01-1", "step-01"), (999.8, "svc-02-2", "step-02")]
    assert sets.classify_loss(row(), lines, "svc-02-2", KILLED_AT, DIED_AT, STEPS, STEP_OF) == INSIDE
    # Still inside while it waited for a later step's answer: the answer had to come back through it.
    waiting = lines + [(999.9, "svc-03-1", "step-03")]
    assert sets.classify_loss(row(), waiting, "svc-02-2", KILLED_AT, DIED_AT, STEPS, STEP_OF) == INSIDE
    # Denied twins: its line at the killed instance from after the kill (the restarted process's),
    # or an answer from before the kill.
    after = [(999.5, "svc-01-1", "step-01"), (1000.2, "svc-02-2", "step-02")]
    assert sets.classify_loss(row(rtt=0.5), after, "svc-02-2", KILLED_AT, DIED_AT, STEPS, STEP_OF) == BEYOND
    assert sets.classify_loss(row(rtt=0.05), lines, "svc-02-2", KILLED_AT, DIED_AT, STEPS, STEP_OF) == BEYOND


def test_a_record_the_sender_had_before_the_kill_and_whose_hop_failed_under_it_was_on_its_way_into_it():
    lines = [(999.9, "svc-01-1", "step-01")]
    assert sets.classify_loss(row(), lines, "svc-02-2", KILLED_AT, DIED_AT, STEPS, STEP_OF) == ON_ITS_WAY
    assert sets.classify_loss(row(status=502, code="NEXT_HOP_FAILED"), lines, "svc-02-2", KILLED_AT, DIED_AT, STEPS, STEP_OF) == ON_ITS_WAY
    # Denied twins: the sender received it after the kill (the replica up should have had it),
    # another code than a hop failing under it, or a line at the killed step (its replica's).
    assert sets.classify_loss(row(rtt=0.5), [(1000.1, "svc-01-1", "step-01")], "svc-02-2", KILLED_AT, DIED_AT, STEPS, STEP_OF) == BEYOND
    assert sets.classify_loss(row(code="COMPLIANT_INSTANCES_DOWN"), lines, "svc-02-2", KILLED_AT, DIED_AT, STEPS, STEP_OF) == BEYOND
    assert sets.classify_loss(row(status=0, code=""), lines, "svc-02-2", KILLED_AT, DIED_AT, STEPS, STEP_OF) == BEYOND
    replica = lines + [(999.95, "svc-02-1", "step-02")]
    assert sets.classify_loss(row(), replica, "svc-02-2", KILLED_AT, DIED_AT, STEPS, STEP_OF) == BEYOND


def test_a_record_sent_after_the_signal_but_before_the_process_had_exited_was_on_its_way():
    # The signal at 999.99, the process gone at 1000.0: its sockets took the record meanwhile.
    result = sets.classify_losses([row(request_id="way", t=999.995, rtt=0.1)],
                                  [{"target": "svc-01-1", "injected_at": 999.99, "died_at": DIED_AT, "until": 1004.0}],
                                  {}, STEPS, STEP_OF)
    assert result[ON_ITS_WAY] == 1 and result["per_kill"][0]["died_after_s"] == 0.01
    # A record answered between the signal and the exit seen (a loaded machine wakes the waiter
    # late) was still lost to the kill: inside, by its line at the killed instance.
    result = sets.classify_losses([row(request_id="in", t=999.9, rtt=0.095)],
                                  [{"target": "svc-01-1", "injected_at": 999.99, "died_at": DIED_AT, "until": 1004.0}],
                                  {"in": [(999.91, "svc-01-1", "step-01")]}, STEPS, STEP_OF)
    assert result[INSIDE] == 1
    # Denied twin: sent after the process had exited.
    result = sets.classify_losses([row(request_id="late", t=1000.005, rtt=0.1)],
                                  [{"target": "svc-01-1", "injected_at": 999.99, "died_at": DIED_AT, "until": 1004.0}],
                                  {}, STEPS, STEP_OF)
    assert result[BEYOND] == 1


def test_at_the_first_step_a_record_the_client_sent_before_the_kill_was_on_its_way():
    assert sets.classify_loss(row(), [], "svc-01-1", KILLED_AT, DIED_AT, STEPS, STEP_OF) == ON_ITS_WAY
    # Denied twins: sent after the kill (over a connection to the dead instance: the replica up should have had it).
    assert sets.classify_loss(row(t=1000.01), [], "svc-01-1", KILLED_AT, DIED_AT, STEPS, STEP_OF) == BEYOND
    assert sets.classify_loss(row(code="COMPLIANT_INSTANCES_DOWN"), [], "svc-01-1", KILLED_AT, DIED_AT, STEPS, STEP_OF) == BEYOND


def test_classify_losses_counts_per_kill_only_what_it_lost_and_names_the_answers_beyond():
    index = {"in": [(999.5, "svc-02-2", "step-02")], "way": [(999.9, "svc-01-1", "step-01")], "late": [(1000.5, "svc-01-2", "step-01")]}
    rows = [row(request_id="in"), row(request_id="way"), row(request_id="late", t=1000.4, rtt=0.3, status=0, code=""),
            row(request_id="fine", status=200, code=""),  # answered as expected: not a loss
            row(request_id="next", t=1005, rtt=0.1)]  # answered after the next fault: not this kill's
    result = sets.classify_losses(rows, [{"target": "svc-02-2", "injected_at": DIED_AT, "died_at": DIED_AT, "until": 1004.0}], index, STEPS, STEP_OF)
    assert (result[INSIDE], result[ON_ITS_WAY], result[BEYOND]) == (1, 1, 1)
    assert result["beyond_answers"] == {"0 -": 1} and result["kills"] == 1


@pytest.mark.parametrize("balanced", [True, False, None])
def test_the_report_says_each_cells_losses_and_whether_its_steps_are_balanced(balanced):
    summary = {"paper_name": "DR_3", "parameters": {"engine": "envoy-opa", "replicas": 2},
               "service_kills": {"kills": 2, INSIDE: 3, ON_ITS_WAY: 1, BEYOND: 0, "beyond_answers": {},
                                 "per_kill": [{"died_after_s": 0.0042}, {"died_after_s": 0.0125}]},
               "balance": {"step-01": {"svc-01-1": 0.5, "svc-01-2": 0.5}}, "balanced": balanced}
    row_text = sets.report_lines([summary])[-1]
    assert row_text.startswith("| DR_3 envoy-opa ×2 | 2 | 12.5 | 4 | 3 | 1 | 0 | 0.0 | none | step-01: 50.0%/50.0%")
    assert {True: "(within ±10%)", False: "(NOT within ±10%)", None: "50.0%/50.0% |"}[balanced] in row_text


# ---- the commands that deploy them -------------------------------------------------------------------

def test_the_capacity_search_deploys_the_runs_replicas_and_work_and_by_default_the_manifest_as_it_is(tmp_path):
    from experiments.design import capacity, matrix
    from experiments.run import capacity_run

    cell = matrix.Cell("central-entity", "envoy-compiled", 50, 1, 0)
    heavy = capacity_run.CapacityRunner(tmp_path / "a", capacity.Parameters(replicas=2, work_iterations=20000, services=[1]))
    deployed = heavy.manifest_of(cell)
    assert [i.id for i in deployed.instances] == ["svc-01-1", "svc-01-2"] and deployed.workload == {"work_iterations": 20000}
    # Denied twin: without them, the search deploys what `make deploy` would.
    plain = capacity_run.CapacityRunner(tmp_path / "b", capacity.Parameters(services=[1])).manifest_of(cell)
    assert [i.id for i in plain.instances] == ["svc-01"] and plain.workload == {"work_iterations": 100}


@pytest.mark.parametrize("args, words", [
    (["--replicas", "0"], "--replicas must be from 1"),
    (["--fault-kinds", "explode"], "--fault-kinds explode"),
    (["--fault-parts", "service", "disk"], "--fault-parts service disk"),
])
def test_the_soaks_bad_replicas_or_faults_get_one_line_and_exit_2_before_anything_deploys(tmp_path, capsys, args, words):
    from experiments import __main__ as cli

    assert cli.main(["--results", str(tmp_path), "soak", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and words in err and err.count("\n") == 1
    assert not list(tmp_path.iterdir()), "no run folder made"


def test_a_soak_of_service_kills_with_replicas_is_a_valid_soak():
    from experiments.run import soak

    parameters = soak.Parameters(replicas=2, fault_kinds=["kill"], fault_parts=["service"])
    assert parameters.replicas == 2 and parameters.fault_kinds == ["kill"]


def test_an_answer_beyond_is_named_by_status_code_and_what_envoy_said_when_a_point_says_it():
    said = row(code="COMPLIANT_INSTANCES_DOWN")
    said["message"] = "no instance the rules allow could be reached (no_healthy_upstream); the record went to no instance"
    assert sets.answer_name(said) == "503 COMPLIANT_INSTANCES_DOWN (no_healthy_upstream)"
    said["message"] = "the enforcement point could not deliver the record (upstream_reset_before_response_started{connection_termination})"
    assert sets.answer_name(said) == "503 COMPLIANT_INSTANCES_DOWN (upstream_reset_before_response_started{connection_termination})"
    # Denied twins: no message (a connection error), or a message without a parenthesis.
    assert sets.answer_name(row(status=0, code="")) == "0 -"
    assert sets.answer_name({**row(), "message": "the rules deny it"}) == "503 HOP_UNAVAILABLE"
