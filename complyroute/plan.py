"""What a topology's placement produces: the enforcement points and service processes to start.

Each topology folder (sidecar/, ...) has a placement.py with `place(topology) -> Plan`; the
rest of the control plane (rendering, starting, health checks) is shared.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

from collections.abc import Callable

from .enforcement import DecidingListener, EnforcementPoint, Endpoint
from .manifest import REPO, Instance, Topology

ENTRY = Endpoint("127.0.0.1", 8080)
GATEWAY_SENDER = "gateway"

# Port blocks; a part's number inside its block is the instance's (or point's) index, so the
# same index shows in every port of one part. 999 parts per block is far above the 50 run.
SERVICE_PORTS = 20000
INGRESS_PORTS = 21000
EGRESS_PORTS = 22000
OPA_GRPC_PORTS = 23000
OPA_HTTP_PORTS = 24000
ENVOY_ADMIN_PORTS = 25000

# Where each topology's placement lives.
TOPOLOGY_FOLDERS = {
    "sidecar": "sidecar",
    "central-entity": "central-entity",
    "dynamic-router": "dynamic-router",
    "baseline": "baseline",
}


@dataclass(frozen=True)
class ServiceProcess:
    instance: Instance
    endpoint: Endpoint
    next_step: str | None
    egress_url: str | None  # None at the last step

    @property
    def health_url(self) -> str:
        return f"{self.endpoint.url}/health"


@dataclass
class Plan:
    topology: Topology
    entry: Endpoint
    points: list[EnforcementPoint]
    services: list[ServiceProcess]


def enforcement_point(name: str, node, index: int, concurrency: int = 1) -> EnforcementPoint:
    """An enforcement point with the admin and OPA ports of its index, on its node's address."""
    return EnforcementPoint(
        name=name,
        node=node.name,
        address=node.address,
        admin_port=ENVOY_ADMIN_PORTS + index,
        opa_grpc_port=OPA_GRPC_PORTS + index,
        opa_http_port=OPA_HTTP_PORTS + index,
        concurrency=concurrency,
    )


def catalog(topology: Topology, instances: list[Instance], gateway: bool = False) -> dict:
    """The slice of the service catalog one enforcement point holds."""
    data = {"instances": {i.id: i.catalog_entry() for i in instances}, "gateways": {}}
    if gateway:
        data["gateways"][GATEWAY_SENDER] = {"region": topology.gateway_region, "node": topology.gateway.name}
    return data


def service_endpoint(instance: Instance) -> Endpoint:
    return Endpoint(instance.node.address, SERVICE_PORTS + instance.index)


def deciding_entry(topology: Topology, name: str, reach: Callable[[Instance], Endpoint]) -> EnforcementPoint:
    """The enforcement point on the gateway node that decides the first hop of every record.

    `reach` says where an instance of the first step receives records in this topology.
    """
    first = topology.steps[0]
    entry = enforcement_point(name, topology.gateway, 0, concurrency=int(topology.engine.get("gateway_concurrency", 2)))
    entry.deciding.append(DecidingListener("entry", ENTRY, sender=GATEWAY_SENDER, step=first))
    entry.destinations = {i.id: reach(i) for i in topology.instances_of(first)}
    entry.catalog = catalog(topology, topology.instances_of(first), gateway=True)
    return entry


def egress_endpoint(address: str, instance: Instance) -> Endpoint:
    """Where an instance sends its record on: a listener of the point deciding its hops."""
    return Endpoint(address, EGRESS_PORTS + instance.index)


def place(topology: Topology) -> Plan:
    """Run the placement of the manifest's topology (the topology folder's placement.py)."""
    path = REPO / TOPOLOGY_FOLDERS[topology.kind] / "placement.py"
    spec = importlib.util.spec_from_file_location(f"complyroute_placement_{topology.kind}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.place(topology)
