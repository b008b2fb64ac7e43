"""What a topology's placement produces: the enforcement points and service processes to start.

Each topology folder (sidecar/, ...) has a placement.py with `place(topology, net) -> Plan`;
the rest of the control plane (rendering, starting, health checks) is shared. `net` gives
every part its addresses: LocalNetwork here (loopback addresses, port blocks), the
Kubernetes network in complyroute/kubernetes/render.py (Service names, fixed pod ports).
"""

from __future__ import annotations

import importlib.util
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from complyroute.proxy.envoy import DecidingListener, EnforcementPoint, Endpoint
from complyroute.topology.manifest import PLACEMENT, Instance, Node, Topology

GATEWAY_SENDER = "gateway"
# The sockets in a point's private folder, wherever it runs (kubernetes/render.py too).
ADMIN_SOCKET, DECISION_SOCKET, API_SOCKET, DIAGNOSTIC_SOCKET = "envoy-admin.sock", "opa-decision.sock", "opa-api.sock", "opa-diagnostic.sock"


class LocalNetwork:
    """Addresses on one machine: each node its loopback address, each part a port of a block.

    A part's number inside its block is its instance's (or point's) index, so the same index
    shows in every port of one part. 999 parts per block is far above the 50 run.
    """

    SERVICE, INGRESS, EGRESS, ENVOY_READY = 20000, 21000, 22000, 27000
    BUNDLE_SERVER = 29000

    def __init__(self, private: Path | None = None):
        # Where each point's private folder goes (<private>/<point>/, mode 0700, made by the
        # deployment): a short path of its own, since a unix socket's path has at most 107
        # bytes. A plan that is only rendered, never started, names the default.
        self.private = private or Path(tempfile.gettempdir()) / "complyroute"

    def entry(self, point_name: str) -> Endpoint:
        return Endpoint("127.0.0.1", 8080)

    def point(self, name: str, node: Node, index: int, role: str, group: str = "", concurrency: int = 1) -> EnforcementPoint:
        folder = self.private / name
        return EnforcementPoint(
            name=name,
            node=node.name,
            role=role,
            group=group,
            # What only the point's own processes use listens on no port: sockets in its folder,
            # which no other user can open (enforcement.EnforcementPoint). Its readiness
            # listener is on the node's loopback address.
            admin=Endpoint.unix(folder / ADMIN_SOCKET),
            ready=Endpoint(node.address, self.ENVOY_READY + index),
            opa_grpc=Endpoint.unix(folder / DECISION_SOCKET),
            opa_http=Endpoint.unix(folder / API_SOCKET),
            opa_diagnostic=Endpoint.unix(folder / DIAGNOSTIC_SOCKET),
            concurrency=concurrency,
        )

    def service(self, instance: Instance, beside: bool = False) -> Endpoint:
        """Where an instance's service listens; `beside`: as seen from its own sidecar."""
        return Endpoint(instance.node.address, self.SERVICE + instance.index)

    def ingress(self, instance: Instance) -> Endpoint:
        """A sidecar's listener that hands records to its own service."""
        return Endpoint(instance.node.address, self.INGRESS + instance.index)

    def egress(self, instance: Instance) -> Endpoint:
        """A sidecar's listener where its own service sends records on."""
        return Endpoint(instance.node.address, self.EGRESS + instance.index)

    def hop(self, point: EnforcementPoint, instance: Instance) -> Endpoint:
        """The listener of a shared point (central entity, router) for one sending instance."""
        return Endpoint(point.ready.address, self.EGRESS + instance.index)

    def bundle_server(self, gateway: Node) -> Endpoint:
        """Where the control plane serves the points' OPAs their bundles (bundleserver.py)."""
        return Endpoint(gateway.address, self.BUNDLE_SERVER)


@dataclass(frozen=True)
class ServiceProcess:
    instance: Instance
    endpoint: Endpoint
    next_step: str | None
    egress_url: str | None  # None at the last step

    @property
    def health_url(self) -> str:
        return f"{self.endpoint.url}/health"

    def environment(self, workload: dict, audit_log: str, labels: str) -> dict[str, str]:
        """The service's configuration (services/config.js reads it), for any way of running it.
        `labels`: the rule set's labels as services take them (labels.service_setting)."""
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
            "COMPLYROUTE_LABELS": labels,
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
