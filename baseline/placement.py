"""Baseline: no enforcement at all, the reference for what enforcement costs.

The gateway node runs a plain Envoy proxy as the entry (the same API-gateway hop every
topology has), and each service calls the first instance of the next step directly. No OPA
is started and no policy is asked: records go wherever the chain leads, whatever their
labels. Compare its round-trip times with a topology's to see the cost of deciding.
"""

from complyroute.topology.plan import ForwardingListener, Plan, ServiceProcess


def place(topology, net) -> Plan:
    first = topology.instances_of(topology.steps[0])[0]
    gateway = net.point("gateway", topology.gateway, 0, "entry", concurrency=int(topology.engine.get("gateway_concurrency", 2)))
    gateway.forwarding.append(ForwardingListener("entry", net.entry("gateway"), net.service(first)))
    services = []
    for instance in topology.instances:
        next_step = topology.next_step(instance.step)
        egress = net.service(topology.instances_of(next_step)[0]).url if next_step else None
        services.append(ServiceProcess(instance, net.service(instance), next_step, egress))
    return Plan(topology, net.entry("gateway"), [gateway], services)
