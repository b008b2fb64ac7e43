"""Sidecar topology (SA): one enforcement point beside every service instance.

Each instance's sidecar has an ingress listener that proxies to its own service, and an
egress listener where the service sends the record on. The egress asks the sidecar's OPA
which instance of the next step may receive it, so the hop is decided before the record
leaves the instance. The entry on the gateway node decides the first hop the same way.
"""

from complyroute.topology.plan import DecidingListener, ForwardingListener, Plan, ServiceProcess, catalog, deciding_entry


def place(topology, net) -> Plan:
    points = [deciding_entry(topology, net, "entry", reach=net.ingress)]
    points[0].destinations_behind_ingress = True
    services = []
    for instance in topology.instances:
        sidecar = net.point(f"sidecar-{instance.id}", instance.node, instance.index, "sidecar", group=instance.id)
        sidecar.forwarding.append(ForwardingListener("ingress", net.ingress(instance), net.service(instance, beside=True)))
        next_step = topology.next_step(instance.step)
        egress = None
        if next_step:
            candidates = topology.instances_of(next_step)
            egress = net.egress(instance)
            # The sidecar pins the next step: a service cannot send its record to another step.
            sidecar.deciding.append(DecidingListener("egress", egress, sender=instance.id, step=next_step))
            sidecar.destinations = {c.id: net.ingress(c) for c in candidates}
            sidecar.destinations_behind_ingress = True
            sidecar.catalog = catalog(topology, [instance, *candidates])
        else:
            sidecar.catalog = catalog(topology, [instance])
        points.append(sidecar)
        service = net.service(instance, beside=True)
        services.append(ServiceProcess(instance, service, next_step, egress.url if egress else None))
    return Plan(topology, net.entry("entry"), points, services)
