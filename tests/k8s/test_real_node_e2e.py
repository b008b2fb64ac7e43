"""Every topology, rendered for one node (render.Renderer(one_node=True)) with the services of
mixed-regions, its EU analyse instance in two replicas (a compliant set of two), running on the
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
import threading
import time
import urllib.parse
from collections import Counter
from pathlib import Path

import pytest
import yaml

from complyroute.client import send
from complyroute.evidence import audit
from complyroute.policy import bundles
from complyroute.runtime.kubernetes import render
from complyroute.runtime.kubernetes.images import IMAGES
from complyroute.topology.plan import ADMIN_SOCKET
from complyroute.topology import manifest
from tests.k8s.harness import realnode
from tests.rulesets import of_manifest


MIXED_REGIONS = manifest.REPO / "topologies" / "examples" / "mixed-regions.yaml"
# mixed-regions with its EU analyse instance in two replicas (replicated()): an EU record's
# analyse hop may go to either, a compliant set of two.
REPLICATED = "analyse-eu"
ANALYSE_EU = {f"{REPLICATED}-1", f"{REPLICATED}-2"}
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
        """Wait, as a local deploy does before it returns, until one record passes the whole
        chain (the Services are programmed by then: wait_until_kube_proxy_programs)."""
        deadline = time.monotonic() + timeout
        while True:
            _, answer = self.post(EU_PERSONAL)
            if answer.status == 200 or time.monotonic() > deadline:
                assert answer.status == 200, f"no record passed {self.topology.name} within {timeout:.0f} s: {answer.text}"
                return
            time.sleep(1)

    def state(self) -> str:
        """What a failed test's report shows (tests/k8s/conftest.py; a CI run keeps no folder):
        each pod's readiness and restarts (with how its container last ended: OOMKilled, or
        the exit code a liveness probe's kill leaves), the Service ports kube-proxy has not
        programmed, and the namespace's last events."""
        def container(s: dict) -> str:
            ended = s.get("lastState", {}).get("terminated")
            last = f" (last ended {ended.get('reason')}, exit {ended.get('exitCode')}, at {ended.get('finishedAt')})" if ended else ""
            return f"{s['name']} ready={s['ready']} restarts={s['restartCount']}{last}"

        lines = [f"{p['metadata']['name']}: {p['status']['phase']}, " + ", ".join(container(s) for s in p["status"].get("containerStatuses", []))
                 for p in self.pods()]
        lines.append(f"not programmed by kube-proxy: {sorted(self.cluster.real_node.unprogrammed(self.namespace, service_ports(self.renderer)))}")
        events = self.cluster.kubectl("-n", self.namespace, "get", "events", "--sort-by=.lastTimestamp", quiet=True, check=False).stdout
        return "\n".join(lines + events.splitlines()[-30:])

    def pods(self) -> list[dict]:
        return json.loads(self.cluster.kubectl("-n", self.namespace, "get", "pods", "-o", "json", quiet=True).stdout)["items"]

    def pod_of(self, app: str) -> dict:
        """The one pod of a Deployment (or one-node DaemonSet) that is not being deleted."""
        (pod,) = [p for p in self.pods() if p["metadata"]["labels"]["app"] == app and not p["metadata"].get("deletionTimestamp")]
        return pod

    def volume(self, pod: dict, name: str) -> Path:
        """A pod's emptyDir `name`, under the kubelet's root on this machine."""
        return realnode_root(self.cluster) / "kubelet" / "pods" / pod["metadata"]["uid"] / "volumes" / "kubernetes.io~empty-dir" / name

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

    def run_folder(self, folder: Path, kept: tuple[Path, ...] = ()) -> Path:
        """A run folder as `make audit` reads one: the points as their pods run them, the bundles
        they decided with, the audit logs (and `kept`, those of deleted pods, each named
        <instance>.<pod>.jsonl: auditlog.instance_of)."""
        points = [{"name": p.name, "node": p.node, "senders": [d.sender for d in p.deciding], "destinations": sorted(p.destinations)}
                  for p in self.renderer.points]
        (folder / "audit").mkdir(parents=True)
        (folder / "state.json").write_text(json.dumps({"kind": self.topology.kind, "topology": self.topology.name,
                                                       "engine": self.topology.engine["kind"], "points": points}))
        for path in [*self.audit_files(), *kept]:
            (folder / "audit" / path.name).write_bytes(path.read_bytes())
        revisions = folder / bundles.REVISIONS / self.renderer.revision
        revisions.mkdir(parents=True)
        for packed in self.renderer.bundles:
            for name, content in packed.items():
                (revisions / name).write_bytes(content)
        return folder


