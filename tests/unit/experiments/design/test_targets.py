"""Where an experiment's cells deploy (experiments/design/targets.py, over the runtime's Target:
tests/unit/runtime/test_runtime_targets.py), with kubectl, kubernetes.apply.apply, the port-forward and the entry
standing in: which target the command line makes and when it asks the cluster, the record a
cell's entry must pass, what the runner records and the reports say of a target. Nothing here
starts a process; the real cluster's run is tests/k8s/test_experiments_target_k8s.py."""

import io
import os
import json
import sys

import pytest

from complyroute.client import Answer
from complyroute.runtime.kubernetes import apply, render
from complyroute.runtime.kubernetes.target import KubernetesTarget
from complyroute.runtime.local.target import LocalTarget
from complyroute.runtime.target import TargetBusy, TargetError
from experiments import __main__ as cli
from experiments.design import targets
from experiments.design.matrix import Cell, resolve
from experiments.run import loader, runner
from tests.unit.runtime.kubectl_stand_in import CONTEXT, Kubectl


@pytest.fixture
def kubectl(monkeypatch):
    fake = Kubectl()
    monkeypatch.setattr(apply, "kubectl_output", fake)
    return fake


def passed_through(services: int) -> Answer:
    return Answer(200, {"path": [{"instance": f"svc-{n:02d}", "region": "EU", "node": "node-1"} for n in range(1, services + 1)]}, "")


@pytest.fixture
def cluster_side(monkeypatch, kubectl, tmp_path):
    """apply.apply and the port-forward standing in, the chain probe passing; the namespaces applied."""
    applied = []

    def fake_apply(topology, folder, rule_set, timeout, image, one_node, out):
        applied.append(render.namespace_of(topology))
        kubectl.namespaces.add(render.namespace_of(topology))

    monkeypatch.setattr(apply, "apply", fake_apply)
    monkeypatch.setattr(KubernetesTarget, "port_forward", lambda self, service, log: "http://127.0.0.1:40123/process")
    monkeypatch.setattr(targets, "send", lambda url, labels, body, **kwargs: passed_through(5))
    return applied


# ---- which target, and the record its cells' entry must pass ------------------------------------------

def test_local_is_made_as_asked_and_takes_no_k8s_option_denied():
    assert isinstance(targets.make("local"), LocalTarget)
    with pytest.raises(TargetError, match="--one-node and --entry-url apply to --target k8s only"):
        targets.make("local", one_node=True, entry_url="http://10.0.0.5:30080")


def test_k8s_asks_its_context_once_made_denied(monkeypatch):
    monkeypatch.setattr(apply, "kubectl_output", Kubectl(answering=False))
    with pytest.raises(TargetError, match="does not answer"):
        targets.make("k8s", one_node=True)


def test_k8s_made_allowed(kubectl):
    target = targets.make("k8s", one_node=True)
    assert isinstance(target, KubernetesTarget) and target.described["context"] == CONTEXT


def test_the_chain_probe_passes_a_record_through_every_service_allowed_and_denied(monkeypatch):
    sent = []
    monkeypatch.setattr(targets, "send", lambda url, labels, body, **kwargs: sent.append((url, labels)) or passed_through(5))
    assert targets.chain_probe(5)("http://127.0.0.1:40123/process") is None
    assert sent == [("http://127.0.0.1:40123/process", targets.ALLOWED_LABELS)]
    assert targets.chain_probe(6)("http://127.0.0.1:40123/process").startswith("200 delivered: svc-01")  # one short: not passed
    monkeypatch.setattr(targets, "send", lambda url, labels, body, **kwargs: Answer(502, {"code": "NEXT_HOP_FAILED", "message": "refused"}, ""))
    assert targets.chain_probe(5)("http://127.0.0.1:40123/process") == "502 NEXT_HOP_FAILED: refused"


def test_what_a_k8s_target_cannot_measure(kubectl):
    unmeasured = targets.unmeasured(targets.make("k8s", one_node=True))
    assert any("CPU time and memory" in line for line in unmeasured) and any("port-forward" in line for line in unmeasured)
    unmeasured = targets.unmeasured(targets.make("k8s", one_node=True, entry_url="http://10.0.0.5:30080"))
    assert any("CPU time and memory" in line for line in unmeasured) and not any("port-forward" in line for line in unmeasured)
    assert targets.unmeasured(targets.make("local")) == []


# ---- what the runner records -------------------------------------------------------------------------

@pytest.fixture(autouse=True)
def described(monkeypatch):
    monkeypatch.setattr(runner.metadata, "describe", lambda: {
        "taken_at": "2026-11-26T07:00:00+0000", "git": {"commit": None, "branch": None}, "versions": {},
        "machine": {"load_average_at_start": [0.1, 0.1, 0.1]}})


def test_the_runs_metadata_names_its_target_and_what_it_did_not_measure(tmp_path, kubectl):
    run = runner.Runner(tmp_path / "run", resolve("quick"), out=io.StringIO(), target=targets.make("k8s", one_node=True))
    run.raw.mkdir(parents=True)
    run.start_session()
    meta = json.loads((run.run_dir / "metadata.json").read_text())
    assert meta["target"]["target"] == "k8s" and meta["target"]["context"] == CONTEXT and meta["target"]["nodes"] == ["complyroute-node"]
    assert meta["sessions"][-1]["target"] == meta["target"]
    assert any("CPU" in line for line in meta["unmeasured"])
    text = targets.where_text(meta["target"])
    assert text.startswith("Target: **k8s**: kubectl context `local`, API server https://10.250.250.2:36443, nodes complyroute-node")
    assert "rendered for one node" in text
    assert targets.unmeasured_text(meta["unmeasured"]).startswith("Not measured on this target: the deployment's CPU time")


