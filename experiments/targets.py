"""Where an experiment's cells deploy: processes on this machine (LocalTarget, `make deploy`'s
code) or the current kubectl context (KubernetesTarget, `make deploy target=k8s`'s rendering
and apply). The runner, the capacity search and the soak ask a Target to deploy a topology,
to reach its entry, to undeploy it, and to say where it ran; nothing else of theirs differs.

What a target can measure differs, and each says so (`unmeasured`): on Kubernetes the parts
are pods, not processes of this machine, so their CPU time and memory are not sampled; and
their entry is reached through `kubectl port-forward` (the API server and the kubelet carry
every request) unless --entry-url names an address of the cluster's that this machine reaches.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Protocol
from urllib.parse import urlsplit

from complyroute.client import send
from complyroute.runtime.kubernetes import apply, render
from complyroute.runtime.kubernetes.nodes import NODE_LABEL, ONE_NODE_ROLE, ROLE_LABEL
from complyroute.runtime.local import deployment, supervision
from complyroute.topology.manifest import Topology
from complyroute.topology.plan import place

from .mixes import ALLOWED_LABELS, BODY

TARGETS = ("local", "k8s")
# How long a cell waits for its pods to be ready, and for its namespace to be gone.
K8S_READY_TIMEOUT = "300s"
K8S_DELETE_TIMEOUT = "180s"
PORT_FORWARD_WAIT_S = 30
# How long a cell waits, once its pods are ready, for a record to pass its whole chain.
PATH_READY_WAIT_S = 60
K8S_WORKDIR = deployment.RUNS / "k8s" / "experiments"


class TargetError(RuntimeError):
    """A target that cannot be used as asked (no cluster answering, nodes not labelled, a bad
    entry URL): the command stops before any cell, with this message."""


class TargetBusy(RuntimeError):
    """Another deployment is where a cell would deploy: the run stops rather than fail every cell."""


class DeployFailed(RuntimeError):
    """One cell's deployment did not come up; the cell fails, the run goes on."""


class Target(Protocol):
    name: str  # "local" or "k8s", as metadata and reports label it
    runs_here: bool  # whether the deployment's parts are processes of this machine (CPU sampled, the bench comparable)

    def describe(self) -> dict:
        """Where the cells run, for metadata.json and the report: {"target": name, ...}."""

    def unmeasured(self) -> list[str]:
        """What the reports cannot show on this target, one sentence each."""

    def check_free(self, topology: Topology | None) -> None:
        """Raise TargetBusy when another deployment is where `topology` would go (None: any topology)."""

    def deploy(self, topology: Topology, log) -> dict:
        """Deploy and wait until every part is ready. Returns entry_url (where records are
        posted), engine, parts (how many), bring_up_seconds, memory_mib ({"total": MiB or
        None}) and cpu_parts ([(pid, kind)] to sample, None when they cannot be)."""

    def undeploy(self, log) -> None:
        """Stop what this target deployed for the current cell, if anything."""

    def left_over(self) -> list[int]:
        """Processes of this machine a stopped deployment left running (after undeploy)."""