def service_ports(renderer: render.Renderer) -> set[str]:
    """Every "<service>:<port name>" of the rendered namespace."""
    return {f"{o['metadata']['name']}:{p['name']}" for o in renderer.objects if o["kind"] == "Service" for p in o["spec"]["ports"]}


def wait_until_kube_proxy_programs(cluster, renderer: render.Renderer, timeout: float = 60) -> None:
    """Ready pods are not yet reachable Services: kube-proxy writes a Service's rules a moment
    after its endpoints are ready (seconds on a loaded machine), and until then a hop to it is
    refused (502 NEXT_HOP_FAILED, ECONNREFUSED). One record passing shows only the Services on
    its path (a DR_6 record through analyse-eu-1 never asks router-2, the router of
    analyse-eu-2), so wait for every Service port of the namespace."""
    ports = service_ports(renderer)
    deadline = time.monotonic() + timeout
    while missing := cluster.real_node.unprogrammed(renderer.namespace, ports):
        assert time.monotonic() < deadline, f"kube-proxy sent no Service address of {sorted(missing)} to an endpoint within {timeout:.0f} s"
        time.sleep(0.5)


def realnode_root(cluster) -> Path:
    return cluster.real_node.dir


def replicated(folder: Path) -> Path:
    """The services of mixed-regions with `replicas: 2` on its EU analyse instance only: the
    example's other EU replicas made one instance each, as the real node's time allows."""
    services = yaml.safe_load(MIXED_REGIONS.read_text())
    for entry in services["services"]:
        entry.pop("replicas", None)
        if entry["id"] == REPLICATED:
            entry["replicas"] = 2
    path = folder / "mixed-regions-replicated.yaml"
    path.write_text(yaml.safe_dump(services, sort_keys=False))
    return path


@pytest.fixture(scope="module", params=TOPOLOGIES)
def running(cluster, request, tmp_path_factory):
    if cluster.real_node is None:
        pytest.skip("the cluster runs without a real node (COMPLYROUTE_REAL_NODE=0)")
    folder = tmp_path_factory.mktemp(request.param)
    topology = manifest.load(request.param, services=str(replicated(folder)))
    renderer = render.Renderer(topology, of_manifest(topology), one_node=True)
    renderer.render()
    rendered = folder / "rendered.yaml"
    rendered.write_text(render.build(renderer, folder / "kustomization"))
    namespace = renderer.namespace
    cluster.kubectl("apply", "--server-side", "-f", str(rendered), quiet=True)
    forward = None
    try:
        cluster.kubectl("-n", namespace, "wait", "--for=condition=Available", "deployment", "--all", "--timeout=300s", quiet=True)
        for daemonset in [o["metadata"]["name"] for o in renderer.objects if o["kind"] == "DaemonSet"]:
            cluster.kubectl("-n", namespace, "rollout", "status", f"daemonset/{daemonset}", "--timeout=300s", quiet=True)
        wait_until_kube_proxy_programs(cluster, renderer)
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
    assert path[0] == "ingest-eu" and path[1] in ANALYSE_EU and path[2] == "store-eu", path
    assert all(hop["region"] == "EU" for hop in answer.body["path"])
    assert running.reached(request_id, 3) == set(path)


