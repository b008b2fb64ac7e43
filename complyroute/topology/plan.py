"""What a topology's placement produces: the enforcement points and service processes to start.

Each topology folder (sidecar/, ...) has a placement.py with `place(topology, net) -> Plan`;
the rest of the control plane (rendering, starting, health checks) is shared. `net` gives
every part its addresses: LocalNetwork here (loopback addresses, port blocks), the
Kubernetes network in complyroute/runtime/kubernetes/render.py (Service names, fixed pod ports).
"""

from __future__ import annotations

import importlib.util
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from complyroute.topology import localhttp
from complyroute.topology.manifest import PLACEMENT, Instance, Node, Topology

READY_PATH = "/ready"


@dataclass(frozen=True)
class Endpoint:
    """Where a part listens (`address`) and the name others reach it by (`host`), or the unix
    domain socket it listens on (`path`).

    On one machine the two are the same loopback address; on Kubernetes a part binds 0.0.0.0
    (or 127.0.0.1 inside its pod) and is reached by its Service's DNS name. What only a point's
    own processes may reach (Envoy's admin, OPA's decision port and REST API) is a socket in a
    folder that only they can open (`unix`), on either.
    """

    address: str
    port: int
    host: str = ""
    path: str = ""

    @classmethod
    def unix(cls, path: str | Path) -> Endpoint:
        return cls("", 0, path=str(path))

    @property
    def reach(self) -> str:
        return self.host or self.address

    @property
    def url(self) -> str:
        return localhttp.url(self.path) if self.path else f"http://{self.reach}:{self.port}"

    @property
    def listen(self) -> str:
        """The address as OPA's flags and its plugin's `addr` take it."""
        return f"unix://{self.path}" if self.path else f"{self.address}:{self.port}"


@dataclass(frozen=True)
class DecidingListener:
    name: str
    endpoint: Endpoint
    sender: str  # the instance or gateway the records come from, as the catalog names it
    step: str | None = None  # pinned target step; None: taken from the sender's x-complyroute-step header
    # Records come from outside (a client), not from a service: the body is unchecked until
    # this point's decision, so every engine asks OPA here.
    from_client: bool = False


@dataclass(frozen=True)
class ForwardingListener:
    name: str
    endpoint: Endpoint
    upstream: Endpoint


# What an enforcement point is to the rest of the house, set by the placement that makes it: the
# Kubernetes rendering, for one, runs each role as its own kind of workload (runtime/kubernetes/render.py).
ROLES = (
    "entry",  # on the gateway node, where clients send records: decides (or just forwards) the first hop
    "central",  # the entry and also the only way from one service to the next (central entity)
    "sidecar",  # beside one service instance, in its pod: decides the hops out of it
    "router",  # on a service node, shared by some of its services: decides the hops out of them
)


@dataclass
class EnforcementPoint:
    name: str
    node: str
    # Sockets in the point's private folder (Endpoint.unix; `private`), which only its own
    # processes open: Envoy's admin interface (for the control plane: reload, make bench), the
    # ext_authz server Envoy asks, and OPA's REST API (read-only: policies/system/authz).
    admin: Endpoint
    ready: Endpoint  # Envoy's readiness listener: GET /ready, its health check, and nothing else
    opa_grpc: Endpoint
    opa_http: Endpoint
    # OPA's --diagnostic-addr: /health?plugins is its health check, /metrics. A socket in the
    # private folder too, but on Kubernetes, where the kubelet probes it over TCP.
    opa_diagnostic: Endpoint
    concurrency: int = 1
    role: str = ""  # one of ROLES, which the placement gives (net.point); __post_init__ refuses any other
    # The points that run as one workload and are reached under one name: a sidecar's group is its
    # service instance's id (it runs in that pod); routers of one slot on every node share one group
    # (one DaemonSet); any other point is a group of its own, named as the point.
    group: str = ""
    deciding: list[DecidingListener] = field(default_factory=list)
    forwarding: list[ForwardingListener] = field(default_factory=list)
    destinations: dict[str, Endpoint] = field(default_factory=dict)  # instance id -> where it is reached
    # The destinations are reached through other points' forwarding listeners (a sidecar's ingress),
    # not at the services themselves: such a listener tells a record it could not deliver to its
    # own service (proxy/replies.py UNDELIVERED_HEADER), so this point sends it to another
    # instance of the set; a service itself could claim as much, so no other point believes it.
    destinations_behind_ingress: bool = False
    catalog: dict = field(default_factory=dict)  # the catalog slice it decides with (its OPA loads it indexed: policydata)
    # Where its Envoy writes a JSON line per request (proxy/accesslog.py): a file of the run's
    # logs locally (LocalNetwork), the container's output on Kubernetes.
    access_log: str = "/dev/stdout"
    # Its metrics listener (proxy/metrics.py): GET /metrics (Envoy's statistics) and /metrics/opa
    # (its OPA's), for the scraper only (the monitoring identity under mutual TLS); None: none.
    metrics: Endpoint | None = None

    def __post_init__(self):
        if self.role not in ROLES:
            raise ValueError(f"enforcement point {self.name}: role {self.role!r} is not one of {list(ROLES)}")
        self.group = self.group or self.name

    @property
    def private(self) -> set[str]:
        """The folders of the point's sockets: only its own processes may open them."""
        endpoints = (self.admin, self.opa_grpc, self.opa_http, self.opa_diagnostic)
        return {str(Path(endpoint.path).parent) for endpoint in endpoints if endpoint.path}

    @property
    def opa_health_url(self) -> str:
        return f"{self.opa_diagnostic.url}/health?plugins"

    @property
    def opa_metrics_url(self) -> str:
        return f"{self.opa_diagnostic.url}/metrics"

    @property
    def envoy_ready_url(self) -> str:
        return f"{self.ready.url}{READY_PATH}"


