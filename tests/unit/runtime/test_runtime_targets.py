"""The runtime's targets (complyroute/runtime/target.py, targets.py, local/target.py,
kubernetes/target.py), with kubectl, apply.apply, the port-forward and the local deployment
standing in: which target a name and options make and what is refused, what a k8s target asks
of its context, how it deploys, reaches and removes a topology, and which verb each target
hands to which code. Nothing here starts a process; the real cluster's run is tests/k8s/."""

import io

import pytest

from complyroute.policy import policyfiles
from complyroute.policy.ruleset import RuleSet
from complyroute.runtime import targets
from complyroute.runtime.kubernetes import apply, render
from complyroute.runtime.kubernetes import target as kubernetes_target
from complyroute.runtime.kubernetes.nodes import NODE_LABEL
from complyroute.runtime.kubernetes.target import KubernetesTarget
from complyroute.runtime.local import deployment, reload
from complyroute.runtime.local import target as local_target
from complyroute.runtime.local.target import LocalTarget
from complyroute.runtime.target import DeployFailed, TargetBusy, TargetError, Unsupported
from complyroute.topology import manifest
from complyroute.topology.plan import place
from tests.unit.runtime.kubectl_stand_in import CONTEXT, SERVER, Kubectl, node


@pytest.fixture
def kubectl(monkeypatch):
    fake = Kubectl()
    monkeypatch.setattr(apply, "kubectl_output", fake)
    return fake


SHIPPED = RuleSet.of("policies")
CLASSIFICATION = RuleSet.of("classification")


@pytest.fixture
def cluster_side(monkeypatch, kubectl, tmp_path):
    """apply.apply, the namespace's deletion and the port-forward standing in; what each was asked."""
    asked = {"apply": [], "kubectl": [], "forward": []}

    def fake_apply(topology, folder, rule_set, timeout, image, one_node, out):
        asked["apply"].append({"topology": topology.name, "folder": folder, "one_node": one_node, "image": image, "timeout": timeout,
                               "rule_set": rule_set})
        kubectl.namespaces.add(render.namespace_of(topology))
        print("$ kubectl apply ...", file=out)
        return 0

    def delete(*args, check=True, env=None, out=None):
        asked["kubectl"].append(args)
        kubectl.namespaces.discard(args[2])
        return None

    def port_forward(self, service, log):
        asked["forward"].append((self.namespace, service))
        return "http://127.0.0.1:40123/process"

    monkeypatch.setattr(apply, "apply", fake_apply)
    monkeypatch.setattr(apply, "kubectl", delete)
    monkeypatch.setattr(KubernetesTarget, "port_forward", port_forward)
    return asked


def passes(entry_url):
    return None


# ---- which target, and what is refused ---------------------------------------------------------------

def test_each_name_makes_its_target_allowed():
    assert isinstance(targets.make("local"), LocalTarget) and targets.DEFAULT == "local"
    assert isinstance(targets.make("k8s"), KubernetesTarget)  # asks nothing of the context yet


def test_an_unknown_target_is_refused_denied():
    with pytest.raises(TargetError, match="--target 'cloud': use local .* or k8s"):
        targets.make("cloud")


def test_local_takes_no_k8s_option_denied():
    assert targets.make("local", restart=False).restart is False
    with pytest.raises(TargetError, match="--one-node applies to --target k8s only: a local deployment runs every part on this machine"):
        targets.make("local", one_node=True)
    with pytest.raises(TargetError, match="--one-node and --entry-url apply to --target k8s only"):
        targets.make("local", one_node=True, entry_url="http://10.0.0.5:30080")
    with pytest.raises(TargetError, match="--image applies to --target k8s only"):
        targets.make("local", image="complyroute/service:1")


def test_k8s_takes_no_local_option_denied():
    assert targets.make("k8s", ready_timeout="60s").ready_timeout == "60s"
    with pytest.raises(TargetError, match="--no-restart applies to --target local only: on Kubernetes the kubelet restarts containers"):
        targets.make("k8s", restart=False)
    with pytest.raises(TargetError, match="--timeout applies to --target local only: a reload on Kubernetes .* does not wait"):
        targets.make("k8s", reload_timeout=5.0)


# ---- what a k8s target asks of its context ----------------------------------------------------------

