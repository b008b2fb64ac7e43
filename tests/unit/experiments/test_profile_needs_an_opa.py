"""`experiments profile` profiles a cell's OPAs: the baseline has none, so it is refused before
anything is deployed, with the topologies that have one."""

from experiments import __main__ as cli
from experiments.run import profile


def test_profiling_the_baseline_is_refused_before_deploying_denied(tmp_path, monkeypatch, capsys):
    deployed = []
    monkeypatch.setattr(profile, "run", lambda *args, **kwargs: deployed.append(args) or 0)
    assert cli.main(["profile", "--topology", "baseline", "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith("error: the baseline has no OPA to profile; name an enforcing topology (central-entity")
    assert deployed == []


def test_profiling_an_enforcing_topology_starts_allowed(tmp_path, monkeypatch):
    deployed = []
    monkeypatch.setattr(profile, "run", lambda topology, *args, **kwargs: deployed.append(topology) or 0)
    assert cli.main(["profile", "--topology", "ce", "--out", str(tmp_path)]) == 0
    assert deployed == ["central-entity"]
