"""Where cells deploy (experiments/targets.py), with kubectl, kubernetes.apply.apply, the port-forward
and the local deployment standing in: which target the command line makes and what it refuses,
what a k8s target asks of its context and says about it, how it deploys, reaches and removes
a cell, and what the runner and the reports record of it. Nothing here starts a process; the
real cluster's run is tests/k8s/test_experiments_target_k8s.py."""

import io
import os
import json
import subprocess
import sys

import pytest

from complyroute.runtime.kubernetes import apply, render
from complyroute.runtime.kubernetes.nodes import NODE_LABEL, ONE_NODE_ROLE, ROLE_LABEL
from complyroute.topology import manifest
from experiments import __main__ as cli
from experiments import runner, targets
from experiments.matrix import Cell, resolve

CONTEXT = "local"
SERVER = "https://10.250.250.2:36443"


def node(name: str, **labels) -> dict:
    return {"metadata": {"name": name, "labels": labels}}


class Kubectl:
    """kubectl_output answered from memory: a context, its nodes, the namespaces that exist and
    the pods of each; every call recorded."""

    def __init__(self, nodes=None, context=CONTEXT, answering=True):
        self.context, self.answering = context, answering
        self.nodes = [node("complyroute-node", **{ROLE_LABEL: ONE_NODE_ROLE})] if nodes is None else nodes
        self.namespaces: set[str] = set()
        self.calls: list[tuple] = []

    def __call__(self, *args):
        self.calls.append(args)
        done = lambda out, code=0, err="": subprocess.CompletedProcess(args, code, out, err)
        if args[:2] == ("config", "current-context"):
            return done(self.context + "\n" if self.context else "", 0 if self.context else 1)
        if args[:2] == ("config", "view"):
            return done(SERVER if self.context else "")
        if args[:2] == ("get", "nodes"):
            if not self.answering:
                return done("", 1, "The connection to the server 10.250.250.2:36443 was refused - did you specify the right host or port?\n")
            return done(json.dumps({"items": self.nodes}))
        if args[:2] == ("get", "namespace"):
            return done("{}" if args[2] in self.namespaces else "", 0 if args[2] in self.namespaces else 1)
        if args[2:4] == ("get", "pods"):
            return done(json.dumps({"items": [{"spec": {"nodeName": "complyroute-node"}}] * 7}))
        raise AssertionError(f"unexpected kubectl {args}")


@pytest.fixture
def kubectl(monkeypatch):
    fake = Kubectl()
    monkeypatch.setattr(apply, "kubectl_output", fake)
    return fake


@pytest.fixture
def cluster_side(monkeypatch, kubectl, tmp_path):
    """apply.apply, the namespace's deletion and the port-forward standing in; what each was asked."""
    asked = {"apply": [], "kubectl": [], "forward": []}

    def fake_apply(topology, folder, timeout, image, one_node, out):
        asked["apply"].append({"topology": topology.name, "folder": folder, "one_node": one_node, "image": image})
        kubectl.namespaces.add(render.namespace_of(topology))
        print("$ kubectl apply ...", file=out)
        return 0

    def delete(*args, check=True, env=None, out=None):
        asked["kubectl"].append(args)
        kubectl.namespaces.discard(args[2])
        return subprocess.CompletedProcess(args, 0)

    def port_forward(self, service, log):
        asked["forward"].append((self.namespace, service))
        return "http://127.0.0.1:40123/process"

    monkeypatch.setattr(apply, "apply", fake_apply)
    monkeypatch.setattr(apply, "kubectl", delete)
    monkeypatch.setattr(apply, "DEPLOYED", tmp_path / "deployed")
    monkeypatch.setattr(targets.KubernetesTarget, "port_forward", port_forward)
    monkeypatch.setattr(targets, "send", lambda url, labels, body, **kwargs: passed_through(5))
    return asked


def passed_through(services: int):
    from complyroute.client import Answer

    return Answer(200, {"path": [{"instance": f"svc-{n:02d}"} for n in range(1, services + 1)]}, "")


# ---- which target, and what is refused ---------------------------------------------------------------

def test_local_is_the_default_and_takes_no_k8s_option_denied():
    assert isinstance(targets.make("local"), targets.LocalTarget)
    with pytest.raises(targets.TargetError, match="--one-node applies to --target k8s only"):
        targets.make("local", one_node=True)
    with pytest.raises(targets.TargetError, match="--one-node and --entry-url apply to --target k8s only"):
        targets.make("local", one_node=True, entry_url="http://10.0.0.5:30080")


def test_an_unknown_target_is_refused_denied():
    with pytest.raises(targets.TargetError, match="--target 'cloud': use local .* or k8s"):
        targets.make("cloud")