def test_k8s_names_its_context_server_and_nodes_allowed(kubectl):
    target = targets.make("k8s", one_node=True)
    assert target.describe() == {"target": "k8s", "context": CONTEXT, "server": SERVER, "nodes": ["complyroute-node"],
                                 "deploys_to": ["complyroute-node"], "one_node": True,
                                 "entry": "kubectl port-forward to the entry's Service", "image": render.SERVICE_IMAGE}
    assert not target.runs_here
    asked = len(kubectl.calls)
    target.describe()
    assert len(kubectl.calls) == asked  # asked once


def test_k8s_without_a_context_is_refused_denied(monkeypatch):
    monkeypatch.setattr(apply, "kubectl_output", Kubectl(context=""))
    with pytest.raises(TargetError, match="kubectl has no current context"):
        targets.make("k8s").describe()


def test_k8s_whose_cluster_does_not_answer_is_refused_denied(monkeypatch):
    monkeypatch.setattr(apply, "kubectl_output", Kubectl(answering=False))
    with pytest.raises(TargetError, match=f"context \\({CONTEXT}, server {SERVER}\\) does not answer: .*refused"):
        targets.make("k8s", one_node=True).describe()


def test_k8s_without_kubectl_is_refused_denied(monkeypatch):
    def missing(*args, **kwargs):
        raise FileNotFoundError(2, "No such file or directory", "kubectl")

    monkeypatch.setattr(apply, "kubectl_output", missing)
    with pytest.raises(TargetError, match="needs kubectl on PATH"):
        targets.make("k8s").describe()
    with pytest.raises(TargetError, match="needs kubectl on PATH"):  # a verb too: one line, not a traceback
        targets.make("k8s").status(None, io.StringIO())


def test_another_missing_file_is_not_taken_for_kubectl_denied(monkeypatch):
    def missing(*args, **kwargs):
        raise FileNotFoundError(2, "No such file or directory", "/tmp/nowhere/kubeconfig")

    monkeypatch.setattr(apply, "kubectl_output", missing)
    with pytest.raises(FileNotFoundError):
        targets.make("k8s").describe()


def test_one_node_needs_a_node_labelled_for_every_role_denied(monkeypatch):
    monkeypatch.setattr(apply, "kubectl_output", Kubectl(nodes=[node("worker-1")]))
    with pytest.raises(TargetError, match="--one-node: no node of context local is labelled complyroute.io/role=all"):
        targets.make("k8s", one_node=True).describe()


def test_several_nodes_need_the_placement_labels_denied_and_allowed(monkeypatch):
    monkeypatch.setattr(apply, "kubectl_output", Kubectl(nodes=[node("worker-1")]))
    with pytest.raises(TargetError, match="no node of context local is labelled complyroute.io/node=<node>.*--one-node"):
        targets.make("k8s").describe()
    labelled = [node("worker-1", **{NODE_LABEL: "gateway"}), node("worker-2", **{NODE_LABEL: "node-1"})]
    monkeypatch.setattr(apply, "kubectl_output", Kubectl(nodes=labelled))
    assert targets.make("k8s").describe()["deploys_to"] == ["worker-1", "worker-2"]


@pytest.mark.parametrize("url, expected", [("http://10.0.0.5:30080", "http://10.0.0.5:30080/process"),
                                           ("https://entry.example:443/process", "https://entry.example:443/process")])
def test_an_entry_url_is_where_records_go_allowed(kubectl, url, expected):
    target = targets.make("k8s", one_node=True, entry_url=url)
    assert target.entry_url == expected
    assert target.describe()["entry"] == f"{expected} (--entry-url)"


@pytest.mark.parametrize("url", ["10.0.0.5:30080", "ftp://10.0.0.5", "http://10.0.0.5:30080/other", "http:///process"])
def test_a_malformed_entry_url_is_refused_denied(url):
    with pytest.raises(TargetError, match="--entry-url"):
        targets.make("k8s", one_node=True, entry_url=url)


# ---- deploy, reach and undeploy on k8s ----------------------------------------------------------------

