"""The current kubectl context as a Target (complyroute/runtime/target.py): each topology rendered
and applied in its own namespace (apply.py), its entry reached through `kubectl port-forward` to
the entry's Service or at an address of the cluster's this machine reaches (entry_url), its
namespace deleted to undeploy it. Its parts are pods, not processes of this machine, and their
audit lines and decision logs stay in them: audit and trace are not supported here."""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
import subprocess
import time
from pathlib import Path
from urllib.parse import urlsplit

from complyroute.policy.ruleset import RuleSet
from complyroute.runtime.kubernetes import apply, render
from complyroute.runtime.kubernetes.nodes import NODE_LABEL, ONE_NODE_ROLE, ROLE_LABEL
from complyroute.runtime.target import DeployFailed, Probe, TargetBusy, TargetError, Unsupported, runs_root
from complyroute.topology.manifest import Topology
from complyroute.topology.plan import place



def workdir() -> Path:
    """Where each topology's kustomization and rendered YAML go; they hold the parts' keys."""
    return runs_root() / "k8s"
READY_TIMEOUT = "300s"  # how long a deploy waits for its pods to be ready
DELETE_TIMEOUT = "180s"  # how long an undeploy waits for the namespace to be gone
PORT_FORWARD_WAIT_S = 30
# How long reach waits, once the pods are ready, for a record to pass the whole chain.
PATH_READY_WAIT_S = 60


NO_KUBECTL = "--target k8s needs kubectl on PATH (make k8s-setup builds one into bin/)"


