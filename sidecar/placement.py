"""Sidecar topology (SA): one enforcement point beside every service instance.

Each instance's sidecar has an ingress listener that proxies to its own service, and an
egress listener where the service sends the record on. The egress asks the sidecar's OPA
which instance of the next step may receive it, so the hop is decided before the record
leaves the instance. The entry on the gateway node decides the first hop the same way.
"""

from complyroute.enforcement import DecidingListener, Endpoint, ForwardingListener
from complyroute.plan import (
    ENTRY,
    INGRESS_PORTS,
    Plan,
    ServiceProcess,
    catalog,
    deciding_entry,
    egress_endpoint,
    enforcement_point,
    service_endpoint,
)


def ingress(instance) -> Endpoint:
    return Endpoint(instance.node.address, INGRESS_PORTS + instance.index)


def place(topology) -> Plan:
    points = [deciding_entry(topology, "entry", reach=ingress)]
    services = []
    for instance in topology.instances:
        sidecar = enforcement_point(f"sidecar-{instance.id}", instance.node, instance.index)
        sidecar.forwarding.append(ForwardingListener("ingress", ingress(instance), service_endpoint(instance)))
        next_step = topology.next_step(instance.step)
        egress = None
        if next_step:
            candidates = topology.instances_of(next_step)
            egress = egress_endpoint(instance.node.address, instance)
            # The sidecar pins the next step: a service cannot send its record to another step.
            sidecar.deciding.append(DecidingListener("egress", egress, sender=instance.id, step=next_step))
            sidecar.destinations = {c.id: ingress(c) for c in candidates}
            sidecar.catalog = catalog(topology, [instance, *candidates])
        else:
            sidecar.catalog = catalog(topology, [instance])
        points.append(sidecar)
        services.append(ServiceProcess(instance, service_endpoint(instance), next_step, egress.url if egress else None))
    return Plan(topology, ENTRY, points, services)