def test_record_without_consent_to_the_last_step_gets_451_with_the_rules_code_denied(running):
    if running.topology.kind == "baseline":
        pytest.skip("the baseline enforces nothing")
    request_id, answer = running.post({**EU_PERSONAL, "consent": "care"})
    assert answer.status == 451, answer.text
    assert answer.body["code"] == "PURPOSE_NOT_CONSENTED"
    assert [r["instance"] for r in answer.body["reasons"]] == ["store-eu"]
    reached = running.reached(request_id, 2)
    assert len(reached) == 2 and "ingest-eu" in reached and reached & ANALYSE_EU, reached


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
    # Its pod was unready while OPA was down: the Services that lead to it are programmed again
    # a moment after it is ready (the central entity's, which every service's hop goes through).
    wait_until_kube_proxy_programs(running.cluster, running.renderer)
    assert running.post(EU_PERSONAL)[1].status == 200


class Sender:
    """EU records sent one after another by each of `users` threads until stop(), every answer
    kept: (sent at, seconds taken, request id, status, the analyse hop's instance)."""

    def __init__(self, running: Running, users: int = 2):
        self.running, self.answers, self.stopping = running, [], threading.Event()
        self.refused: dict[str, str] = {}  # request id -> the answer's text, for every answer but 200
        self.threads = [threading.Thread(target=self.send, daemon=True) for _ in range(users)]
        for thread in self.threads:
            thread.start()

    def send(self) -> None:
        while not self.stopping.is_set():
            sent = time.monotonic()
            try:
                request_id, answer = self.running.post(EU_PERSONAL)
            except OSError as error:  # no answer at all (the port-forward broke, the read timed out)
                self.answers.append((sent, time.monotonic() - sent, f"no answer {sent}", None, None))
                self.refused[f"no answer {sent}"] = str(error)
                continue
            hop = answer.body["path"][1]["instance"] if answer.status == 200 else None
            self.answers.append((sent, time.monotonic() - sent, request_id, answer.status, hop))
            if answer.status != 200:
                self.refused[request_id] = answer.text

    def reached_since(self, instance: str, since: float) -> bool:
        return any(sent > since and hop == instance for sent, *_, hop in list(self.answers))

    def stop(self) -> None:
        self.stopping.set()
        for thread in self.threads:
            thread.join(timeout=60)


def service_status(pod: dict) -> dict:
    """Its service container's status; none yet for a pod not yet started."""
    return next((s for s in pod["status"].get("containerStatuses", []) if s["name"] == "service"), {})


def back(running: Running, sender: Sender, instance: str, serving, timeout: float = 180) -> float:
    """Waits until `instance` has a pod whose service container is ready and `serving(pod)`
    holds, then until a record sent after that went through it; the moment it was ready."""
    deadline = time.monotonic() + timeout
    while True:
        pods = [p for p in running.pods() if p["metadata"]["labels"]["app"] == instance and not p["metadata"].get("deletionTimestamp")]
        if pods and serving(pods[0]) and service_status(pods[0]).get("ready"):
            break
        assert time.monotonic() < deadline, f"{instance} did not come back within {timeout:.0f} s: {[p['status'] for p in pods]}"
        time.sleep(0.5)
    ready = time.monotonic()
    while not sender.reached_since(instance, ready):
        assert time.monotonic() < deadline, f"no record went to {instance} within {timeout:.0f} s after it was ready again"
        time.sleep(0.2)
    return ready


def set_cluster_admin(running: Running, path: str) -> str:
    """`path` of the admin API of the Envoy at the point that decides ingest-eu's hops (whose set
    cluster holds both analyse replicas), read through its admin socket (in its pod's private
    emptyDir)."""
    (point,) = [p for p in running.renderer.points
                if any(d.sender == "ingest-eu" for d in p.deciding) and ANALYSE_EU <= set(p.destinations)]
    private = running.volume(running.pod_of(point.group), render.PRIVATE_VOLUME)
    # A memory volume, mounted in the node's mount namespace only; asked from its folder, as the
    # socket's full path is longer than a socket address may be.
    return realnode.run("nsenter", f"--target={running.cluster.real_node.holder.pid}", "--mount", "--", "sh", "-c",
                        f"cd '{private}' && curl -sS --unix-socket {ADMIN_SOCKET} 'http://admin{path}'").stdout