@contextlib.contextmanager
def kubectl_found():
    """A kubectl that is not on PATH as a TargetError, not a traceback."""
    try:
        yield
    except FileNotFoundError as error:
        if error.filename != "kubectl":
            raise
        raise TargetError(NO_KUBECTL) from None


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
    """The current kubectl context, one namespace per topology."""

    name = "k8s"
    runs_here = False
    OPTIONS = {"one_node": ("--one-node", "a local deployment runs every part on this machine"),
               "entry_url": ("--entry-url", "a local deployment's entry is on this machine's loopback"),
               "image": ("--image", "a local deployment runs services/ itself"),
               "ready_timeout": ("--timeout", "a local deploy waits for its parts' health checks as long as its size needs")}

    def __init__(self, one_node: bool = False, entry_url: str | None = None, image: str = render.SERVICE_IMAGE,
                 ready_timeout: str = READY_TIMEOUT):
        self.one_node = one_node  # every pod on the one node labelled ROLE_LABEL=ONE_NODE_ROLE
        self.entry_url = entry_url_of(entry_url) if entry_url else None
        self.image = image
        self.ready_timeout = ready_timeout
        self.namespace: str | None = None  # of the topology this object deployed
        self.forward: subprocess.Popen | None = None
        self.described: dict | None = None

    @property
    def port_forwarded(self) -> bool:
        """Without --entry-url, records reach the entry through `kubectl port-forward` (reach)."""
        return self.entry_url is None

    def kubectl(self, *args: str) -> subprocess.CompletedProcess:
        with kubectl_found():
            return apply.kubectl_output(*args)

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

    def check_free(self, topology: Topology | None) -> None:
        if topology is None:  # every topology has a namespace of its own: only its own can be taken
            return
        namespace = render.namespace_of(topology)
        if self.kubectl("get", "namespace", namespace).returncode == 0:
            raise TargetBusy(f"namespace {namespace} already exists in context {self.describe()['context']}: another deployment of "
                             f"{topology.name} is there, or one still being deleted (`make undeploy target=k8s`)")

    def deploy(self, topology: Topology, rule_set: RuleSet, out=None) -> dict:
        """Applied in the topology's namespace, pruning what an earlier apply there left (apply.apply);
        returns once every workload is ready. The engine is the rendered manifest's: the pods run
        what the render configured."""
        self.namespace = render.namespace_of(topology)
        started = time.monotonic()
        with kubectl_found():
            try:
                apply.apply(topology, workdir() / f"{topology.name}-{len(topology.instances)}", rule_set, self.ready_timeout, self.image,
                            one_node=self.one_node, out=out)
            except (RuntimeError, render.RenderError) as error:
                raise DeployFailed(f"applying {topology.name} to namespace {self.namespace} failed: {error}") from None
        bring_up = round(time.monotonic() - started, 2)
        pods = json.loads(self.kubectl("-n", self.namespace, "get", "pods", "-o", "json").stdout or '{"items": []}')["items"]
        return {"engine": topology.engine["kind"], "parts": len(pods), "bring_up_seconds": bring_up,
                "memory_mib": {"total": None}, "cpu_parts": None, "namespace": self.namespace,
                "nodes": sorted({p["spec"].get("nodeName", "") for p in pods} - {""})}

    def reach(self, topology: Topology, probe: Probe, out=None) -> dict:
        """entry_url, or a port-forward to the entry's Service kept open until undeploy; then
        the wait for a probe to pass (path_wait_seconds)."""
        entry_url = self.entry_url or self.port_forward(apply.entry_service(place(topology, render.KubernetesNetwork(self.namespace))),
                                                        out)
        return {"entry_url": entry_url, "path_wait_seconds": self.wait_for_path(entry_url, probe, len(topology.instances), out)}

    @staticmethod
    def wait_for_path(entry_url: str, probe: Probe, services: int, out) -> float:
        """Ready pods are not yet a path: kube-proxy programs a Service's addresses a moment after
        its endpoints are ready (seconds on a loaded node), and until then a hop to it is refused
        (502 NEXT_HOP_FAILED, ECONNREFUSED) or times out. As a local deploy returns once its parts
        answer, a deployment here is up once one record passes its whole chain. Seconds waited;
        a chain that never passes is left to the caller's own check, which sees the answer."""
        started = time.monotonic()
        while True:
            failing = probe(entry_url)
            waited = round(time.monotonic() - started, 2)
            if failing is None or waited > PATH_READY_WAIT_S:
                print(f"path: {'a record passed the ' + str(services) + ' services' if failing is None else 'no record passed'} "
                      f"after {waited} s{'' if failing is None else ': ' + failing}", file=out, flush=True)
                return waited
            time.sleep(1)

    def port_forward(self, service: str, out) -> str:
        port = free_port()
        command = [shutil.which("kubectl") or "kubectl", "-n", self.namespace, "port-forward", "--address=127.0.0.1", f"service/{service}",
                   f"{port}:{render.KubernetesNetwork.ENTRY}"]
        print("$ " + " ".join(command), file=out, flush=True)
        self.forward = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + PORT_FORWARD_WAIT_S
        while not answers(port):
            if self.forward.poll() is not None or time.monotonic() > deadline:
                raise DeployFailed(f"kubectl port-forward to service/{service} in {self.namespace} did not listen on 127.0.0.1:{port} "
                                   f"within {PORT_FORWARD_WAIT_S} s (see what it printed)")
            time.sleep(0.2)
        return f"http://127.0.0.1:{port}/process"

    def undeploy(self, out=None) -> None:
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
        apply.kubectl("delete", "namespace", self.namespace, "--ignore-not-found", "--wait=true", f"--timeout={DELETE_TIMEOUT}",
                      check=False, out=out)
        apply.record_path(self.namespace).unlink(missing_ok=True)
        self.namespace = None

    def left_over(self) -> list[int]:
        return [self.forward.pid] if self.forward is not None and self.forward.poll() is None else []

    def status(self, topology: Topology | None, out=None) -> int:
        with kubectl_found():
            return apply.status(topology, out=out)

    @staticmethod
    def refuse_no_topology(topology: Topology | None) -> Topology:
        if topology is None:
            raise TargetError("reload-policy --target k8s needs --topology: the manifest (name, alias or path) it was deployed with")
        return topology

    def deployed_rule_set(self, topology: Topology | None) -> str:
        return apply.deployed_rule_set(self.refuse_no_topology(topology))

    def reload_policy(self, topology: Topology | None, rule_set: RuleSet, out=None) -> dict:
        """`rule_set` into the bundle and route ConfigMaps of `topology` as deployed here, no pod
        rolled (apply.reload_policy); it does not wait for the points."""
        topology = self.refuse_no_topology(topology)
        with kubectl_found():
            return apply.reload_policy(topology, rule_set, out=out)

    def undeploy_all(self, out=None) -> int:
        with kubectl_found():
            return apply.delete(out=out)

    def run_folders(self, verb: str) -> Path:
        raise Unsupported(verb, self.name, "a Kubernetes deployment's audit lines and decision logs stay in its pods, not in a run "
                                           "folder of this machine")
