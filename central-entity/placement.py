"""Central entity (CE): one enforcement point on the gateway node decides every hop.

It is the entry for clients and the only way from one service to the next: every service
sends its record back to the central entity (as in the paper, where each later step calls
back into it), on a listener of its own, so the central entity knows the sender without
trusting the service to say who it is. It holds the whole catalog.
"""

from complyroute.topology.plan import DecidingListener, Plan, ServiceProcess, catalog, deciding_entry


def place(topology, net) -> Plan:
    central = deciding_entry(topology, net, "central-entity", reach=net.service, role="central")
    services = []
    for instance in topology.instances:
        next_step = topology.next_step(instance.step)
        egress = None
        if next_step:
            egress = net.hop(central, instance)
            central.deciding.append(DecidingListener(f"from-{instance.id}", egress, sender=instance.id, step=next_step))
        services.append(ServiceProcess(instance, net.service(instance), next_step, egress.url if egress else None))
    central.destinations = {i.id: net.service(i) for i in topology.instances}
    central.catalog = catalog(topology, topology.instances, gateway=True)
    return Plan(topology, net.entry("central-entity"), [central], services)
