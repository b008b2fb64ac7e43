"""Central entity (CE): one enforcement point on the gateway node decides every hop.

It is the entry for clients and the only way from one service to the next: every service
sends its record back to the central entity (as in the paper, where each later step calls
back into it), on a listener of its own, so the central entity knows the sender without
trusting the service to say who it is. It holds the whole catalog.
"""

from complyroute.enforcement import DecidingListener
from complyroute.plan import ENTRY, Plan, ServiceProcess, catalog, deciding_entry, egress_endpoint, service_endpoint


def place(topology) -> Plan:
    central = deciding_entry(topology, "central-entity", reach=service_endpoint)
    services = []
    for instance in topology.instances:
        next_step = topology.next_step(instance.step)
        egress = None
        if next_step:
            egress = egress_endpoint(topology.gateway.address, instance)
            central.deciding.append(DecidingListener(f"from-{instance.id}", egress, sender=instance.id, step=next_step))
        services.append(ServiceProcess(instance, service_endpoint(instance), next_step, egress.url if egress else None))
    central.destinations = {i.id: service_endpoint(i) for i in topology.instances}
    central.catalog = catalog(topology, topology.instances, gateway=True)
    return Plan(topology, ENTRY, [central], services)
