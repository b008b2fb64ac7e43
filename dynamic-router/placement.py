"""Dynamic routers (DR_3, DR_6): routers on the service nodes decide the hops of their services.

Each service node runs `routers_per_node` routers (1 for DR_3, 2 for DR_6 with the paper's
three service nodes); the services of a node are dealt out to its routers in turn, so each
of two routers owns half of them. A router decides the hop *out of* each service it owns:
the service sends its record to its router, on a listener of its own, and the router asks
its OPA which instance of the next step may receive it, then sends the record straight to
that instance. So, as with sidecars, the record leaves its node only once the hop was
allowed, and a router's catalog holds the services it owns plus the candidates of their next
steps, nothing else. The entry on the gateway node decides the first hop.
"""

from complyroute.topology.plan import DecidingListener, Plan, ServiceProcess, catalog, deciding_entry


def place(topology, net) -> Plan:
    points = [deciding_entry(topology, net, "entry", reach=net.service)]
    services = []
    router_index = 0
    for node in topology.service_nodes:
        on_node = [i for i in topology.instances if i.node == node]
        for slot in range(topology.routers_per_node):
            router_index += 1
            # The routers of one slot on every node form a group: on Kubernetes one DaemonSet.
            router = net.point(f"router-{node.name}-{slot + 1}", node, router_index, "router", group=f"router-{slot + 1}")
            owned = on_node[slot :: topology.routers_per_node]
            known = list(owned)
            for instance in owned:
                next_step = topology.next_step(instance.step)
                egress = None
                if next_step:
                    candidates = topology.instances_of(next_step)
                    egress = net.hop(router, instance)
                    router.deciding.append(DecidingListener(f"from-{instance.id}", egress, sender=instance.id, step=next_step))
                    router.destinations.update({c.id: net.service(c) for c in candidates})
                    known += [c for c in candidates if c not in known]
                services.append(ServiceProcess(instance, net.service(instance), next_step, egress.url if egress else None))
            router.catalog = catalog(topology, known)
            points.append(router)
    services.sort(key=lambda s: s.instance.index)
    return Plan(topology, net.entry("entry"), points, services)
