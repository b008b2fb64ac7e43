"""Fixtures the control plane's tests and the end-to-end tests share."""

import textwrap
from pathlib import Path

import pytest

from complyroute.topology import manifest
from complyroute.topology.plan import LOOPBACK_VARIABLE

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
# A test's tier is the folder it lives in, and its marker comes from there: tests/unit/ (no
# marker: fast, no deployment), tests/integration/ (`integration`: no deployment, but real OPA,
# Envoy or kubernetes-validate over whole topologies), tests/e2e/ (`e2e`: deploys, on the network
# and in the runs/ make test gives its stream: make/test.mk) and tests/k8s/ (`k8s`: needs the control plane `make k8s-setup` builds).
TESTS = Path(__file__).parent
TIERS = {"unit": None, "integration": pytest.mark.integration, "e2e": pytest.mark.e2e, "k8s": pytest.mark.k8s}


@pytest.fixture(autouse=True)
def runs_of_its_own(request, monkeypatch):
    """A unit or integration test gets a runs/ of its own (COMPLYROUTE_RUNS, read at each use:
    runtime/target.py runs_root), never the checkout's: an end-to-end test beside it in make
    test points the checkout's runs/current at its deployment, and a test reading it saw that.
    The end-to-end tiers keep the runs/ make test gives each stream. Nor do they take the loopback
    network of the shell that runs them (COMPLYROUTE_LOOPBACK, read at each plan): they assert
    the addresses a plan makes by default, and with it exported placement tests saw 127.0.9.x."""
    if request.node.path.relative_to(TESTS).parts[0] in ("unit", "integration"):
        monkeypatch.setenv("COMPLYROUTE_RUNS", str(request.getfixturevalue("tmp_path") / "runs"))
        monkeypatch.delenv(LOOPBACK_VARIABLE, raising=False)


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker
def pytest_collection_modifyitems(config, items):
    for item in items:
        tier = item.path.relative_to(TESTS).parts[0]
        if tier not in TIERS:
            raise pytest.UsageError(f"{item.nodeid}: a test lives in its tier's folder, one of tests/{{{','.join(TIERS)}}}/")
        if TIERS[tier]:
            item.add_marker(TIERS[tier])