def test_a_run_recorded_before_targets_reads_as_local():
    assert targets.where_text(None).startswith("Target: **local**")
    assert targets.unmeasured_text(None) is None and targets.unmeasured_text([]) is None


def test_a_k8s_session_takes_no_bench_and_says_why(tmp_path, kubectl, monkeypatch):
    monkeypatch.setitem(sys.modules, "experiments.run.bench", None)  # a bench that ran would fail on importing it
    run = runner.Runner(tmp_path / "run", resolve("quick"), out=io.StringIO(), target=targets.make("k8s", one_node=True))
    run.raw.mkdir(parents=True)
    run.start_session()
    run.measure_bench()
    bench = json.loads((run.run_dir / "metadata.json").read_text())["sessions"][-1]["bench"]
    assert bench == {"skipped": "target k8s: the bench measures processes of this machine, and the cells' parts do not run as such"}


def test_a_k8s_cells_cpu_csv_leaves_the_deployments_columns_empty(tmp_path):
    sampler = loader.CpuSampler(tmp_path / "cpu.csv", locust_pid=os.getpid(), parts=None)
    sampler.sample()
    sampler.close()
    header, row = (tmp_path / "cpu.csv").read_text().splitlines()
    values = dict(zip(header.split(","), row.split(",")))
    assert values["machine_busy_s"] and values["locust_s"]
    assert all(values[f"{kind}_s"] == "" for kind in ("deployment", *loader.CpuSampler.KINDS))


def test_a_k8s_cell_is_deployed_reached_and_checked_allowed(tmp_path, cluster_side, monkeypatch):
    monkeypatch.setattr(loader, "send", lambda *args, **kwargs: passed_through(5))
    run = runner.Runner(tmp_path / "run", resolve("quick"), out=io.StringIO(), target=targets.make("k8s", one_node=True))
    state = run.deploy(Cell("sidecar", "envoy-opa", 100, 5, 1), io.StringIO())
    assert cluster_side == ["complyroute-sidecar"]
    assert state["entry_url"] == "http://127.0.0.1:40123/process" and state["path_wait_seconds"] >= 0 and state["parts"] == 7


def test_a_k8s_cell_fails_when_its_check_record_does_not_pass(tmp_path, cluster_side, monkeypatch):
    monkeypatch.setattr(loader, "send", lambda *args, **kwargs: Answer(503, {"code": "DECISION_UNAVAILABLE"}, ""))
    run = runner.Runner(tmp_path / "run", resolve("quick"), out=io.StringIO(), target=targets.make("k8s", one_node=True))
    with pytest.raises(loader.CellFailed, match="did not go through the 5 services"):
        run.deploy(Cell("sidecar", "envoy-opa", 100, 5, 1), io.StringIO())


def test_a_k8s_cell_whose_namespace_is_taken_stops_the_run_denied(tmp_path, cluster_side, kubectl):
    kubectl.namespaces.add("complyroute-sidecar")
    run = runner.Runner(tmp_path / "run", resolve("quick"), out=io.StringIO(), target=targets.make("k8s", one_node=True))
    with pytest.raises(TargetBusy, match="namespace complyroute-sidecar already exists"):
        run.deploy(Cell("sidecar", "envoy-opa", 100, 5, 1), io.StringIO())
    assert cluster_side == []


# ---- the command line ------------------------------------------------------------------------------------

def test_run_with_k8s_and_no_cluster_answering_exits_2_before_any_cell_denied(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(apply, "kubectl_output", Kubectl(answering=False))
    assert cli.main(["--results", str(tmp_path), "run", "--profile", "quick", "--target", "k8s", "--one-node"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --target k8s: the current kubectl context (local") and err.count("\n") == 1
    assert list(tmp_path.iterdir()) == []  # no run folder was made


def test_capacity_with_k8s_and_no_cluster_answering_exits_2_denied(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(apply, "kubectl_output", Kubectl(answering=False))
    assert cli.main(["--results", str(tmp_path), "capacity", "--target", "k8s", "--one-node"]) == 2
    assert "does not answer" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_resuming_a_run_on_another_target_is_refused_denied(tmp_path, monkeypatch, capsys, kubectl):
    started = []
    monkeypatch.setattr(cli, "Runner", lambda run_dir, parameters, target: started.append(target) or type("R", (), {"run": lambda self: 0})())
    run_dir = tmp_path / "local-run"
    run_dir.mkdir()
    (run_dir / "metadata.json").write_text(json.dumps({"parameters": resolve("quick").to_json(), "target": {"target": "local"}}))
    assert cli.main(["--results", str(tmp_path), "run", "--run-id", "local-run", "--target", "k8s", "--one-node"]) == 2
    assert "--target k8s (the run has local)" in capsys.readouterr().err
    assert cli.main(["--results", str(tmp_path), "run", "--run-id", "local-run"]) == 0
    assert [t.name for t in started] == ["local"]


def test_soak_on_k8s_is_refused_with_what_it_cannot_do_denied(tmp_path, capsys):
    assert cli.main(["--results", str(tmp_path), "soak", "--target", "k8s", "--quick"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: soak --target k8s is not supported: its faults are signals to this machine's processes by pid")
    assert err.count("\n") == 1 and list(tmp_path.iterdir()) == []
