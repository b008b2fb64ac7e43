"""Every topology, rendered for one node (render.Renderer(one_node=True)), running on the
local cluster's real node (realnode.py): real containerd, runc, CNI, kubelet, kube-proxy and
CoreDNS, the images `make images` built. Records go in through `kubectl port-forward` to the
entry's Service (the host sends to its loopback only) and travel pod to pod over the node's
bridge and Service addresses; the answers, and the audit lines every service wrote into its
emptyDir, show where each went. The same expectations as tests/e2e's for local processes.

Run by `make k8s-e2e` (it needs `make k8s-setup` and `make images`).
"""

import json
import socket
import subprocess
import time
from pathlib import Path

import pytest

from complyroute.client import send
from complyroute.evidence import audit
from complyroute.policy import bundles
from complyroute.runtime.kubernetes import render
from complyroute.runtime.kubernetes.images import IMAGES
from complyroute.topology import manifest
from tests.k8s.harness import realnode


MIXED_REGIONS = manifest.REPO / "topologies" / "examples" / "mixed-regions.yaml"
TOPOLOGIES = ["sidecar", "central-entity", "dynamic-router-3", "dynamic-router-6", "baseline"]
EU_PERSONAL = {"region": "EU", "category": "personal", "consent": "care,billing"}
RECORD = {"subject": "alice", "reading": 42}
LOCAL_PORT = 18080


def free(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) != 0


class Running:
    """One topology on the real node, its entry forwarded to 127.0.0.1:LOCAL_PORT."""

    def __init__(self, cluster, renderer: render.Renderer, forward: subprocess.Popen):
        self.cluster, self.renderer, self.forward = cluster, renderer, forward
        self.topology, self.namespace = renderer.topology, renderer.namespace
        self.entry = renderer.plan.entry.reach.split(".")[0]
        self.url = f"http://127.0.0.1:{LOCAL_PORT}/process"

    def post(self, labels, record=RECORD):
        answer = send(self.url, labels, record, request_id=f"k8s-{time.monotonic_ns()}", timeout=30)
        return answer.request_id, answer

    def wait_until_records_pass(self, timeout: float = 60) -> None:
        """Available pods are not yet a path: kube-proxy programs a Service's addresses some time
        after its endpoints are ready (seconds on a loaded machine), and until then a hop's connect
        times out (503 HOP_UNAVAILABLE). Wait, as a local deploy does before it returns, until one
        record passes the whole chain."""
        deadline = time.monotonic() + timeout
        while True:
            _, answer = self.post(EU_PERSONAL)
            if answer.status == 200 or time.monotonic() > deadline:
                assert answer.status == 200, f"no record passed {self.topology.name} within {timeout:.0f} s: {answer.text}"
                return
            time.sleep(1)

    def pods(self) -> list[dict]:
        return json.loads(self.cluster.kubectl("-n", self.namespace, "get", "pods", "-o", "json", quiet=True).stdout)["items"]

    def audit_files(self) -> list[Path]:
        """Each service's audit log, in its pod's emptyDir under the kubelet's root on this machine."""
        pods = realnode_root(self.cluster) / "kubelet" / "pods"
        uids = {p["metadata"]["uid"] for p in self.pods() if p["metadata"]["labels"]["component"] == "service"}
        return sorted(f for uid in uids for f in (pods / uid / "volumes" / "kubernetes.io~empty-dir" / "audit").glob("*.jsonl"))

    def audit_lines(self) -> list[dict]:
        return [json.loads(line) for f in self.audit_files() for line in f.read_text().splitlines() if line.strip()]

    def reached(self, request_id: str, count: int = 0, timeout: float = 5) -> set[str]:
        deadline = time.monotonic() + timeout
        while True:
            seen = {line["instance"] for line in self.audit_lines() if line["request_id"] == request_id}
            if len(seen) >= count or time.monotonic() > deadline:
                return seen
            time.sleep(0.1)

    def run_folder(self, folder: Path) -> Path:
        """A run folder as `make audit` reads one: the points as their pods run them, the bundles
        they decided with, the audit logs."""
        points = [{"name": p.name, "node": p.node, "senders": [d.sender for d in p.deciding], "destinations": sorted(p.destinations)}
                  for p in self.renderer.points]
        (folder / "audit").mkdir(parents=True)
        (folder / "state.json").write_text(json.dumps({"kind": self.topology.kind, "topology": self.topology.name,
                                                       "engine": self.topology.engine["kind"], "points": points}))
        for path in self.audit_files():
            (folder / "audit" / path.name).write_bytes(path.read_bytes())
        revisions = folder / bundles.REVISIONS / self.renderer.revision
        revisions.mkdir(parents=True)
        for packed in self.renderer.bundles:
            for name, content in packed.items():
                (revisions / name).write_bytes(content)
        return folder


def realnode_root(cluster) -> Path:
    return cluster.real_node.dir


