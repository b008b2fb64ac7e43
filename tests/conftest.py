"""Fixtures the control plane's tests and the end-to-end tests share."""

import textwrap
from pathlib import Path

import pytest

from complyroute.topology import manifest

# A topology no one wrote into the repository: the entry decides the first hop, and one hub on
# the first service node decides every later one. Its folder holds only its placement.
HUB_PLACEMENT = textwrap.dedent('''
    from complyroute.topology.plan import DecidingListener, Plan, ServiceProcess, catalog, deciding_entry


    def place(topology, net):
        entry = deciding_entry(topology, net, "entry", reach=net.service)
        hub = net.point("hub", topology.service_nodes[0], 1, "router")
        services = []
        for instance in topology.instances:
            next_step = topology.next_step(instance.step)
            egress = None
            if next_step:
                egress = net.hop(hub, instance)
                hub.deciding.append(DecidingListener(f"from-{instance.id}", egress, sender=instance.id, step=next_step))
            services.append(ServiceProcess(instance, net.service(instance), next_step, egress.url if egress else None))
        hub.destinations = {i.id: net.service(i) for i in topology.instances}
        hub.catalog = catalog(topology, topology.instances)
        return Plan(topology, net.entry("entry"), [entry, hub], services)
''')
HUB_MANIFEST = textwrap.dedent('''
    name: hub
    topology: ./hub   # the folder beside this manifest
    nodes: {gateway: 1, service: 2}
    services: 3
''')


@pytest.fixture
def hub_topology(tmp_path) -> manifest.Topology:
    """The hub topology, its folder and its manifest written into a temporary folder, loaded."""
    (tmp_path / "hub").mkdir()
    (tmp_path / "hub" / "placement.py").write_text(HUB_PLACEMENT)
    (tmp_path / "hub.yaml").write_text(HUB_MANIFEST)
    return manifest.load(str(tmp_path / "hub.yaml"))


# ---- tiers -----------------------------------------------------------------------------------
# tests/integration/: tests that start no deployment but run real OPA, Envoy or
# kubernetes-validate over whole topologies (a minute or more each file here). `make test` runs
# them; `make check`, the quick loop, leaves them out (-m "not integration").
INTEGRATION = Path(__file__).with_name("integration")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if INTEGRATION in item.path.parents:
            item.add_marker(pytest.mark.integration)