def test_k8s_names_its_context_server_and_nodes_allowed(kubectl):
    target = targets.make("k8s", one_node=True)
    described = target.describe()
    assert described == {"target": "k8s", "context": CONTEXT, "server": SERVER, "nodes": ["complyroute-node"],
                         "deploys_to": ["complyroute-node"], "one_node": True, "entry": "kubectl port-forward to the entry's Service",
                         "image": render.SERVICE_IMAGE}
    assert not target.runs_here
    assert any("CPU time and memory" in line for line in target.unmeasured())
    assert any("port-forward" in line for line in target.unmeasured())
    asked = len(kubectl.calls)
    target.describe()
    assert len(kubectl.calls) == asked  # asked once per run


def test_k8s_without_a_context_is_refused_denied(monkeypatch):
    monkeypatch.setattr(apply, "kubectl_output", Kubectl(context=""))
    with pytest.raises(targets.TargetError, match="kubectl has no current context"):
        targets.make("k8s")


def test_k8s_whose_cluster_does_not_answer_is_refused_denied(monkeypatch):
    monkeypatch.setattr(apply, "kubectl_output", Kubectl(answering=False))
    with pytest.raises(targets.TargetError, match=f"context \\({CONTEXT}, server {SERVER}\\) does not answer: .*refused"):
        targets.make("k8s", one_node=True)


def test_k8s_without_kubectl_is_refused_denied(monkeypatch):
    def missing(*args):
        raise FileNotFoundError("kubectl")

    monkeypatch.setattr(apply, "kubectl_output", missing)
    with pytest.raises(targets.TargetError, match="needs kubectl on PATH"):
        targets.make("k8s")


def test_one_node_needs_a_node_labelled_for_every_role_denied(monkeypatch):
    monkeypatch.setattr(apply, "kubectl_output", Kubectl(nodes=[node("worker-1")]))
    with pytest.raises(targets.TargetError, match="--one-node: no node of context local is labelled complyroute.io/role=all"):
        targets.make("k8s", one_node=True)


def test_several_nodes_need_the_placement_labels_denied_and_allowed(monkeypatch):
    monkeypatch.setattr(apply, "kubectl_output", Kubectl(nodes=[node("worker-1")]))
    with pytest.raises(targets.TargetError, match="no node of context local is labelled complyroute.io/node=<node>.*--one-node"):
        targets.make("k8s")
    labelled = [node("worker-1", **{NODE_LABEL: "gateway"}), node("worker-2", **{NODE_LABEL: "node-1"})]
    monkeypatch.setattr(apply, "kubectl_output", Kubectl(nodes=labelled))
    assert targets.make("k8s").describe()["deploys_to"] == ["worker-1", "worker-2"]


@pytest.mark.parametrize("url, expected", [("http://10.0.0.5:30080", "http://10.0.0.5:30080/process"),
                                           ("https://entry.example:443/process", "https://entry.example:443/process")])
def test_an_entry_url_is_where_records_go_allowed(kubectl, url, expected):
    target = targets.make("k8s", one_node=True, entry_url=url)
    assert target.entry_url == expected
    assert target.describe()["entry"] == f"{expected} (--entry-url)"
    assert not any("port-forward" in line for line in target.unmeasured())


@pytest.mark.parametrize("url", ["10.0.0.5:30080", "ftp://10.0.0.5", "http://10.0.0.5:30080/other", "http:///process"])
def test_a_malformed_entry_url_is_refused_denied(kubectl, url):
    with pytest.raises(targets.TargetError, match="--entry-url"):
        targets.make("k8s", one_node=True, entry_url=url)


# ---- a cell on k8s -------------------------------------------------------------------------------------

def test_a_k8s_cell_is_applied_forwarded_and_its_namespace_deleted_allowed(cluster_side, kubectl):
    target = targets.make("k8s", one_node=True)
    topology = manifest.load("sidecar", services="5")
    log = io.StringIO()
    state = target.deploy(topology, log)
    assert cluster_side["apply"] == [{"topology": "sidecar", "folder": targets.K8S_WORKDIR / "sidecar-5", "one_node": True,
                                      "image": render.SERVICE_IMAGE}]
    assert cluster_side["forward"] == [("complyroute-sidecar", apply.entry_service(
        targets.place(topology, render.KubernetesNetwork("complyroute-sidecar"))))]
    assert state["entry_url"] == "http://127.0.0.1:40123/process"
    assert (state["parts"], state["nodes"], state["namespace"]) == (7, ["complyroute-node"], "complyroute-sidecar")
    assert state["cpu_parts"] is None and state["memory_mib"] == {"total": None}  # pods: not sampled here
    target.undeploy(log)
    assert cluster_side["kubectl"] == [("delete", "namespace", "complyroute-sidecar", "--ignore-not-found", "--wait=true",
                                        f"--timeout={targets.K8S_DELETE_TIMEOUT}")]
    assert "complyroute-sidecar" not in kubectl.namespaces
    target.undeploy(log)  # nothing deployed: nothing deleted
    assert len(cluster_side["kubectl"]) == 1