def test_k8s_applies_forwards_and_deletes_its_namespace_allowed(cluster_side, kubectl):
    target = targets.make("k8s", one_node=True)
    topology = manifest.load("sidecar", services="5")
    log = io.StringIO()
    state = target.deploy(topology, SHIPPED, log)
    assert cluster_side["apply"] == [{"topology": "sidecar", "folder": kubernetes_target.workdir() / "sidecar-5", "one_node": True,
                                      "image": render.SERVICE_IMAGE, "timeout": kubernetes_target.READY_TIMEOUT, "rule_set": SHIPPED}]
    assert (state["parts"], state["nodes"], state["namespace"]) == (7, ["complyroute-node"], "complyroute-sidecar")
    assert state["cpu_parts"] is None and state["memory_mib"] == {"total": None}  # pods: not sampled here
    assert cluster_side["forward"] == []  # deploying reaches nothing: the command line's deploy leaves it at that
    reached = target.reach(topology, passes, log)
    assert cluster_side["forward"] == [("complyroute-sidecar", apply.entry_service(
        place(topology, render.KubernetesNetwork("complyroute-sidecar"))))]
    assert reached["entry_url"] == "http://127.0.0.1:40123/process" and reached["path_wait_seconds"] >= 0
    assert target.port_forwarded
    target.undeploy(log)
    assert cluster_side["kubectl"] == [("delete", "namespace", "complyroute-sidecar", "--ignore-not-found", "--wait=true",
                                        f"--timeout={kubernetes_target.DELETE_TIMEOUT}")]
    assert "complyroute-sidecar" not in kubectl.namespaces
    target.undeploy(log)  # nothing deployed: nothing deleted
    assert len(cluster_side["kubectl"]) == 1


def test_k8s_deploys_the_rule_set_given_allowed(cluster_side):
    targets.make("k8s", image="registry.example/service:2").deploy(manifest.load("sidecar", services="5"), CLASSIFICATION,
                                                                     io.StringIO())
    given = cluster_side["apply"][0]["rule_set"]
    assert given.chosen == "classification" and given.folder == policyfiles.rule_set("classification")  # assembled with the platform's parts
    assert cluster_side["apply"][0]["image"] == "registry.example/service:2"


def test_k8s_reach_waits_until_a_record_passes_its_chain_allowed(cluster_side, monkeypatch):
    answers = ["502 NEXT_HOP_FAILED: connect ECONNREFUSED 10.96.93.138:22001", "503 HOP_UNAVAILABLE", None]
    sent = []
    monkeypatch.setattr(kubernetes_target.time, "sleep", lambda s: None)
    target, topology, log = targets.make("k8s", one_node=True), manifest.load("sidecar", services="5"), io.StringIO()
    target.deploy(topology, SHIPPED, log)
    target.reach(topology, lambda url: sent.append(url) or answers[len(sent) - 1], log)
    assert sent == ["http://127.0.0.1:40123/process"] * 3
    assert "path: a record passed the 5 services after" in log.getvalue()


def test_k8s_reach_whose_chain_never_passes_is_left_to_the_caller_denied(cluster_side, monkeypatch):
    monkeypatch.setattr(kubernetes_target, "PATH_READY_WAIT_S", 0)
    target, topology, log = targets.make("k8s", one_node=True), manifest.load("sidecar", services="5"), io.StringIO()
    target.deploy(topology, SHIPPED, log)
    assert target.reach(topology, lambda url: "502 NEXT_HOP_FAILED: refused", log)["entry_url"]
    assert "path: no record passed after" in log.getvalue() and "502 NEXT_HOP_FAILED: refused" in log.getvalue()


def test_k8s_with_an_entry_url_is_not_forwarded_allowed(cluster_side):
    target, topology = targets.make("k8s", one_node=True, entry_url="http://10.0.0.5:30080"), manifest.load("baseline", services="5")
    target.deploy(topology, SHIPPED, io.StringIO())
    assert target.reach(topology, passes, io.StringIO())["entry_url"] == "http://10.0.0.5:30080/process"
    assert cluster_side["forward"] == [] and not target.port_forwarded


def test_a_namespace_already_there_is_busy_denied_and_another_is_free_allowed(cluster_side, kubectl):
    kubectl.namespaces.add("complyroute-sidecar")
    target = targets.make("k8s", one_node=True)
    with pytest.raises(TargetBusy, match="namespace complyroute-sidecar already exists in context local"):
        target.check_free(manifest.load("sidecar", services="5"))
    target.check_free(manifest.load("baseline", services="5"))


def test_a_failed_apply_fails_the_deploy_and_leaves_the_namespace_to_undeploy_denied(cluster_side, monkeypatch):
    def failing(topology, folder, rule_set, timeout, image, one_node, out):
        raise RuntimeError("kubectl -n complyroute-sidecar wait ... failed with exit code 1")

    monkeypatch.setattr(apply, "apply", failing)
    target = targets.make("k8s", one_node=True)
    with pytest.raises(DeployFailed, match="applying sidecar to namespace complyroute-sidecar failed: kubectl .* wait"):
        target.deploy(manifest.load("sidecar", services="5"), SHIPPED, io.StringIO())
    target.undeploy(io.StringIO())  # what an experiment does with a failed cell: the half-applied namespace goes
    assert cluster_side["kubectl"][0][:3] == ("delete", "namespace", "complyroute-sidecar")


