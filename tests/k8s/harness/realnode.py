"""One real Kubernetes node for the local cluster (localcluster.LocalCluster(real_node=True)).

containerd, runc and the CNI plugins (bridge, host-local, loopback, portmap) come from Debian's
packages, which `make k8s-setup` installs; the kubelet and kube-proxy are built from the same
pinned k8s.io/kubernetes as the API server (tools/kubernetes), CoreDNS from tools/coredns.

Everything the node does to the machine stays in namespaces of its own:
- a network namespace (NETNS), joined to the host by one veth pair (HOST_IP on the host's end,
  NODE_IP on the node's): the CNI bridge, every pod's veth and network namespace, kube-proxy's
  and the bridge plugin's iptables rules, the kubelet's and CoreDNS's ports are all in there;
  the API server, on the host, listens on HOST_IP;
- a mount namespace, held by one process (`sleep`) that every part of the node joins (nsenter):
  containers' root filesystems, the kubelet's volume mounts and the pods' network namespace
  handles are mounted there only, and go when its last process ends;
- a cgroup (CGROUP, in every hierarchy), under which the node's processes, containerd's shims
  and every pod run: stop() kills every process in it, then removes it.
The containerd root, the kubelet's root, pod logs, CNI address leases all sit in the cluster's
working folder. The few machine-wide kernel settings the kubelet tunes are, where it runs,
files of the node's folder bind-mounted over them (and put back by stop() all the same); shim
sockets and network namespace handles left on /run are removed.

The images come from `make images` (runs/images/*.tar, complyroute/runtime/kubernetes/images.py), imported into
this containerd at start: no registry is ever asked.

Traffic reaches a pod from the host through the API server (kubectl port-forward), which asks
the kubelet, which asks containerd: the host sends only to its own loopback and to HOST_IP's
peer, in a namespace this module made.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from complyroute.runtime.kubernetes import images
from complyroute.topology.manifest import REPO

if TYPE_CHECKING:
    from .localcluster import LocalCluster

BIN = REPO / "bin"
NAME = "complyroute-node"  # the node's name in the cluster, its network namespace, its cgroup
NETNS = NAME
NETNS_HANDLE = Path("/run/netns") / NETNS
HOST_VETH, NODE_VETH = "crnode-host", "crnode-node"
HOST_IP, NODE_IP, VETH_PREFIX = "10.250.250.1", "10.250.250.2", 30
POD_CIDR = "10.245.0.0/24"  # the bridge's pods (kwok's fake pod addresses are in 10.244.0.0/16)
SERVICE_CIDR = "10.96.0.0/16"  # as the API server's --service-cluster-ip-range
CLUSTER_DNS = NODE_IP  # CoreDNS listens in the node's namespace; pods reach it through the bridge
RUN = Path("/run") / NAME  # containerd's state and socket (a socket path must be short)
SOCKET = RUN / "containerd.sock"
CGROUP = NAME
CGROUP_ROOT = Path("/sys/fs/cgroup")
# The labels an operator puts on a node that carries every role (ONE_NODE_ROLE of
# complyroute/runtime/kubernetes/nodes.py): a one-node rendering selects it, and none of the kwok nodes has it.
ROLE_ALL = "all"
# Kernel settings the kubelet tunes (its kernel tunables, with protectKernelDefaults off): in its
# mount namespace, files of its own stand in for them; the machine's are read before it starts
# and written back when it has stopped all the same.
KUBELET_SYSCTLS = ["vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
                   "kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes"]
DEBIAN_PACKAGES = {"containerd": "containerd", "runc": "runc", "/usr/lib/cni/bridge": "containernetworking-plugins",
                   "iptables": "iptables", "conntrack": "conntrack", "nsenter": "util-linux"}


def run(*command: str, check: bool = True, **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run(list(command), capture_output=True, text=True, **kwargs)
    if check and result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({result.returncode}): {result.stderr.strip() or result.stdout.strip()}")
    return result


def cgroup_hierarchies() -> list[Path]:
    """The cgroup v1 hierarchies mounted under /sys/fs/cgroup (and the v2 one of a hybrid setup)."""
    return sorted(p for p in CGROUP_ROOT.iterdir() if p.is_dir() and (p / "cgroup.procs").exists())


def processes_in(cgroup: Path) -> set[int]:
    found = set()
    for procs in cgroup.rglob("cgroup.procs"):
        try:
            found |= {int(pid) for pid in procs.read_text().split()}
        except OSError:
            pass
    return found


def join_cgroup() -> None:
    """Run in the child before exec: put it in the node's cgroup (its pids hierarchy), so stop()
    finds it and everything it starts (containerd's shims, the containers)."""
    with open(CGROUP_ROOT / "pids" / CGROUP / "cgroup.procs", "w") as procs:
        procs.write(str(os.getpid()))


class RealNode:
    def __init__(self, cluster: LocalCluster):
        self.cluster = cluster
        self.dir = cluster.workdir / "node"
        self.holder: subprocess.Popen | None = None
        self.sysctls: dict[str, str] = {}
        self.run_before: dict[str, set[str]] | None = None  # what /run held before make_namespaces
        self.names: list[str] = []  # its processes in cluster.processes

    # ---- before anything starts
    def check(self) -> None:
        if os.geteuid() != 0:
            raise RuntimeError("a real node needs root (network and mount namespaces, cgroups, containerd)")
        missing = [f"{what} ({package})" for what, package in DEBIAN_PACKAGES.items() if not (shutil.which(what) or Path(what).exists())]
        missing += [f"{BIN / name} (make k8s-setup)" for name in ("kubelet", "kube-proxy", "coredns") if not (BIN / name).exists()]
        if missing:
            raise RuntimeError(f"a real node needs {', '.join(missing)}: run make k8s-setup")
        absent = [kind for kind in images.IMAGES if not images.archive(kind).exists()]
        if absent:
            raise RuntimeError(f"no image archive for {', '.join(absent)} in {images.IMAGES_DIR}: run make images")
        clear_leftovers()

    def make_namespaces(self) -> None:
        """The node's network namespace and veth; its cgroup in every hierarchy."""
        self.dir.mkdir(parents=True, exist_ok=True)
        self.run_before = {folder: set(os.listdir(folder)) if os.path.isdir(folder) else set()
                           for folder in ("/run/netns", "/run/containerd/s", "/run/containerd/runc/k8s.io")}
        self.run_before["/run/containerd-existed"] = os.path.isdir("/run/containerd")  # type: ignore[assignment]
        run("ip", "netns", "add", NETNS)
        run("ip", "link", "add", HOST_VETH, "type", "veth", "peer", "name", NODE_VETH)
        run("ip", "link", "set", NODE_VETH, "netns", NETNS)
        run("ip", "addr", "add", f"{HOST_IP}/{VETH_PREFIX}", "dev", HOST_VETH)
        run("ip", "link", "set", HOST_VETH, "up")
        inside = ["ip", "netns", "exec", NETNS]
        run(*inside, "ip", "addr", "add", f"{NODE_IP}/{VETH_PREFIX}", "dev", NODE_VETH)
        run(*inside, "ip", "link", "set", NODE_VETH, "up")
        run(*inside, "ip", "link", "set", "lo", "up")
        run(*inside, "ip", "route", "add", "default", "via", HOST_IP)
        # Per network namespace: bridged pod traffic through iptables (kube-proxy's Service
        # rules), forwarding between the pods' veths.
        for setting in ("net.bridge.bridge-nf-call-iptables=1", "net.ipv4.ip_forward=1", "net.ipv4.conf.all.route_localnet=1"):
            run(*inside, "sysctl", "-q", "-w", setting)
        for hierarchy in cgroup_hierarchies():
            node = hierarchy / CGROUP
            node.mkdir(exist_ok=True)
            if hierarchy.name == "cpuset":  # a cpuset cgroup admits processes once given cpus and memory nodes
                for setting in ("cpuset.cpus", "cpuset.mems"):
                    (node / setting).write_text((hierarchy / setting).read_text())

    # ---- start
    def inside(self, name: str, command: list[str]) -> None:
        """Start a part of the node in its network and mount namespaces and its cgroup."""
        assert self.holder is not None
        self.cluster.start_process(name, ["nsenter", f"--target={self.holder.pid}", "--mount", "--net", "--", *command],
                                   preexec_fn=join_cgroup)
        self.names.append(name)

    def start(self) -> None:
        self.sysctls = {key: Path("/proc/sys", key).read_text().strip() for key in KUBELET_SYSCTLS}
        for folder in ("containerd", "kubelet", "cni/net.d", "cni/ipam", "pod-logs"):
            (self.dir / folder).mkdir(parents=True, exist_ok=True)
        RUN.mkdir(parents=True, exist_ok=True)
        self.write_configuration()
        # The mount namespace's holder: slave, so the host's mounts still show inside and none
        # made inside shows on the host.
        self.holder = self.cluster.start_process(
            "node-namespaces", ["unshare", "--mount", "--propagation", "slave", "nsenter", f"--net={NETNS_HANDLE}", "sleep", "infinity"],
            preexec_fn=join_cgroup)
        self.names.append("node-namespaces")
        deadline = time.monotonic() + 10
        while Path(f"/proc/{self.holder.pid}/ns/mnt").resolve() == Path("/proc/self/ns/mnt").resolve() or \
                os.readlink(f"/proc/{self.holder.pid}/ns/net") == os.readlink("/proc/self/ns/net"):
            if time.monotonic() > deadline:
                raise RuntimeError("the real node's namespaces did not come up")
            time.sleep(0.05)

        # The kubelet tunes a few kernel settings of the whole machine (overcommit, panic on
        # oops...). In its mount namespace each is a file of the node's folder, bind-mounted over
        # the setting: the kubelet reads and writes that, the machine keeps its own.
        for key in KUBELET_SYSCTLS:
            stand_in = self.dir / "sysctl" / key.replace("/", ".")
            stand_in.parent.mkdir(exist_ok=True)
            stand_in.write_text(self.sysctls[key] + "\n")
            run("nsenter", f"--target={self.holder.pid}", "--mount", "--", "mount", "--bind", str(stand_in), f"/proc/sys/{key}")
        self.inside("containerd", ["containerd", "--config", str(self.dir / "containerd.toml")])
        self.cluster.wait_for("containerd", lambda: self.ctr("version", check=False).returncode == 0, timeout=60)
        self.import_images()
        self.inside("kubelet", [str(BIN / "kubelet"), f"--config={self.dir / 'kubelet.yaml'}", f"--kubeconfig={self.cluster.kubeconfig}",
                                f"--root-dir={self.dir / 'kubelet'}", f"--hostname-override={NAME}", f"--node-ip={NODE_IP}",
                                f"--node-labels=complyroute.io/node={NAME},complyroute.io/role={ROLE_ALL},type=real", "--v=1"])
        self.inside("kube-proxy", [str(BIN / "kube-proxy"), f"--config={self.dir / 'kube-proxy.yaml'}", "--v=1"])
        self.inside("coredns", [str(BIN / "coredns"), "-conf", str(self.dir / "Corefile")])
        self.cluster.wait_for(f"node {NAME}", self.ready, timeout=180)

    def ready(self) -> bool:
        found = self.cluster.kubectl("get", "node", NAME, "-o", "json", quiet=True, check=False)
        if found.returncode != 0:
            return False
        return any(c["type"] == "Ready" and c["status"] == "True" for c in json.loads(found.stdout)["status"].get("conditions", []))

    def unprogrammed(self, namespace: str, service_ports: set[str]) -> set[str]:
        """Of `service_ports` ("<service>:<port name>" of `namespace`), those kube-proxy has not
        yet sent to an endpoint: no "<namespace>/<service>:<port> cluster IP" rule in the node's
        nat table (iptables mode; pkg/proxy/iptables/proxier.go). Until it writes one, a
        connection to the Service's address is refused (its "has no endpoints" REJECT) or lost,
        whatever the pods' readiness says."""
        nat = run("ip", "netns", "exec", NETNS, "iptables-save", "-t", "nat").stdout
        programmed = {port for port in service_ports if f'"{namespace}/{port} cluster IP"' in nat}
        return service_ports - programmed

    def ctr(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return run("ctr", f"--address={SOCKET}", "--namespace=k8s.io", *args, check=check)

    def import_images(self) -> None:
        """Every archive `make images` built, into this containerd (the kubelet's namespace k8s.io)."""
        for kind in images.IMAGES:
            self.ctr("images", "import", str(images.archive(kind)))
        present = self.ctr("images", "list", "--quiet").stdout.split()
        missing = [image for image in images.IMAGES.values() if images.reference(image) not in present]
        if missing:
            raise RuntimeError(f"containerd holds no {', '.join(missing)} after importing {images.IMAGES_DIR}: run make images again")

    def write_configuration(self) -> None:
        d = self.dir
        (d / "containerd.toml").write_text(f'''version = 2
root = "{d / 'containerd'}"
state = "{RUN / 'state'}"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.aufs",
                    "io.containerd.snapshotter.v1.devmapper", "io.containerd.internal.v1.tracing", "io.containerd.tracing.processor.v1.otlp"]
[grpc]
  address = "{SOCKET}"
[plugins."io.containerd.internal.v1.opt"]
  path = "{d / 'containerd' / 'opt'}"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{images.reference(images.IMAGES['pause'])}"
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  # No process here may lower its OOM score (this machine grants no CAP_SYS_RESOURCE), and the
  # kubelet asks -998 for every sandbox: containerd keeps it at its own score instead.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        BinaryName = "{shutil.which('runc') or '/usr/sbin/runc'}"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{d / 'cni' / 'net.d'}"
''')
        (d / "cni" / "net.d" / "10-complyroute.conflist").write_text(json.dumps({
            "cniVersion": "0.4.0", "name": "complyroute-pods",
            "plugins": [
                {"type": "bridge", "bridge": "cni0", "isGateway": True, "ipMasq": True, "hairpinMode": True,
                 "ipam": {"type": "host-local", "ranges": [[{"subnet": POD_CIDR}]], "routes": [{"dst": "0.0.0.0/0"}],
                          "dataDir": str(d / "cni" / "ipam")}},
                {"type": "portmap", "capabilities": {"portMappings": True}},
            ],
        }, indent=2))
        (d / "resolv.conf").write_text("# the pods' resolver: CoreDNS (clusterDNS); nothing outside the cluster is resolved\n")
        (d / "kubelet.yaml").write_text(yaml.safe_dump({
            "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
            "address": NODE_IP, "port": 10250, "readOnlyPort": 0, "healthzBindAddress": "127.0.0.1", "healthzPort": 10248,
            # Only the API server (on the host's end of the veth) reaches the kubelet's port.
            "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}, "x509": {}},
            "authorization": {"mode": "AlwaysAllow"},
            "containerRuntimeEndpoint": f"unix://{SOCKET}",
            "cgroupDriver": "cgroupfs", "cgroupRoot": f"/{CGROUP}", "cgroupsPerQOS": True,
            # This machine mounts cgroup v1 (a hybrid layout); Kubernetes 1.34 still runs on it.
            "failCgroupV1": False, "failSwapOn": False,
            "clusterDNS": [CLUSTER_DNS], "clusterDomain": "cluster.local", "resolvConf": str(d / "resolv.conf"),
            "podLogsDir": str(d / "pod-logs"),
            # ConfigMap updates (make reload-policy target=k8s) reach the pods within seconds.
            "syncFrequency": "10s", "configMapAndSecretChangeDetectionStrategy": "Watch",
            # The images are imported, never pulled: never collect them.
            "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
            "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%", "nodefs.inodesFree": "1%"},
            "serializeImagePulls": False, "maxPods": 250,
        }, sort_keys=False))
        (d / "kube-proxy.yaml").write_text(yaml.safe_dump({
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1", "kind": "KubeProxyConfiguration",
            "clientConnection": {"kubeconfig": str(self.cluster.kubeconfig)},
            "mode": "iptables", "clusterCIDR": POD_CIDR, "oomScoreAdj": 0, "hostnameOverride": NAME, "bindAddress": NODE_IP,
            "metricsBindAddress": "127.0.0.1:10249", "healthzBindAddress": "127.0.0.1:10256",
            # Leave the machine's conntrack table size and timeouts as they are.
            "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
        }, sort_keys=False))
        (d / "Corefile").write_text(f""".:53 {{
    errors
    kubernetes cluster.local in-addr.arpa ip6.arpa {{
        kubeconfig {self.cluster.kubeconfig}
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }}
    cache 5
}}
""")

    # ---- stop
    def stop(self) -> None:
        """End every process of the node and everything it started, then remove its namespaces,
        cgroup and leftovers on /run; put back the kernel settings the kubelet changed."""
        processes = self.cluster.processes
        for name in ("coredns", "kube-proxy", "kubelet", "containerd"):
            process = processes.get(name)
            if process and process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
        kill_processes()
        for name in self.names:
            process = processes.pop(name, None)
            if process and process.poll() is None:
                process.kill()
            if process:
                process.wait()
        self.names.clear()
        remove_cgroup()
        remove_leftovers(self.run_before)
        self.run_before = None
        for key, value in self.sysctls.items():
            Path("/proc/sys", key).write_text(value)
        self.sysctls.clear()


def running() -> bool:
    """A real node runs: a process lives in its cgroup (every part of it starts there). What a
    killed run left (its cgroup, namespace, containerd's socket) holds none."""
    root = CGROUP_ROOT / "pids" / CGROUP
    return root.exists() and bool(processes_in(root))


def clear_leftovers() -> None:
    """Before a real node starts: refuse if another one runs; remove what a killed one left
    (a test process killed mid-run never reaches stop()), which would otherwise fail this start
    and every later one."""
    if running():
        raise RuntimeError(f"another local cluster's real node runs (processes in cgroup {CGROUP}): stop it first")
    left = [str(path) for path in (NETNS_HANDLE, CGROUP_ROOT / "pids" / CGROUP, RUN) if path.exists()]
    if left:
        print(f"real node: removing what a killed one left: {', '.join(left)}")
        clean()


def kill_processes(timeout: float = 30) -> None:
    """SIGKILL every process in the node's cgroup until none is left."""
    root = CGROUP_ROOT / "pids" / CGROUP
    deadline = time.monotonic() + timeout
    while root.exists() and (pids := processes_in(root)) and time.monotonic() < deadline:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.2)


