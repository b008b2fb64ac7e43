"""Parameters, profiles and the cells of a run."""

import pytest

from experiments import matrix


def test_default_is_the_papers_matrix():
    parameters = matrix.resolve(None)
    assert parameters.profile == "paper"
    assert parameters.topologies == ["central-entity", "dynamic-router-3", "dynamic-router-6", "sidecar", "baseline"]
    assert (parameters.rates, parameters.services, parameters.repetitions) == ([100, 500, 1000], [5, 10, 25, 50], 5)
    assert len(parameters.cells()) == 5 * 3 * 4 * 5


def test_quick_profile_and_explicit_values():
    parameters = matrix.resolve("quick", topologies=["ce", "dr3", "dr6", "sa"], duration=7)
    assert parameters.topologies == ["central-entity", "dynamic-router-3", "dynamic-router-6", "sidecar"]
    assert (parameters.rates, parameters.services, parameters.repetitions, parameters.duration) == ([100, 500], [5, 10], 1, 7)


@pytest.mark.parametrize("given", [{"topologies": ["mesh"]}, {"topologies": ["sa", "sidecar"]}, {"rates": [0]},
                                   {"mix": "none"}, {"repetitions": 0}])
def test_refused_parameters(given):
    with pytest.raises(matrix.ParameterError):
        matrix.resolve("quick", **given)


def test_cells_keep_repetitions_outermost_and_the_baseline_beside_its_case():
    cells = matrix.resolve("quick", repetitions=2).cells()
    assert [c.repetition for c in cells] == [1] * 20 + [2] * 20
    assert [c.topology for c in cells[:5]] == ["central-entity", "dynamic-router-3", "dynamic-router-6", "sidecar", "baseline"]
    assert {(c.rate, c.services) for c in cells[:5]} == {(100, 5)}
    assert cells[0].key == "central-entity_r100_n5_rep1"
    assert len({c.key for c in cells}) == len(cells)


def test_users_keep_each_under_its_rate():
    parameters = matrix.resolve("quick", user_rate=10)
    assert [parameters.users(rate) for rate in (1, 100, 500, 1000, 1001)] == [1, 10, 50, 100, 101]


def test_resuming_reports_parameters_that_differ():
    stored = matrix.resolve("quick")
    assert matrix.conflicts(stored, topologies=["ce", "dr3", "dr6", "sa", "baseline"], duration=None) == []
    assert matrix.conflicts(stored, profile="paper", duration=60) == ["--profile paper (the run has quick)", "--duration 60 (the run has 20)"]
    assert matrix.Parameters.from_json(stored.to_json()) == stored
