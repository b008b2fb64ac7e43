"""Parameters, profiles and the cells of a run."""

import pytest

from experiments.design import matrix


def test_default_is_the_papers_matrix_under_both_engines():
    parameters = matrix.resolve(None)
    assert parameters.profile == "paper"
    assert parameters.topologies == ["central-entity", "dynamic-router-3", "dynamic-router-6", "sidecar", "baseline"]
    assert parameters.engines == ["envoy-opa", "envoy-compiled"]
    assert (parameters.rates, parameters.services, parameters.repetitions) == ([100, 500, 1000], [5, 10, 25, 50], 5)
    # 4 enforcing topologies under 2 engines, and the baseline once, per rate, services and repetition
    assert len(parameters.cells()) == (4 * 2 + 1) * 3 * 4 * 5
    assert (parameters.bench_records, parameters.bench_rounds) == (1000, 3)


def test_quick_profile_and_explicit_values():
    parameters = matrix.resolve("quick", topologies=["ce", "dr3", "dr6", "sa"], duration=7)
    assert parameters.topologies == ["central-entity", "dynamic-router-3", "dynamic-router-6", "sidecar"]
    assert parameters.engines == ["envoy-opa", "envoy-compiled"]
    assert (parameters.rates, parameters.services, parameters.repetitions, parameters.duration) == ([100, 500], [5, 10], 1, 7)
    assert len(matrix.resolve("quick").cells()) == (4 * 2 + 1) * 2 * 2


@pytest.mark.parametrize("given", [{"topologies": ["mesh"]}, {"topologies": ["sa", "sidecar"]}, {"rates": [0]},
                                   {"mix": "none"}, {"repetitions": 0}, {"engines": []},
                                   {"load": "half-open"}, {"arrivals": "bursty"}, {"max_in_flight": 0}, {"late_tolerance_ms": -1}, {"prime": -1},
                                   {"engines": ["envoy-opa", "envoy-opa"]}, {"bench_records": 0}, {"bench_rounds": -1}])
def test_refused_parameters(given):
    with pytest.raises(matrix.ParameterError):
        matrix.resolve("quick", **given)


def test_an_unknown_engine_is_refused_with_the_known_ones_named():
    with pytest.raises(matrix.ParameterError, match=r"engine 'compiled' is not one of \['envoy-opa', 'envoy-compiled'\]"):
        matrix.resolve("quick", engines=["compiled"])
    assert matrix.resolve("quick", engines=["envoy-compiled"]).engines == ["envoy-compiled"]


def test_cells_keep_repetitions_outermost_a_topologys_engines_together_and_the_baseline_once():
    cells = matrix.resolve("quick", repetitions=2).cells()
    assert [c.repetition for c in cells] == [1] * 36 + [2] * 36
    first_case = cells[:9]
    assert [(c.topology, c.engine) for c in first_case] == [
        ("central-entity", "envoy-opa"), ("central-entity", "envoy-compiled"),
        ("dynamic-router-3", "envoy-opa"), ("dynamic-router-3", "envoy-compiled"),
        ("dynamic-router-6", "envoy-opa"), ("dynamic-router-6", "envoy-compiled"),
        ("sidecar", "envoy-opa"), ("sidecar", "envoy-compiled"), ("baseline", None),
    ]
    assert {(c.rate, c.services) for c in first_case} == {(100, 5)}
    assert len({c.key for c in cells}) == len(cells)


def test_one_engine_runs_its_topologies_and_the_baseline():
    cells = matrix.resolve("quick", engines=["envoy-compiled"], rates=[100], services=[5]).cells()
    assert [(c.topology, c.engine) for c in cells] == [
        ("central-entity", "envoy-compiled"), ("dynamic-router-3", "envoy-compiled"), ("dynamic-router-6", "envoy-compiled"),
        ("sidecar", "envoy-compiled"), ("baseline", None),
    ]


def test_keys_and_labels_name_the_engine():
    compiled = matrix.Cell("central-entity", "envoy-compiled", 100, 5, 1)
    assert compiled.key == "central-entity_envoy-compiled_r100_n5_rep1"
    assert compiled.label == "CE (compiled) 100 req/s 5 services rep 1"
    reference = matrix.Cell("sidecar", "envoy-opa", 500, 10, 2)
    assert reference.key == "sidecar_envoy-opa_r500_n10_rep2"
    assert reference.label == "SA (envoy-opa) 500 req/s 10 services rep 2"
    baseline = matrix.Cell("baseline", None, 100, 5, 1)
    assert (baseline.key, baseline.label) == ("baseline_r100_n5_rep1", "baseline 100 req/s 5 services rep 1")