@pytest.fixture(scope="module", params=TOPOLOGIES)
def running(cluster, request, tmp_path_factory):
    if cluster.real_node is None:
        pytest.skip("the cluster runs without a real node (COMPLYROUTE_REAL_NODE=0)")
    topology = manifest.load(request.param, services=str(MIXED_REGIONS))
    renderer = render.Renderer(topology, one_node=True)
    renderer.render()
    folder = tmp_path_factory.mktemp(request.param)
    rendered = folder / "rendered.yaml"
    rendered.write_text(render.build(renderer, folder / "kustomization"))
    namespace = renderer.namespace
    cluster.kubectl("apply", "--server-side", "-f", str(rendered), quiet=True)
    forward = None
    try:
        cluster.kubectl("-n", namespace, "wait", "--for=condition=Available", "deployment", "--all", "--timeout=300s", quiet=True)
        for daemonset in [o["metadata"]["name"] for o in renderer.objects if o["kind"] == "DaemonSet"]:
            cluster.kubectl("-n", namespace, "rollout", "status", f"daemonset/{daemonset}", "--timeout=300s", quiet=True)
        assert free(LOCAL_PORT), f"127.0.0.1:{LOCAL_PORT} is taken"
        entry = renderer.plan.entry.reach.split(".")[0]
        forward = subprocess.Popen([str(realnode.BIN / "kubectl"), f"--kubeconfig={cluster.kubeconfig}", "-n", namespace, "port-forward",
                                    "--address=127.0.0.1", f"service/{entry}", f"{LOCAL_PORT}:{render.KubernetesNetwork.ENTRY}"],
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + 30
        while free(LOCAL_PORT):
            assert forward.poll() is None and time.monotonic() < deadline, forward.stdout.read() if forward.poll() is not None else "no forward"
            time.sleep(0.2)
        running = Running(cluster, renderer, forward)
        running.wait_until_records_pass()
        yield running
    finally:
        if forward:
            forward.terminate()
            forward.wait()
        cluster.kubectl("delete", "namespace", namespace, "--wait=true", "--timeout=180s", quiet=True, check=False)


def test_every_pod_runs_on_the_real_node(running):
    pods = running.pods()
    assert pods and {p["spec"]["nodeName"] for p in pods} == {realnode.NAME}
    assert all(p["status"]["phase"] == "Running" for p in pods), [(p["metadata"]["name"], p["status"]["phase"]) for p in pods]
    images = {c["image"] for p in pods for c in p["spec"]["containers"] + p["spec"].get("initContainers", [])}
    assert images <= set(IMAGES.values())


def test_eu_personal_record_travels_only_through_eu_instances_allowed(running):
    request_id, answer = running.post(EU_PERSONAL)
    assert answer.status == 200, answer.text
    path = [hop["instance"] for hop in answer.body["path"]]
    if running.topology.kind == "baseline":  # no policy: any instance of each step
        assert len(path) == 3
        return
    assert path == ["ingest-eu", "analyse-eu", "store-eu"]
    assert all(hop["region"] == "EU" for hop in answer.body["path"])
    assert running.reached(request_id, 3) == {"ingest-eu", "analyse-eu", "store-eu"}


def test_record_without_consent_to_the_last_step_gets_451_with_the_rules_code_denied(running):
    if running.topology.kind == "baseline":
        pytest.skip("the baseline enforces nothing")
    request_id, answer = running.post({**EU_PERSONAL, "consent": "care"})
    assert answer.status == 451, answer.text
    assert answer.body["code"] == "PURPOSE_NOT_CONSENTED"
    assert [r["instance"] for r in answer.body["reasons"]] == ["store-eu"]
    assert running.reached(request_id, 2) == {"ingest-eu", "analyse-eu"}


def test_malformed_record_gets_400_and_reaches_no_instance_denied(running):
    if running.topology.kind == "baseline":
        pytest.skip("the baseline enforces nothing")
    request_id, answer = running.post(EU_PERSONAL, record='{"subject": "alice"')
    assert answer.status == 400, answer.text
    assert answer.body["code"] == "RECORD_MALFORMED"
    _, answer = running.post({"region": "EU", "consent": "care"})
    assert answer.status == 400 and answer.body["code"] == "LABEL_MISSING", answer.text
    time.sleep(0.5)
    assert running.reached(request_id) == set()


def test_the_audit_lines_show_no_forbidden_reception_allowed(running, tmp_path):
    if running.topology.kind == "baseline":
        pytest.skip("the baseline enforces nothing")
    assert running.post(EU_PERSONAL)[1].status == 200
    verdict = audit.audit_run(running.run_folder(tmp_path / "run"))
    assert verdict.lines >= 3 and verdict.forbidden == 0 and verdict.undecided == 0 and not verdict.broken_chains, verdict.summary()


def test_a_killed_opa_fails_closed_and_the_kubelet_restarts_it_denied(running):
    """SIGKILL to the OPA of the point that decides the hop from clients (the entry or the
    central entity), through the node's containerd: the record sent at once gets 503
    DECISION_UNAVAILABLE and reaches no instance; the kubelet starts the container again, and
    records pass again."""
    if running.topology.kind == "baseline":
        pytest.skip("the baseline has no OPA")
    pod = next(p for p in running.pods() if p["metadata"]["labels"]["app"] == running.entry)
    opa = next(s for s in pod["status"]["containerStatuses"] if s["name"] == "opa")
    restarts = opa["restartCount"]
    container = opa["containerID"].removeprefix("containerd://")
    realnode.run("ctr", f"--address={realnode.SOCKET}", "--namespace=k8s.io", "tasks", "kill", "--signal", "SIGKILL", container)

    request_id, answer = running.post(EU_PERSONAL)
    assert answer.status == 503 and answer.body["code"] == "DECISION_UNAVAILABLE", answer.text
    time.sleep(0.5)
    assert running.reached(request_id) == set()

    deadline = time.monotonic() + 120
    while True:
        pod = json.loads(running.cluster.kubectl("-n", running.namespace, "get", "pod", pod["metadata"]["name"], "-o", "json", quiet=True).stdout)
        status = next(s for s in pod["status"]["containerStatuses"] if s["name"] == "opa")
        if status["restartCount"] > restarts and status["ready"]:
            break
        assert time.monotonic() < deadline, f"the kubelet did not restart OPA: {status}"
        time.sleep(1)
    assert running.post(EU_PERSONAL)[1].status == 200
