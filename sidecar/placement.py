"""Sidecar topology (SA): one enforcement point beside every service instance.

Each instance's sidecar has an ingress listener that proxies to its own service, and an
egress listener where the service sends the record on. The egress asks the sidecar's OPA
which instance of the next step may receive it, so the hop is decided before the record
leaves the instance. The entry on the gateway node decides the first hop the same way.
"""

from complyroute.enforcement import DecidingListener, Endpoint, ForwardingListener
from complyroute.plan import (
    EGRESS_PORTS,
    ENTRY,
    GATEWAY_SENDER,
    INGRESS_PORTS,
    Plan,
    ServiceProcess,
    catalog,
    enforcement_point,
    service_endpoint,
)


def ingress(instance) -> Endpoint:
    return Endpoint(instance.node.address, INGRESS_PORTS + instance.index)


def place(topology) -> Plan:
    first = topology.steps[0]
    entry = enforcement_point("entry", topology.gateway, 0, concurrency=int(topology.engine.get("entry_concurrency", 2)))
    entry.deciding.append(DecidingListener("entry", ENTRY, sender=GATEWAY_SENDER, step=first))
    entry.destinations = {i.id: ingress(i) for i in topology.instances_of(first)}
    entry.catalog = catalog(topology, topology.instances_of(first), gateway=True)
    points = [entry]

    services = []
    for instance in topology.instances:
        sidecar = enforcement_point(f"sidecar-{instance.id}", instance.node, instance.index)
        sidecar.forwarding.append(ForwardingListener("ingress", ingress(instance), service_endpoint(instance)))
        next_step = topology.next_step(instance.step)
        egress = None
        if next_step:
            candidates = topology.instances_of(next_step)
            egress = Endpoint(instance.node.address, EGRESS_PORTS + instance.index)
            # The sidecar pins the next step: a service cannot send its record to another step.
            sidecar.deciding.append(DecidingListener("egress", egress, sender=instance.id, step=next_step))
            sidecar.destinations = {c.id: ingress(c) for c in candidates}
            sidecar.catalog = catalog(topology, [instance, *candidates])
        else:
            sidecar.catalog = catalog(topology, [instance])
        points.append(sidecar)
        services.append(ServiceProcess(instance, service_endpoint(instance), next_step, egress.url if egress else None))
    return Plan(topology, ENTRY, points, services)