def test_envoy_opa_cells_are_also_found_under_the_keys_of_runs_recorded_before_engines():
    assert matrix.Cell("central-entity", "envoy-opa", 100, 5, 1).folder_names == ["central-entity_envoy-opa_r100_n5_rep1", "central-entity_r100_n5_rep1"]
    # no older run had the compiled engine, and the baseline's key has not changed
    assert matrix.Cell("central-entity", "envoy-compiled", 100, 5, 1).folder_names == ["central-entity_envoy-compiled_r100_n5_rep1"]
    assert matrix.Cell("baseline", None, 100, 5, 1).folder_names == ["baseline_r100_n5_rep1"]


def test_closed_loop_users_keep_each_under_its_rate():
    parameters = matrix.resolve("quick", load="closed", user_rate=10)
    assert [parameters.users(rate) for rate in (1, 100, 500, 1000, 1001)] == [1, 10, 50, 100, 101]


def test_the_profiles_run_an_open_loop_of_one_pacing_user():
    for profile in ("quick", "paper"):
        parameters = matrix.resolve(profile)
        assert (parameters.load, parameters.arrivals, parameters.max_in_flight, parameters.late_tolerance_ms) == ("open", "constant", 1000, 100)
        assert [parameters.users(rate) for rate in (1, 500, 1000)] == [1, 1, 1]
    assert matrix.resolve("quick").load_label == "open loop, constant arrivals"
    assert matrix.resolve("quick", arrivals="poisson").load_label == "open loop, Poisson arrivals"
    assert matrix.resolve("quick", load="closed").load_label == "closed loop"


def test_a_run_recorded_before_the_open_loop_ran_the_closed_loop():
    recorded = matrix.resolve("quick").to_json()
    for name in ("load", "arrivals", "max_in_flight", "late_tolerance_ms"):
        del recorded[name]
    stored = matrix.Parameters.from_json(recorded)
    assert stored.load == "closed" and stored.users(100) == 10
    assert matrix.conflicts(stored, load="open") == ["--load open (the run has closed)"]


def test_resuming_reports_parameters_that_differ():
    stored = matrix.resolve("quick")
    assert matrix.conflicts(stored, topologies=["ce", "dr3", "dr6", "sa", "baseline"], duration=None) == []
    assert matrix.conflicts(stored, profile="paper", duration=60) == ["--profile paper (the run has quick)", "--duration 60 (the run has 20)"]
    assert matrix.Parameters.from_json(stored.to_json()) == stored


def test_resuming_with_more_repetitions_adds_them_allowed():
    stored = matrix.resolve("quick", repetitions=1)
    assert matrix.conflicts(stored, repetitions=1) == [] and matrix.conflicts(stored, repetitions=3) == []


def test_resuming_with_fewer_repetitions_is_refused_denied():
    stored = matrix.resolve("quick", repetitions=3)
    assert matrix.conflicts(stored, repetitions=2) == ["--repetitions 2 (the run has 3)"]


def test_resuming_keeps_the_runs_engines():
    stored = matrix.resolve("quick", engines=["envoy-compiled"])
    assert matrix.conflicts(stored, engines=["envoy-compiled"]) == []
    assert matrix.conflicts(stored, engines=["envoy-opa", "envoy-compiled"]) == [
        "--engines ['envoy-opa', 'envoy-compiled'] (the run has ['envoy-compiled'])"]


def test_a_run_recorded_before_engines_ran_envoy_opa_only():
    recorded = matrix.resolve("quick").to_json()
    for name in ("engines", "bench_records", "bench_rounds"):
        del recorded[name]
    stored = matrix.Parameters.from_json(recorded)
    assert stored.engines == ["envoy-opa"]
    assert (stored.bench_records, stored.bench_rounds) == (1000, 3)  # the bench its sessions take, were it resumed
    assert {(c.topology, c.engine) for c in stored.cells()} == {(t, "envoy-opa") for t in matrix.TOPOLOGIES[:-1]} | {("baseline", None)}
    assert matrix.conflicts(stored, engines=["envoy-opa"]) == []
    assert matrix.conflicts(stored, engines=["envoy-opa", "envoy-compiled"]) == [
        "--engines ['envoy-opa', 'envoy-compiled'] (the run has ['envoy-opa'])"]