GATEWAY_SENDER = "gateway"
METRICS_LISTENER = "metrics"  # the name of a point's metrics listener (EnforcementPoint.metrics)
# The sockets in a point's private folder, wherever it runs (runtime/kubernetes/render.py too).
ADMIN_SOCKET, DECISION_SOCKET, API_SOCKET, DIAGNOSTIC_SOCKET = "envoy-admin.sock", "opa-decision.sock", "opa-api.sock", "opa-diagnostic.sock"


LOOPBACK_VARIABLE = "COMPLYROUTE_LOOPBACK"
ACCESS_LOG_SUFFIX = ".access.log"  # a point's access log in a local run's logs/ (trace reads them)


class LocalNetwork:
    """Addresses on one machine: each node its loopback address, each part a port of a block.

    A part's number inside its block is its instance's (or point's) index, so the same index
    shows in every port of one part. 999 parts per block is far above the 50 run.

    `loopback`: the network (three bytes, e.g. "127.0.9") every address of the plan is on
    instead, each node keeping its last byte, the entry on <loopback>.254:8080. A plan on a
    loopback network of its own takes the same ports as a deployment running beside it
    without a clash (the engines' differential test runs beside the end-to-end suite so).
    Without `loopback`, the network COMPLYROUTE_LOOPBACK names, if set: a local deployment
    beside another one takes it (runtime/local/deployment.py).
    """

    SERVICE, INGRESS, EGRESS, ENVOY_READY, METRICS = 20000, 21000, 22000, 27000, 28000
    BUNDLE_SERVER = 29000
    ENTRY_PORT = 8080

    def __init__(self, private: Path | None = None, loopback: str | None = None, logs: Path | None = None):
        # Where each point's private folder goes (<private>/<point>/, mode 0700, made by the
        # deployment): a short path of its own, since a unix socket's path has at most 107
        # bytes. A plan that is only rendered, never started, names the default.
        self.private = private or Path(tempfile.gettempdir()) / "complyroute"
        # Where each point's Envoy writes its access log (<logs>/<point>.access.log); None: its output.
        self.logs = logs
        loopback = loopback if loopback is not None else os.environ.get(LOOPBACK_VARIABLE) or None
        if loopback is not None and not (loopback.startswith("127.") and loopback.count(".") == 2):
            raise ValueError(f"loopback {loopback!r} is not a loopback network's first three bytes (127.x.y)")
        self.loopback = loopback

    def address(self, node: Node) -> str:
        """Where the node's parts listen: its loopback address, or its last byte on `loopback`."""
        return node.address if self.loopback is None else f"{self.loopback}.{node.address.rsplit('.', 1)[1]}"

    def entry(self, point_name: str) -> Endpoint:
        return Endpoint("127.0.0.1" if self.loopback is None else f"{self.loopback}.254", self.ENTRY_PORT)

    def point(self, name: str, node: Node, index: int, role: str, group: str = "", concurrency: int = 1) -> EnforcementPoint:
        folder = self.private / name
        return EnforcementPoint(
            name=name,
            node=node.name,
            role=role,
            group=group,
            # What only the point's own processes use listens on no port: sockets in its folder,
            # which no other user can open (EnforcementPoint, above). Its readiness
            # listener is on the node's loopback address.
            admin=Endpoint.unix(folder / ADMIN_SOCKET),
            ready=Endpoint(self.address(node), self.ENVOY_READY + index),
            opa_grpc=Endpoint.unix(folder / DECISION_SOCKET),
            opa_http=Endpoint.unix(folder / API_SOCKET),
            opa_diagnostic=Endpoint.unix(folder / DIAGNOSTIC_SOCKET),
            metrics=Endpoint(self.address(node), self.METRICS + index),
            concurrency=concurrency,
            **({"access_log": str(self.logs / f"{name}{ACCESS_LOG_SUFFIX}")} if self.logs else {}),
        )

    def service(self, instance: Instance, beside: bool = False) -> Endpoint:
        """Where an instance's service listens; `beside`: as seen from its own sidecar."""
        return Endpoint(self.address(instance.node), self.SERVICE + instance.index)

    def ingress(self, instance: Instance) -> Endpoint:
        """A sidecar's listener that hands records to its own service."""
        return Endpoint(self.address(instance.node), self.INGRESS + instance.index)

    def egress(self, instance: Instance) -> Endpoint:
        """A sidecar's listener where its own service sends records on."""
        return Endpoint(self.address(instance.node), self.EGRESS + instance.index)

    def hop(self, point: EnforcementPoint, instance: Instance) -> Endpoint:
        """The listener of a shared point (central entity, router) for one sending instance."""
        return Endpoint(point.ready.address, self.EGRESS + instance.index)

    def bundle_server(self, gateway: Node) -> Endpoint:
        """Where the control plane serves the points' OPAs their bundles (bundleserver.py)."""
        return Endpoint(self.address(gateway), self.BUNDLE_SERVER)


