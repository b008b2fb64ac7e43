"""A new experiments run names its profile: a bare `experiments run` no longer starts the
paper's matrix (about 12 hours here)."""

from experiments import __main__ as cli


def test_a_new_run_without_a_profile_is_refused_denied(tmp_path, monkeypatch, capsys):
    started = []
    monkeypatch.setattr(cli, "Runner", lambda *args, **kwargs: started.append(args))
    assert cli.main(["--results", str(tmp_path), "run"]) == 2
    assert capsys.readouterr().err.startswith("error: a new run needs --profile (paper, quick)")
    assert started == [] and not any(tmp_path.iterdir())


def test_a_new_run_with_a_profile_starts_allowed(tmp_path, monkeypatch):
    started = []
    monkeypatch.setattr(cli, "Runner", lambda run_dir, parameters, target: started.append(parameters.profile) or type("R", (), {"run": lambda self: 0})())
    assert cli.main(["--results", str(tmp_path), "run", "--profile", "quick"]) == 0
    assert started == ["quick"]
