"""A new experiments run names its profile: a bare `experiments run` no longer starts the
paper's matrix (about 12 hours here). `--dry-run` says what a run would do, how long it would take
and the disk it would need, and starts nothing."""

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


def test_a_dry_run_prints_the_matrix_its_time_and_disk_and_starts_nothing_allowed(tmp_path, monkeypatch, capsys):
    started = []
    monkeypatch.setattr(cli, "Runner", lambda *args, **kwargs: started.append(args))
    assert cli.main(["--results", str(tmp_path), "run", "--profile", "quick", "--topologies", "ce", "baseline", "--rates", "100",
                     "--services", "5", "10", "--dry-run"]) == 0
    printed = capsys.readouterr().out
    assert started == [] and not any(tmp_path.iterdir())
    # CE under both engines and the baseline, at one rate and two chain lengths: 6 cells.
    assert "cases (3): CE (envoy-opa), CE (compiled), baseline" in printed and "6 cells, about" in printed
    assert "rates 100 req/s; chain lengths 5 10 services; 1 repetition(s)" in printed
    assert "disk: at most about" in printed


def test_the_disk_a_cell_needs_grows_with_its_records_and_services_allowed():
    from experiments.design import matrix
    from experiments.run import runner
    parameters = matrix.resolve("quick")
    small, large = (matrix.Cell("sidecar", "envoy-opa", rate, services, 1) for rate, services in ((100, 5), (500, 10)))
    assert runner.cell_disk_estimate(large, parameters) > 5 * runner.cell_disk_estimate(small, parameters)


def test_a_dry_run_without_a_profile_is_refused_as_a_run_is_denied(tmp_path, capsys):
    assert cli.main(["--results", str(tmp_path), "run", "--dry-run"]) == 2
    assert capsys.readouterr().err.startswith("error: a new run needs --profile")