def remove_cgroup() -> None:
    """The node's cgroup, deepest first, from every hierarchy."""
    for hierarchy in cgroup_hierarchies():
        node = hierarchy / CGROUP
        if not node.exists():
            continue
        for folder in sorted((p for p in node.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True) + [node]:
            for _ in range(50):
                try:
                    folder.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:  # a process is still being reaped
                    time.sleep(0.1)


def remove_leftovers(before: dict[str, set[str]] | None = None) -> None:
    """The node's network namespace (and with it its bridge, veths and iptables rules); the pod
    network namespace handles and shim sockets it left on /run; its containerd's /run folder;
    pod log links the kubelet made in /var/log/containers."""
    if NETNS_HANDLE.exists():
        run("ip", "netns", "delete", NETNS, check=False)
    run("ip", "link", "delete", HOST_VETH, check=False)
    # Without a record of what was there before (clean(), or a start that failed first), only
    # pod namespace handles no namespace is mounted on any more: another containerd on the
    # machine may own the rest.
    folders = ((("/run/netns", "cni-"), ("/run/containerd/s", ""), ("/run/containerd/runc/k8s.io", ""))
               if before is not None else (("/run/netns", "cni-"),))
    for folder, prefix in folders:
        if not os.path.isdir(folder):
            continue
        for name in set(os.listdir(folder)) - (before or {}).get(folder, set()):
            path = Path(folder, name)
            if not name.startswith(prefix) or (before is None and os.path.ismount(path)):
                continue
            run("umount", "--lazy", str(path), check=False)
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)  # runc's state of a container
            else:
                path.unlink(missing_ok=True)
    shutil.rmtree(RUN, ignore_errors=True)
    # The folders the shims and runc made under /run/containerd when there was none before
    # (and no other containerd has made its socket there since).
    if before is not None and not before.get("/run/containerd-existed", True) and not Path("/run/containerd/containerd.sock").exists():
        shutil.rmtree("/run/containerd", ignore_errors=True)
    logs = Path("/var/log/containers")
    if logs.is_dir():
        for link in logs.iterdir():
            if link.is_symlink() and str(REPO) in os.readlink(link):
                link.unlink(missing_ok=True)


def clean() -> None:
    """Remove what a real node that was not stopped (its test process killed) left behind."""
    kill_processes()
    remove_cgroup()
    remove_leftovers()


if __name__ == "__main__":
    import sys

    if sys.argv[1:] == ["clean"]:
        clean()
    else:
        sys.exit("usage: python -m tests.k8s.harness.realnode clean")