class LocalTarget:
    """Processes on this machine, supervised (complyroute/runtime/local/deployment.py), one deployment at a time."""

    name = "local"
    runs_here = True

    def __init__(self):
        self.deploying = False  # from deploy's start on, whatever is deployed is this target's
        self.run_dir: str | None = None
        self.parts: list[tuple[int, str]] = []  # (pid, kind)

    def describe(self) -> dict:
        return {"target": self.name, "where": "processes on this machine (supervisord), entry on loopback"}

    def unmeasured(self) -> list[str]:
        return []

    def check_free(self, topology: Topology | None) -> None:
        running = deployment.running()
        if running:
            raise TargetBusy(f"another deployment is running ({running['topology']}, run folder {running['run_dir']}); "
                             "stop it (`make undeploy`)")

    def deploy(self, topology: Topology, log) -> dict:
        self.check_free(topology)
        self.deploying = True
        try:
            state = deployment.deploy(topology, out=log)
        except supervision.DeploymentError as error:
            raise DeployFailed(str(error)) from None
        self.run_dir = state["run_dir"]
        self.parts = [(part["pid"], part["kind"]) for part in state["parts"]]
        self.deploying = False
        return {"entry_url": state["entry_url"], "engine": state["engine"], "parts": len(state["parts"]),
                "bring_up_seconds": state["bring_up_seconds"], "memory_mib": state["memory_mib"], "cpu_parts": self.parts,
                "run_dir": state["run_dir"]}

    def undeploy(self, log) -> None:
        state = deployment.read_state()
        if state and (self.deploying or state["run_dir"] == self.run_dir):
            deployment.stop(out=log)
        self.deploying = False

    def left_over(self) -> list[int]:
        left = [pid for pid, _ in self.parts if supervision.alive(pid)]
        if self.run_dir:
            left += deployment.processes_using(self.run_dir)
        return left


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def answers(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


def entry_url_of(url: str) -> str:
    """--entry-url as records are posted to it: http(s)://host[:port], /process added."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.path not in ("", "/", "/process") or parts.query:
        raise TargetError(f"--entry-url {url!r}: give the entry's address as http://host:port (its /process is where records go)")
    return f"{parts.scheme}://{parts.netloc}/process"


class KubernetesTarget:
    """The current kubectl context: each cell's topology rendered and applied in its own namespace
    (complyroute.runtime.kubernetes.apply, as `make deploy target=k8s`), its entry reached through `kubectl
    port-forward` to the entry's Service or at `entry_url`, the namespace deleted afterwards."""

    name = "k8s"
    runs_here = False

    def __init__(self, workdir: Path = K8S_WORKDIR, one_node: bool = False, entry_url: str | None = None,
                 image: str = render.SERVICE_IMAGE):
        self.workdir = workdir  # each cell's kustomization and rendered YAML: they hold the parts' keys, so not in the results
        self.one_node = one_node
        self.entry_url = entry_url_of(entry_url) if entry_url else None
        self.image = image
        self.namespace: str | None = None  # of the cell deployed now
        self.forward: subprocess.Popen | None = None
        self.described: dict | None = None

    def kubectl(self, *args: str) -> subprocess.CompletedProcess:
        try:
            return apply.kubectl_output(*args)
        except FileNotFoundError:
            raise TargetError("--target k8s needs kubectl on PATH (make k8s-setup builds one into bin/)") from None

    def describe(self) -> dict:
        """The context, its API server and its nodes, asked once; a context that does not
        answer, or whose nodes are not labelled for the render, is a TargetError."""
        if self.described:
            return self.described
        context = self.kubectl("config", "current-context").stdout.strip()
        if not context:
            raise TargetError("--target k8s: kubectl has no current context; point KUBECONFIG at the cluster's kubeconfig or "
                              "choose one with `kubectl config use-context`")
        server = self.kubectl("config", "view", "--minify", "-o", "jsonpath={.clusters[0].cluster.server}").stdout.strip()
        listed = self.kubectl("get", "nodes", "-o", "json")
        if listed.returncode != 0:
            raise TargetError(f"--target k8s: the current kubectl context ({context}{', server ' + server if server else ''}) "
                              "does not answer: "
                              f"{listed.stderr.strip().splitlines()[-1] if listed.stderr.strip() else 'kubectl get nodes failed'}")
        nodes = json.loads(listed.stdout)["items"]
        labels = {n["metadata"]["name"]: n["metadata"].get("labels", {}) for n in nodes}
        if self.one_node:
            carrying = sorted(name for name, label in labels.items() if label.get(ROLE_LABEL) == ONE_NODE_ROLE)
            if not carrying:
                raise TargetError(f"--one-node: no node of context {context} is labelled {ROLE_LABEL}={ONE_NODE_ROLE} "
                                  f"(nodes: {', '.join(sorted(labels)) or 'none'})")
        else:
            carrying = sorted(name for name, label in labels.items() if NODE_LABEL in label)
            if not carrying:
                raise TargetError(f"--target k8s: no node of context {context} is labelled {NODE_LABEL}=<node> "
                                  f"(nodes: {', '.join(sorted(labels)) or 'none'}); label them as topologies/README.md says, "
                                  "or give --one-node for a single node labelled "
                                  f"{ROLE_LABEL}={ONE_NODE_ROLE}")
        self.described = {"target": self.name, "context": context, "server": server, "nodes": sorted(labels),
                          "deploys_to": carrying, "one_node": self.one_node,
                          "entry": f"{self.entry_url} (--entry-url)" if self.entry_url else "kubectl port-forward to the entry's Service",
                          "image": self.image}
        return self.described

    def unmeasured(self) -> list[str]:
        unmeasured = ["the deployment's CPU time and memory, by part or in total: its parts are pods of the cluster, not processes "
                      "of this machine (the CPU columns of the deployment are empty; machine and Locust CPU are this machine's)"]
        if not self.entry_url:
            unmeasured.append("latency and rate without kubectl port-forward: every record goes through the API server and the "
                              "node's kubelet to reach the entry, which adds to the RTT and caps the rate this machine can send")
        return unmeasured

    def check_free(self, topology: Topology | None) -> None:
        if topology is None:  # every topology has a namespace of its own: only its own can be taken
            return
        namespace = render.namespace_of(topology)
        if self.kubectl("get", "namespace", namespace).returncode == 0:
            raise TargetBusy(f"namespace {namespace} already exists in context {self.describe()['context']}: another deployment of "
                             f"{topology.name} is there, or one still being deleted (`make undeploy target=k8s`)")

    def deploy(self, topology: Topology, log) -> dict:
        self.check_free(topology)
        self.namespace = render.namespace_of(topology)
        started = time.monotonic()
        try:
            apply.apply(topology, self.workdir / f"{topology.name}-{len(topology.instances)}", K8S_READY_TIMEOUT, self.image,
                        one_node=self.one_node, out=log)
        except (RuntimeError, render.RenderError) as error:
            raise DeployFailed(f"applying {topology.name} to namespace {self.namespace} failed: {error} (see the cell's deploy.log)") \
                from None
        bring_up = round(time.monotonic() - started, 2)
        pods = json.loads(self.kubectl("-n", self.namespace, "get", "pods", "-o", "json").stdout or '{"items": []}')["items"]
        entry_url = self.entry_url or self.port_forward(apply.entry_service(place(topology, render.KubernetesNetwork(self.namespace))),
                                                        log)
        path_wait = self.wait_for_path(entry_url, len(topology.instances), log)
        # The engine is the rendered manifest's: the pods run what the render configured.
        return {"entry_url": entry_url, "engine": topology.engine["kind"], "parts": len(pods), "bring_up_seconds": bring_up,
                "path_wait_seconds": path_wait,
                "memory_mib": {"total": None}, "cpu_parts": None, "namespace": self.namespace,
                "nodes": sorted({p["spec"].get("nodeName", "") for p in pods} - {""})}

    @staticmethod
    def wait_for_path(entry_url: str, services: int, log) -> float:
        """Ready pods are not yet a path: kube-proxy programs a Service's addresses a moment after
        its endpoints are ready (seconds on a loaded node), and until then a hop to it is refused
        (502 NEXT_HOP_FAILED, ECONNREFUSED) or times out. As a local deploy returns once its parts
        answer, a cell's deployment is up once one record passes its whole chain. Seconds waited;
        a chain that never passes is left to the runner's check record, which fails the cell with
        the answer."""
        started = time.monotonic()
        while True:
            answer = send(entry_url, ALLOWED_LABELS, BODY, request_id=f"path-check-{time.monotonic_ns()}", timeout=10)
            passed = answer.status == 200 and answer.body and len(answer.body["path"]) == services
            waited = round(time.monotonic() - started, 2)
            if passed or waited > PATH_READY_WAIT_S:
                print(f"path: {'a record passed the ' + str(services) + ' services' if passed else 'no record passed'} after {waited} s"
                      f"{'' if passed else ': ' + answer.summary()}", file=log, flush=True)
                return waited
            time.sleep(1)

    def port_forward(self, service: str, log) -> str:
        port = free_port()
        command = [shutil.which("kubectl") or "kubectl", "-n", self.namespace, "port-forward", "--address=127.0.0.1", f"service/{service}",
                   f"{port}:{render.KubernetesNetwork.ENTRY}"]
        print("$ " + " ".join(command), file=log, flush=True)
        self.forward = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + PORT_FORWARD_WAIT_S
        while not answers(port):
            if self.forward.poll() is not None or time.monotonic() > deadline:
                raise DeployFailed(f"kubectl port-forward to service/{service} in {self.namespace} did not listen on 127.0.0.1:{port} "
                                   f"within {PORT_FORWARD_WAIT_S} s (see the cell's deploy.log)")
            time.sleep(0.2)
        return f"http://127.0.0.1:{port}/process"

    def undeploy(self, log) -> None:
        if self.forward is not None:
            self.forward.terminate()
            try:
                self.forward.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.forward.kill()
                self.forward.wait()
            self.forward = None
        if self.namespace is None:
            return
        apply.kubectl("delete", "namespace", self.namespace, "--ignore-not-found", "--wait=true", f"--timeout={K8S_DELETE_TIMEOUT}",
                      check=False, out=log)
        apply.Deployed.path(self.namespace).unlink(missing_ok=True)
        self.namespace = None

    def left_over(self) -> list[int]:
        return [self.forward.pid] if self.forward is not None and self.forward.poll() is None else []


def make(name: str, one_node: bool = False, entry_url: str | None = None) -> Target:
    """The target the command line names; options that belong to the other target are refused.
    A k8s target asks its context once here, so a cluster that does not answer stops the
    command before any cell."""
    if name not in TARGETS:
        raise TargetError(f"--target {name!r}: use local (processes on this machine) or k8s (the current kubectl context)")
    if name == "local":
        given = [option for option, value in (("--one-node", one_node), ("--entry-url", entry_url)) if value]
        if given:
            raise TargetError(f"{' and '.join(given)} {'apply' if len(given) > 1 else 'applies'} to --target k8s only: "
                              "a local deployment runs on this machine's loopback")
        return LocalTarget()
    target = KubernetesTarget(one_node=one_node, entry_url=entry_url)
    target.describe()
    return target


def where_text(described: dict | None) -> str:
    """Where a run ran, as its reports say it: metadata.json's "target" (a run recorded before
    targets existed ran locally)."""
    if not described or described["target"] == "local":
        return "Target: **local** (processes on this machine, supervised; entry on loopback)."
    return (f"Target: **k8s**: kubectl context `{described['context']}`, API server {described['server']}, nodes "
            f"{', '.join(described['nodes'])} (deployed to {', '.join(described['deploys_to'])}"
            f"{', rendered for one node' if described['one_node'] else ''}); entry: {described['entry']}; "
            f"service image {described['image']}.")


def unmeasured_text(unmeasured: list[str] | None) -> str | None:
    """What the target could not measure, as the reports say it; None when everything was."""
    return f"Not measured on this target: {'; '.join(unmeasured)}." if unmeasured else None


def run_paragraphs(meta: dict) -> list[str]:
    """Where a run's cells deployed and what that target could not measure: the paragraphs the
    run's report and the capacity report both give under their parameters."""
    unmeasured = unmeasured_text(meta.get("unmeasured"))
    return [where_text(meta.get("target"))] + ([unmeasured] if unmeasured else [])
