"""A real Kubernetes control plane on loopback, with fake nodes, to check rendered topologies.

etcd (Debian's etcd-server), kube-apiserver, kube-controller-manager and kube-scheduler (built
from k8s.io/kubernetes by `make k8s-setup`) run as processes; kwok fakes the nodes (one
gateway, three service nodes, labelled as an operator would label real ones) and the pods
the scheduler puts on them. Every object goes through the real API server, admission,
controllers and scheduler; only the kubelet's work is simulated, so no container runs and
no traffic flows: kwok's pod addresses are data in a status field, nothing is sent to them.

With real_node=True one real node joins them (RealNode): containerd, runc and the CNI plugins
from Debian's packages, a kubelet and kube-proxy built from the same k8s.io/kubernetes as the API
server, and CoreDNS (tools/coredns), all in a network namespace of their own and a mount
namespace of their own. Pods there run the images `make images` built (complyroute/runtime/kubernetes/images.py)
and carry traffic; every iptables rule, bridge, veth and pod network namespace lives inside the
node's network namespace, every mount inside its mount namespace, and stop() ends every
process of the node (their cgroup), deletes both namespaces and restores what the kubelet
changed on the host (a few kernel settings), so nothing stays behind.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import time
import urllib.request
from pathlib import Path

import yaml

from complyroute.runtime.kubernetes import images
from complyroute.runtime.kubernetes.nodes import NODE_LABEL, ROLE_LABEL
from complyroute.topology.manifest import REPO

from . import realnode
from .realnode import RealNode

BIN = REPO / "bin"
ETCD_CLIENT, ETCD_PEER, APISERVER, CONTROLLER_MANAGER, SCHEDULER = 32379, 32380, 36443, 30257, 30259
PORTS = {"etcd client": ETCD_CLIENT, "etcd peer": ETCD_PEER, "kube-apiserver": APISERVER,
         "kube-controller-manager": CONTROLLER_MANAGER, "kube-scheduler": SCHEDULER}
TOKEN = "complyroute-k8s-e2e"
# kwok stages shipped with the pinned kwok module: nodes become Ready and keep a lease,
# pods become Ready (and go away when deleted) at once.
KWOK_STAGES = ["kustomize/stage/node/fast/node-initialize.yaml", "kustomize/stage/node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
               "kustomize/stage/pod/fast/pod-ready.yaml", "kustomize/stage/pod/fast/pod-complete.yaml", "kustomize/stage/pod/fast/pod-delete.yaml"]


def port_in_use(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


def kwok_module_dir() -> Path:
    """Where the Go module cache holds the kwok version tools/kwok/go.mod pins."""
    found = subprocess.run(
        ["go", "list", "-m", "-f", "{{.Dir}}", "sigs.k8s.io/kwok"],
        cwd=REPO / "tools" / "kwok", capture_output=True, text=True, env={**os.environ, "GOWORK": "off", "GOFLAGS": "-mod=mod"},
    )
    if found.returncode != 0:
        raise RuntimeError(f"cannot find the kwok module: {found.stderr}")
    return Path(found.stdout.strip())


class LocalCluster:
    def __init__(self, workdir: Path, service_nodes: int = 3, real_node: bool = False):
        self.workdir = workdir
        self.nodes = [("gateway", "gateway")] + [(f"node-{n}", "service") for n in range(1, service_nodes + 1)]
        self.kubeconfig = workdir / "kubeconfig"
        self.processes: dict[str, subprocess.Popen] = {}
        self.real_node = RealNode(self) if real_node else None
        # Where the API server listens: loopback, or with a real node the host's end of the
        # node's veth (the kubelet, kube-proxy and CoreDNS reach it from the node's namespace).
        self.apiserver_host = realnode.HOST_IP if real_node else "127.0.0.1"

    # ---- processes
    def start_process(self, name: str, command: list[str], preexec_fn=None) -> subprocess.Popen:
        log = open(self.workdir / f"{name}.log", "ab")
        self.processes[name] = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                                start_new_session=True, preexec_fn=preexec_fn)
        return self.processes[name]

    def wait_for(self, what: str, check, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, process in self.processes.items():
                if process.poll() is not None:
                    raise RuntimeError(f"{name} exited with {process.returncode}; see {self.workdir / (name + '.log')}")
            if check():
                return
            time.sleep(0.5)
        raise RuntimeError(f"{what} not ready after {timeout:.0f} s; logs in {self.workdir}")

    def apiserver_ready(self) -> bool:
        request = urllib.request.Request(f"https://{self.apiserver_host}:{APISERVER}/readyz", headers={"Authorization": f"Bearer {TOKEN}"})
        try:
            with urllib.request.urlopen(request, context=ssl._create_unverified_context(), timeout=2) as answer:
                return answer.status == 200
        except OSError:
            return False

    def start(self) -> None:
        """Start the control plane and the fake nodes; on any failure stop what had started."""
        busy = [f"{port} ({what})" for what, port in PORTS.items() if port_in_use(port)]
        if busy:
            raise RuntimeError(f"ports in use: {', '.join(busy)}; is another local cluster still running? "
                               "Stop it (pkill -f runs/k8s-e2e) and try again.")
        if self.real_node:
            self.real_node.check()
        try:
            self.start_control_plane()
            if self.real_node:
                self.real_node.start()
        except BaseException:
            self.stop()
            raise

    def start_control_plane(self) -> None:
        if self.workdir.exists():
            shutil.rmtree(self.workdir)
        self.workdir.mkdir(parents=True)
        if self.real_node:  # the veth the API server listens on must be there first
            self.real_node.make_namespaces()
        keys = self.workdir / "keys"
        keys.mkdir()
        subprocess.run(["openssl", "genrsa", "-out", str(keys / "sa.key"), "2048"], check=True, capture_output=True)
        subprocess.run(["openssl", "rsa", "-in", str(keys / "sa.key"), "-pubout", "-out", str(keys / "sa.pub")], check=True, capture_output=True)
        (keys / "tokens.csv").write_text(f"{TOKEN},admin,admin,system:masters\n")
        self.kubeconfig.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "local",
            "clusters": [{"name": "local", "cluster": {"server": f"https://{self.apiserver_host}:{APISERVER}", "insecure-skip-tls-verify": True}}],
            "users": [{"name": "admin", "user": {"token": TOKEN}}],
            "contexts": [{"name": "local", "context": {"cluster": "local", "user": "admin"}}],
        }))

        self.start_process("etcd", [
            shutil.which("etcd") or "etcd", "--data-dir", str(self.workdir / "etcd"),
            "--listen-client-urls", f"http://127.0.0.1:{ETCD_CLIENT}", "--advertise-client-urls", f"http://127.0.0.1:{ETCD_CLIENT}",
            "--listen-peer-urls", f"http://127.0.0.1:{ETCD_PEER}", "--initial-advertise-peer-urls", f"http://127.0.0.1:{ETCD_PEER}",
            "--initial-cluster", f"default=http://127.0.0.1:{ETCD_PEER}", "--name", "default",
        ])
        self.start_process("kube-apiserver", [
            str(BIN / "kube-apiserver"), f"--etcd-servers=http://127.0.0.1:{ETCD_CLIENT}",
            f"--secure-port={APISERVER}", f"--bind-address={self.apiserver_host}", f"--advertise-address={self.apiserver_host}",
            f"--cert-dir={self.workdir / 'certs'}", f"--token-auth-file={keys / 'tokens.csv'}", "--authorization-mode=RBAC",
            f"--service-account-key-file={keys / 'sa.pub'}", f"--service-account-signing-key-file={keys / 'sa.key'}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            # Addresses the API server hands out to Services: data only, nothing is routed.
            "--service-cluster-ip-range=10.96.0.0/16", "--allow-privileged=true",
            # With WatchList on, the API server turns a watch from resourceVersion 0 (how kwok
            # watches pods) into a watch-list stream, which needs etcd's RequestWatchProgress
            # (etcd >= 3.4.31); Debian's 3.4.23 lacks it, so each such watch failed at once and
            # kwok saw pods only when its backed-off re-list came round, up to 30 s late.
            "--feature-gates=WatchList=false",
            # A real node's kubelet (port-forward, exec, logs) is reached at its address: no DNS
            # here knows the node's name.
            "--kubelet-preferred-address-types=InternalIP,Hostname",
        ])
        self.wait_for("kube-apiserver", self.apiserver_ready)
        self.start_process("kube-controller-manager", [
            str(BIN / "kube-controller-manager"), f"--kubeconfig={self.kubeconfig}", "--leader-elect=false",
            "--bind-address=127.0.0.1", f"--secure-port={CONTROLLER_MANAGER}",
            f"--service-account-private-key-file={keys / 'sa.key'}", "--use-service-account-credentials=false",
            # The default 20 requests/s makes creating 150 pods of a 50-service topology crawl.
            "--kube-api-qps=200", "--kube-api-burst=400",
        ])
        self.start_process("kube-scheduler", [
            str(BIN / "kube-scheduler"), f"--kubeconfig={self.kubeconfig}", "--leader-elect=false",
            "--bind-address=127.0.0.1", f"--secure-port={SCHEDULER}",
        ])
        stages = "\n---\n".join((kwok_module_dir() / stage).read_text() for stage in KWOK_STAGES)
        (self.workdir / "kwok-stages.yaml").write_text(stages)
        self.start_process("kwok", [
            str(BIN / "kwok"), f"--kubeconfig={self.kubeconfig}", f"--config={self.workdir / 'kwok-stages.yaml'}",
            "--manage-all-nodes=false", "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
            # Pod and node addresses kwok writes into status: data only, nothing is sent to them.
            "--cidr=10.244.0.1/16", "--node-ip=10.240.0.1", "--node-lease-duration-seconds=40",
        ])
        self.kubectl("apply", "-f", "-", input=yaml.safe_dump_all([self.node(name, role) for name, role in self.nodes]))
        self.wait_for("nodes", lambda: self.ready_nodes() == len(self.nodes))

    @staticmethod
    def node(name: str, role: str) -> dict:
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "annotations": {"kwok.x-k8s.io/node": "fake"},
                "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "type": "kwok", NODE_LABEL: name, ROLE_LABEL: role},
            },
            "status": {
                "capacity": {"cpu": "32", "memory": "256Gi", "pods": "250"},
                "allocatable": {"cpu": "32", "memory": "256Gi", "pods": "250"},
            },
        }

    def ready_nodes(self) -> int:
        nodes = json.loads(self.kubectl("get", "nodes", "-o", "json", quiet=True).stdout)["items"]
        return sum(any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"].get("conditions", [])) for n in nodes)

    def kubectl(self, *args: str, input: str | None = None, quiet: bool = False, check: bool = True) -> subprocess.CompletedProcess:
        result = subprocess.run([str(BIN / "kubectl"), f"--kubeconfig={self.kubeconfig}", *args], input=input, capture_output=True, text=True)
        if check and result.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)} failed: {result.stderr.strip()}")
        if not quiet and result.stdout.strip():
            print(result.stdout.strip())
        return result

    def stop(self) -> None:
        """Stop in reverse start order, each before the next: the API server shuts down
        quickly while etcd is still there, and hangs retrying when etcd went first. A real
        node goes first, the control plane still up."""
        if self.real_node:
            self.real_node.stop()
        for process in reversed(list(self.processes.values())):
            try:
                os.killpg(process.pid, signal.SIGTERM)
                process.wait(timeout=15)
            except ProcessLookupError:
                pass
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        self.processes.clear()


def import_images() -> int:
    """`make images`' last step: into the real node's containerd if a local cluster with one runs;
    otherwise the node imports them when it starts (RealNode.import_images)."""
    if not realnode.running():  # a killed one's containerd socket may still be there, refusing connections
        print("images: no local cluster with a real node runs; its node imports runs/images/*.tar when it starts")
        return 0
    for kind in images.IMAGES:
        realnode.run("ctr", f"--address={realnode.SOCKET}", "--namespace=k8s.io", "images", "import", str(images.archive(kind)))
        print(f"images: {images.IMAGES[kind]} imported into the real node's containerd (namespace k8s.io)")
    return 0


if __name__ == "__main__":
    import sys

    if sys.argv[1:] == ["import-images"]:
        sys.exit(import_images())
    sys.exit("usage: python -m tests.k8s.harness.localcluster import-images")
