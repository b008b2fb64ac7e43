"""The guard that keeps a unit or integration test off the checkout's runs/ and the shell's loopback network (tests/conftest.py)."""

from pathlib import Path

from complyroute.runtime.local import deployment
from complyroute.runtime.target import runs_root
from complyroute.topology.manifest import REPO
from complyroute.topology.plan import LOOPBACK_VARIABLE, LocalNetwork


def test_a_test_reads_runs_of_its_own_allowed(tmp_path):
    assert runs_root() == tmp_path / "runs"
    (tmp_path / "runs" / "sidecar-5").mkdir(parents=True)
    (tmp_path / "runs" / "sidecar-5" / "state.json").write_text('{"topology": "sidecar"}')
    deployment.current_link().symlink_to("sidecar-5")
    assert deployment.read_state() == {"topology": "sidecar"}  # what the deployment's commands read is the test's


def test_without_the_guard_the_checkouts_runs_are_read_denied(monkeypatch):
    monkeypatch.delenv("COMPLYROUTE_RUNS")
    assert runs_root() == REPO / "runs"
    assert deployment.current_link() == Path(REPO, "runs", "current")


def test_a_test_plans_on_the_default_network_whatever_the_shell_exports_allowed():
    # The shell running this suite may export COMPLYROUTE_LOOPBACK (a deployment of its own beside
    # another); the guard unsets it for unit and integration tests.
    assert LocalNetwork().loopback is None


def test_without_the_guard_the_shells_network_is_taken_denied(monkeypatch):
    monkeypatch.setenv(LOOPBACK_VARIABLE, "127.0.9")
    assert LocalNetwork().loopback == "127.0.9"