# ---- the command line's verbs, as each target hands them on ---------------------------------------------

def test_k8s_verbs_go_to_apply_allowed(monkeypatch):
    asked = []
    monkeypatch.setattr(apply, "status", lambda topology, out: asked.append(("status", topology and topology.name)) or 0)
    monkeypatch.setattr(apply, "deployed_rule_set", lambda topology: asked.append(("recorded", topology.name)) or "classification")
    monkeypatch.setattr(apply, "reload_policy", lambda topology, rule_set, out: asked.append(("reload", topology.name, rule_set.chosen)) or {})
    monkeypatch.setattr(apply, "delete", lambda out: asked.append(("delete",)) or 0)
    target = targets.make("k8s")
    assert target.status(None) == 0 and target.status(manifest.load("sidecar")) == 0
    assert target.deployed_rule_set(manifest.load("sidecar")) == "classification"
    target.reload_policy(manifest.load("sidecar"), SHIPPED)
    target.reload_policy(manifest.load("sidecar"), CLASSIFICATION)
    assert target.undeploy_all() == 0
    assert asked == [("status", None), ("status", "sidecar"), ("recorded", "sidecar"), ("reload", "sidecar", "policies"),
                     ("reload", "sidecar", "classification"), ("delete",)]


def test_k8s_reload_needs_the_topology_denied():
    with pytest.raises(TargetError, match="reload-policy --target k8s needs --topology"):
        targets.make("k8s").reload_policy(None, SHIPPED)
    with pytest.raises(TargetError, match="reload-policy --target k8s needs --topology"):
        targets.make("k8s").deployed_rule_set(None)


def test_k8s_keeps_no_evidence_here_denied():
    with pytest.raises(Unsupported, match="^audit --target k8s is not supported: .* stay in its pods"):
        targets.make("k8s").run_folders("audit")


def test_local_verbs_go_to_the_deployment_allowed(monkeypatch):
    asked = []
    monkeypatch.setattr(deployment, "deploy", lambda topology, rule_set, out, restart: asked.append(("deploy", rule_set.chosen, restart)) or {
        "run_dir": "runs/x", "entry_url": "http://127.0.0.1:8080/process", "parts": [{"pid": 1, "kind": "envoy"}], "engine": "envoy-opa",
        "bring_up_seconds": 1.0, "memory_mib": {"total": 1.0}})
    monkeypatch.setattr(deployment, "status", lambda out: asked.append(("status",)) or 0)
    monkeypatch.setattr(deployment, "stop", lambda out: asked.append(("stop",)) or 3)
    monkeypatch.setattr(reload, "deployed_rule_set", lambda: asked.append(("recorded",)) or "classification")
    monkeypatch.setattr(reload, "reload_policy", lambda rule_set, out, timeout: asked.append(("reload", rule_set.chosen, timeout)) or {})
    target = targets.make("local", restart=False, reload_timeout=5.0)
    topology = manifest.load("sidecar")
    assert target.deploy(topology, CLASSIFICATION)["cpu_parts"] == [(1, "envoy")]
    assert target.reach(topology, passes) == {"entry_url": "http://127.0.0.1:8080/process"}
    assert target.status(None) == 0
    assert target.deployed_rule_set(None) == "classification"
    target.reload_policy(None, SHIPPED)
    assert target.undeploy_all() == 0
    assert target.run_folders("audit") == deployment.runs_root()
    assert asked == [("deploy", "classification", False), ("status",), ("recorded",), ("reload", "policies", 5.0), ("stop",)]
    assert targets.make("local").reload_timeout == local_target.RELOAD_TIMEOUT_S


def test_local_takes_no_topology_to_show_or_reload_denied():
    with pytest.raises(TargetError, match="--topology applies to --target k8s only"):
        targets.make("local").status(manifest.load("sidecar"))
    with pytest.raises(TargetError, match="--topology applies to --target k8s only"):
        targets.make("local").reload_policy(manifest.load("sidecar"), SHIPPED)
    with pytest.raises(TargetError, match="--topology applies to --target k8s only"):
        targets.make("local").deployed_rule_set(manifest.load("sidecar"))