@dataclass(frozen=True)
class ServiceProcess:
    instance: Instance
    endpoint: Endpoint
    next_step: str | None
    egress_url: str | None  # None at the last step

    @property
    def health_url(self) -> str:
        return f"{self.endpoint.url}/health"

    def environment(self, workload: dict, audit_log: str, labels: dict[str, str]) -> dict[str, str]:
        """The service's configuration (services/config.js reads it), for any way of running it.
        `labels`: the variable telling it the rule set's labels (labels.service_setting): the
        setting itself, COMPLYROUTE_LABELS, or a file holding it, COMPLYROUTE_LABELS_FILE, which
        the service reads again on SIGHUP (a local deployment's reload adds labels so)."""
        instance = self.instance
        return {
            "INSTANCE_ID": instance.id,
            "STEP": instance.step,
            "REGION": instance.region,
            "NODE": instance.node.name,
            "CERTIFICATIONS": ",".join(instance.certifications),
            "PURPOSES": ",".join(instance.purposes),
            "NEXT_STEP": self.next_step or "",
            "EGRESS_URL": self.egress_url or "",
            "HOST": self.endpoint.address,
            "PORT": str(self.endpoint.port),
            "AUDIT_LOG": audit_log,
            **labels,
            # Unset in the manifest: the service's own default (services/config.js), defined there only.
            **({"WORK_ITERATIONS": str(workload["work_iterations"])} if "work_iterations" in workload else {}),
        }


@dataclass
class Plan:
    topology: Topology
    entry: Endpoint  # where clients send records
    points: list[EnforcementPoint]
    services: list[ServiceProcess]

    @property
    def enforces(self) -> bool:
        """Whether any point decides a hop; one that decides none (the baseline) lets every record through."""
        return any(point.deciding for point in self.points)


def catalog(topology: Topology, instances: list[Instance], gateway: bool = False) -> dict:
    """The slice of the service catalog one enforcement point holds."""
    data = {"instances": {i.id: i.catalog_entry() for i in instances}, "gateways": {}}
    if gateway:
        data["gateways"][GATEWAY_SENDER] = {"region": topology.gateway_region, "node": topology.gateway.name}
    return data


def deciding_entry(topology: Topology, net, name: str, reach: Callable[[Instance], Endpoint], role: str = "entry") -> EnforcementPoint:
    """The enforcement point on the gateway node that decides the first hop of every record.

    `reach` says where an instance of the first step receives records in this topology; `role`
    is "central" where this point decides every later hop too.
    """
    first = topology.steps[0]
    entry = net.point(name, topology.gateway, 0, role, concurrency=int(topology.engine.get("gateway_concurrency", 2)))
    entry.deciding.append(DecidingListener("entry", net.entry(name), sender=GATEWAY_SENDER, step=first, from_client=True))
    entry.destinations = {i.id: reach(i) for i in topology.instances_of(first)}
    entry.catalog = catalog(topology, topology.instances_of(first), gateway=True)
    return entry


def place(topology: Topology, net=None) -> Plan:
    """Run the placement of the manifest's topology (the topology folder's placement.py)."""
    path = topology.folder / PLACEMENT
    spec = importlib.util.spec_from_file_location(f"complyroute_placement_{topology.kind}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.place(topology, net or LocalNetwork())