def test_a_k8s_cell_waits_until_a_record_passes_its_chain_allowed(cluster_side, monkeypatch):
    from complyroute.client import Answer

    answers = [Answer(502, {"code": "NEXT_HOP_FAILED", "message": "connect ECONNREFUSED 10.96.93.138:22001"}, ""),
               Answer(503, {"code": "HOP_UNAVAILABLE"}, ""), passed_through(5)]
    sent = []
    monkeypatch.setattr(targets, "send", lambda url, labels, body, **kwargs: sent.append(url) or answers[len(sent) - 1])
    monkeypatch.setattr(targets.time, "sleep", lambda s: None)
    log = io.StringIO()
    state = targets.make("k8s", one_node=True).deploy(manifest.load("sidecar", services="5"), log)
    assert sent == ["http://127.0.0.1:40123/process"] * 3 and state["path_wait_seconds"] >= 0
    assert "path: a record passed the 5 services after" in log.getvalue()


def test_a_k8s_cell_whose_chain_never_passes_is_left_to_the_check_record_denied(cluster_side, monkeypatch):
    from complyroute.client import Answer

    monkeypatch.setattr(targets, "send", lambda url, labels, body, **kwargs: Answer(502, {"code": "NEXT_HOP_FAILED", "message": "refused"}, ""))
    monkeypatch.setattr(targets, "PATH_READY_WAIT_S", 0)
    log = io.StringIO()
    targets.make("k8s", one_node=True).deploy(manifest.load("sidecar", services="5"), log)
    assert "path: no record passed after" in log.getvalue() and "502 NEXT_HOP_FAILED: refused" in log.getvalue()


def test_a_k8s_cell_with_an_entry_url_is_not_forwarded_allowed(cluster_side):
    target = targets.make("k8s", one_node=True, entry_url="http://10.0.0.5:30080")
    assert target.deploy(manifest.load("baseline", services="5"), io.StringIO())["entry_url"] == "http://10.0.0.5:30080/process"
    assert cluster_side["forward"] == []


def test_a_namespace_already_there_stops_the_run_denied(cluster_side, kubectl):
    kubectl.namespaces.add("complyroute-sidecar")
    target = targets.make("k8s", one_node=True)
    with pytest.raises(targets.TargetBusy, match="namespace complyroute-sidecar already exists in context local"):
        target.deploy(manifest.load("sidecar", services="5"), io.StringIO())
    assert cluster_side["apply"] == []


def test_a_failed_apply_fails_the_cell_and_leaves_the_namespace_to_undeploy_denied(cluster_side, monkeypatch):
    def failing(topology, folder, timeout, image, one_node, out):
        raise RuntimeError("kubectl -n complyroute-sidecar wait ... failed with exit code 1")

    monkeypatch.setattr(apply, "apply", failing)
    target = targets.make("k8s", one_node=True)
    with pytest.raises(targets.DeployFailed, match="applying sidecar to namespace complyroute-sidecar failed: kubectl .* wait"):
        target.deploy(manifest.load("sidecar", services="5"), io.StringIO())
    target.undeploy(io.StringIO())  # what the runner does with a failed cell: the half-applied namespace goes
    assert cluster_side["kubectl"][0][:3] == ("delete", "namespace", "complyroute-sidecar")


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
    monkeypatch.setitem(sys.modules, "experiments.bench", None)  # a bench that ran would fail on importing it
    run = runner.Runner(tmp_path / "run", resolve("quick"), out=io.StringIO(), target=targets.make("k8s", one_node=True))
    run.raw.mkdir(parents=True)
    run.start_session()
    run.measure_bench()
    bench = json.loads((run.run_dir / "metadata.json").read_text())["sessions"][-1]["bench"]
    assert bench == {"skipped": "target k8s: the bench measures processes of this machine, and the cells' parts do not run as such"}


def test_a_k8s_cells_cpu_csv_leaves_the_deployments_columns_empty(tmp_path):
    sampler = runner.CpuSampler(tmp_path / "cpu.csv", locust_pid=os.getpid(), parts=None)
    sampler.sample()
    sampler.close()
    header, row = (tmp_path / "cpu.csv").read_text().splitlines()
    values = dict(zip(header.split(","), row.split(",")))
    assert values["machine_busy_s"] and values["locust_s"]
    assert all(values[f"{kind}_s"] == "" for kind in ("deployment", *runner.CpuSampler.KINDS))


def test_a_k8s_cell_fails_when_its_check_record_does_not_pass(tmp_path, cluster_side, monkeypatch):
    from complyroute.client import Answer

    monkeypatch.setattr(runner, "send", lambda *args, **kwargs: Answer(503, {"code": "DECISION_UNAVAILABLE"}, ""))
    run = runner.Runner(tmp_path / "run", resolve("quick"), out=io.StringIO(), target=targets.make("k8s", one_node=True))
    with pytest.raises(runner.CellFailed, match="did not go through the 5 services"):
        run.deploy(Cell("sidecar", "envoy-opa", 100, 5, 1), io.StringIO())


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
