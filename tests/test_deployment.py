"""Unit tests of the local deployment's bookkeeping (no process is started)."""

import pytest

from complyroute import deployment


def test_new_run_dir_same_second_allowed(tmp_path, monkeypatch):
    monkeypatch.setattr(deployment, "RUNS", tmp_path / "runs")
    first = deployment.new_run_dir("central-entity-5-20261122-053000")
    second = deployment.new_run_dir("central-entity-5-20261122-053000")
    assert first.name == "central-entity-5-20261122-053000"
    assert second.name == "central-entity-5-20261122-053000-2"
    assert first.is_dir() and second.is_dir()


def test_new_run_dir_exhausted_denied(tmp_path, monkeypatch):
    monkeypatch.setattr(deployment, "RUNS", tmp_path)
    (tmp_path / "x").mkdir()
    for attempt in range(2, 1000):
        (tmp_path / f"x-{attempt}").mkdir()
    with pytest.raises(deployment.DeploymentError, match="no free run folder name"):
        deployment.new_run_dir("x")