def set_cluster_stats(running: Running) -> dict[str, int]:
    """The counters of the set cluster of both analyse replicas (set_cluster_admin's Envoy)."""
    stats = set_cluster_admin(running, "/stats?filter=" + urllib.parse.quote(",".join(sorted(ANALYSE_EU))))
    prefix = f"cluster.{','.join(sorted(ANALYSE_EU))}."
    counters = {}
    for line in stats.splitlines():
        name, _, value = line.partition(": ")
        if name.startswith(prefix) and value.strip().isdigit():
            counters[name.removeprefix(prefix)] = int(value)
    return counters


HOST_FIGURES = ("health_flags", "cx_connect_fail", "rq_error", "rq_success", "rq_timeout")


def set_hosts(running: Running) -> dict[str, dict[str, str]]:
    """Each instance of the set cluster of both analyse replicas as its Envoy sees it
    (set_cluster_admin's, /clusters): its health flags ("healthy", or why not, as
    /failed_outlier_check for an ejected one) and its connection and request counters."""
    cluster = ",".join(sorted(ANALYSE_EU))
    hosts: dict[str, dict[str, str]] = {}
    address_of: dict[str, str] = {}
    lines = [line.split("::") for line in set_cluster_admin(running, "/clusters").splitlines()]
    for fields in lines:  # cluster::address::hostname::name, then the address's counters
        if len(fields) == 4 and fields[0] == cluster and fields[2] == "hostname":
            address_of[fields[1]] = fields[3]
    for fields in lines:
        if len(fields) == 4 and fields[0] == cluster and fields[1] in address_of and fields[2] in HOST_FIGURES:
            hosts.setdefault(address_of[fields[1]], {})[fields[2]] = fields[3]
    return hosts


def eligible_twins(running: Running, timeout: float = 30) -> dict[str, dict[str, str]]:
    """Waits until the set cluster holds both analyse replicas as healthy (neither ejected by
    outlier detection), and returns set_hosts then. A record that reached a restarted instance
    says it took records again, not that its last ejection is over: Envoy ejects an instance
    whose connections failed twice in a row for up to 2 s (clusters.set_cluster), and a fault
    of its twin inside that time is a fault of both, which no retry can ride out."""
    deadline = time.monotonic() + timeout
    while True:
        hosts = set_hosts(running)
        if set(hosts) == ANALYSE_EU and all(h.get("health_flags") == "healthy" for h in hosts.values()):
            return hosts
        assert time.monotonic() < deadline, f"the set cluster did not hold both replicas as healthy within {timeout:.0f} s: {hosts}"
        time.sleep(0.2)


def test_a_killed_replica_loses_no_record_its_twin_takes_them_allowed(running, tmp_path):
    """Issue 27's real-node case. How the points see an instance's pods: each instance is its
    own Deployment (one pod) behind its own Service, so analyse-eu-1 and analyse-eu-2 are two
    instances and two Services. The point that decides ingest-eu's hops reaches each by its
    Service's name (STRICT_DNS: one endpoint per instance, the Service's ClusterIP) in the set's
    cluster; the decision names instances, never pods. Which pod serves an instance is the
    Service's business (kube-proxy), which instance of the set gets a record Envoy's.

    While two users send EU records one after another: (1) analyse-eu-1's service container is
    SIGKILLed through containerd (the pod, its address and its emptyDir stay; the kubelet starts
    it again; in the sidecar topology its sidecar's ingress stays up and answers that it could
    not deliver), then (2), once the point's Envoy holds both replicas as healthy again
    (eligible_twins), analyse-eu-2's pod is deleted (`kubectl delete pod`: a new pod, a new
    address behind the same Service). Each time every record is answered 200 through the
    other replica, but those inside the instance when it died: the point had sent them, so
    nothing retries them (Envoy's reset after the request went out, 503 HOP_UNAVAILABLE
    connection_termination), at most one per user per fault. The set cluster shows the
    retries; the killed instance gets records again once ready; the audit is clean, the deleted
    pod's chain kept by a hard link made before (its emptyDir goes with it)."""
    if running.topology.kind == "baseline":
        pytest.skip("the baseline has no compliant sets")
    first, second = sorted(ANALYSE_EU)
    kept = realnode_root(running.cluster) / "kept-audit" / running.topology.name
    kept.mkdir(parents=True, exist_ok=True)
    before = set_cluster_stats(running)
    sender = Sender(running)
    try:
        started = time.monotonic()
        back(running, sender, first, lambda pod: True, timeout=30)
        back(running, sender, second, lambda pod: True, timeout=30)

        pod = running.pod_of(first)
        restarts = service_status(pod)["restartCount"]
        killed_at = time.monotonic()
        realnode.run("ctr", f"--address={realnode.SOCKET}", "--namespace=k8s.io", "tasks", "kill", "--signal", "SIGKILL",
                     service_status(pod)["containerID"].removeprefix("containerd://"))
        restarted_at = back(running, sender, first, lambda pod: service_status(pod).get("restartCount", 0) > restarts)

        twins = eligible_twins(running)
        pod = running.pod_of(second)
        chain = kept / f"{second}.{pod['metadata']['uid']}.jsonl"
        chain.hardlink_to(running.volume(pod, "audit") / f"{second}.jsonl")
        deleted_at = time.monotonic()
        running.cluster.kubectl("-n", running.namespace, "delete", "pod", pod["metadata"]["name"], "--wait=false", quiet=True)
        replaced_at = back(running, sender, second, lambda new: new["metadata"]["uid"] != pod["metadata"]["uid"])
        time.sleep(1)
    finally:
        sender.stop()
    after = set_cluster_stats(running)
    hosts = set_hosts(running)

    answers = sender.answers
    # Inside the instance when it died: the point had sent the record, and the connection ended
    # before an answer (Envoy: upstream_reset_before_response_started{connection_termination}).
    # Each user has one record in flight at a time: at most one per user per fault.
    died = {request_id for request_id, text in sender.refused.items() if '"code":"HOP_UNAVAILABLE"' in text and "{connection_termination}" in text}
    lost = {request_id: text for request_id, text in sender.refused.items() if request_id not in died}
    windows = {"killed": (killed_at, restarted_at), "deleted": (deleted_at, replaced_at)}
    figures = {name: {"seconds": round(end - start, 1),
                      "records": dict(Counter(hop or str(status) for sent, _, _, status, hop in answers if start <= sent < end)),
                      "slowest_s": round(max((took for sent, took, *_ in answers if start <= sent < end), default=0), 2)}
               for name, (start, end) in windows.items()}
    retried = {k: after.get(k, 0) - before.get(k, 0) for k in ("upstream_rq_retry", "upstream_cx_connect_fail", "upstream_cx_connect_timeout",
                                                                "outlier_detection.ejections_enforced_total", "upstream_rq_retry_limit_exceeded")}
    print(f"\n{running.topology.name}: {len(answers)} records in {time.monotonic() - started:.0f} s, {len(died)} inside a killed "
          f"instance, {len(lost)} lost; {figures}; set cluster {retried}; its instances before the deletion {twins}, at the end "
          f"{hosts}; service restarts "
          f"{ {p['metadata']['name']: service_status(p).get('restartCount') for p in running.pods() if p['metadata']['labels']['component'] == 'service'} }")
    assert not lost, f"{len(lost)} of {len(answers)} records answered otherwise than 200: {list(lost.items())[:3]}"
    assert len(died) <= len(windows) * len(sender.threads), sorted(died)
    in_flight = {request_id: (sent, sent + took) for sent, took, request_id, *_ in answers}
    assert all(any(sent <= end and answered >= start for start, end in windows.values()) for sent, answered in map(in_flight.get, died)), died
    assert all(hop in ANALYSE_EU for *_, status, hop in answers if status == 200)
    assert retried["upstream_rq_retry"] >= 1, retried
    verdict = audit.audit_run(running.run_folder(tmp_path / "run", kept=(chain,)))
    assert verdict.records >= len(answers) - len(died) and verdict.clean, verdict.summary()
