"""`replicas: N` in a manifest's service entry: N instances alike but for their id, node and ports,
spread over the service nodes, each placed by every topology as an instance of its own."""

import re
from collections import Counter

import pytest

from complyroute.topology import manifest
from complyroute.topology.manifest import MAX_REPLICAS, ManifestError, expand
from complyroute.topology.plan import place

SOURCE = manifest.REPO / "topologies" / "test.yaml"

# Three steps of EU instances, replicated 2, 3 and 2 times, over the manifests' three service nodes.
REPLICATED = [
    {"id": "ingest", "step": "ingest", "region": "EU", "certifications": ["health-data"], "purposes": ["care"], "replicas": 2},
    {"id": "analyse", "step": "analyse", "region": "EU", "purposes": ["care", "billing"], "replicas": 3,
     "attributes": {"clearance": ["secret"]}},
    {"id": "store", "step": "store", "region": "EU", "purposes": ["care"], "replicas": 2},
]
ENTRIES = {"ingest": 2, "analyse": 3, "store": 2}


def services(*entries, **nodes):
    return expand({"topology": "sidecar", "services": list(entries), **({"nodes": nodes} if nodes else {})}, SOURCE)


def replicas_of(topology, entry_id):
    return [i for i in topology.instances if re.fullmatch(rf"{entry_id}-\d+", i.id)]


def test_an_entry_with_replicas_makes_that_many_instances_alike_but_for_id_node_and_index_allowed():
    topology = services(*REPLICATED)
    assert [i.id for i in topology.instances] == ["ingest-1", "ingest-2", "analyse-1", "analyse-2", "analyse-3", "store-1", "store-2"]
    assert [i.index for i in topology.instances] == list(range(1, 8))  # each its own ports
    analysers = topology.instances_of("analyse")
    assert {(i.step, i.region, i.certifications, i.purposes, i.attributes) for i in analysers} == {
        ("analyse", "EU", (), ("care", "billing"), (("clearance", ("secret",)),))}
    assert topology.steps == ["ingest", "analyse", "store"]


def test_one_replica_keeps_the_entrys_id_and_place_denied():
    """`replicas: 1` (or none) is the entry as it was: its id without a number, its position's node and ports."""
    plain = services({"id": "a", "step": "s", "region": "EU"}, {"id": "b", "step": "t", "region": "EU"})
    once = services({"id": "a", "step": "s", "region": "EU", "replicas": 1}, {"id": "b", "step": "t", "region": "EU", "replicas": 1})
    assert once.instances == plain.instances
    assert [(i.id, i.node.name, i.index) for i in once.instances] == [("a", "node-1", 1), ("b", "node-2", 2)]


def test_replicas_of_one_entry_are_on_different_nodes_while_the_nodes_suffice_allowed():
    topology = services(*REPLICATED)
    for entry_id, count in ENTRIES.items():
        assert len({i.node for i in replicas_of(topology, entry_id)}) == count, entry_id
    assert len({i.node for i in services({"id": "a", "step": "s", "region": "EU", "replicas": 2}, service=2).instances}) == 2


def test_replicas_share_a_node_only_when_they_outnumber_the_nodes_denied():
    """The spread's limit: on one service node every replica is on it; more replicas than nodes, at most one apart."""
    alone = services({"id": "a", "step": "s", "region": "EU", "replicas": 3}, service=1)
    assert {i.node.name for i in alone.instances} == {"node-1"}
    crowded = services({"id": "a", "step": "s", "region": "EU", "replicas": 5})
    assert sorted(Counter(i.node.name for i in crowded.instances).values()) == [1, 2, 2]


def test_the_instances_of_all_entries_stay_spread_evenly_allowed():
    per_node = Counter(i.node.name for i in services(*REPLICATED).instances)
    assert sorted(per_node.values()) == [2, 2, 3]


@pytest.mark.parametrize("replicas", [1, MAX_REPLICAS])
def test_replicas_from_one_to_the_bound_allowed(replicas):
    assert len(services({"id": "a", "step": "s", "region": "EU", "replicas": replicas}).instances) == replicas


@pytest.mark.parametrize("replicas", [0, -2, MAX_REPLICAS + 1, "2", 2.0, True, None])
def test_replicas_that_are_no_whole_number_from_one_to_the_bound_denied(replicas):
    # The schema's refusals (topologies/topology.schema.json: an integer from 1 to MAX_REPLICAS), by
    # path; 2.0, which JSON Schema takes for an integer, the manifest's own.
    with pytest.raises(ManifestError, match=re.escape("field 'services[0].replicas': ")
                       + rf".*( is not of type 'integer'|minimum of 1|maximum of {MAX_REPLICAS}|must be a whole number from 1 to {MAX_REPLICAS})"):
        services({"id": "a", "step": "s", "region": "EU", "replicas": replicas})


def test_an_id_that_a_later_entrys_replica_would_take_is_named_at_its_replicas_denied():
    with pytest.raises(ManifestError, match=re.escape("field 'services[1].replicas': 'store-2' is used twice: services[0] is 'store-2' too")):
        services({"id": "store-2", "step": "s", "region": "EU"}, {"id": "store", "step": "s", "region": "EU", "replicas": 2})


def test_an_id_an_earlier_entrys_replica_took_is_named_at_its_id_denied():
    with pytest.raises(ManifestError, match=re.escape(
            "field 'services[1].id': 'store-1' is used twice: replica 1 of services[0] (store, replicas: 2) is 'store-1' too")):
        services({"id": "store", "step": "s", "region": "EU", "replicas": 2}, {"id": "store-1", "step": "s", "region": "EU"})


def test_two_replicated_entries_that_meet_are_named_denied():
    with pytest.raises(ManifestError, match=re.escape(
            "field 'services[1].replicas': 'a-1' is used twice: replica 1 of services[0] (a, replicas: 2) is 'a-1' too")):
        services({"id": "a", "step": "s", "region": "EU", "replicas": 2}, {"id": "a", "step": "t", "region": "EU", "replicas": 3})


def test_ids_beside_a_replicated_entry_that_no_replica_takes_allowed():
    topology = services({"id": "store", "step": "s", "region": "EU", "replicas": 2}, {"id": "store-3", "step": "s", "region": "EU"},
                        {"id": "store-eu", "step": "s", "region": "EU"})
    assert [i.id for i in topology.instances] == ["store-1", "store-2", "store-3", "store-eu"]


def test_a_node_pins_one_instance_allowed_and_replicas_spread_instead_denied():
    assert [i.node.name for i in services({"id": "a", "step": "s", "region": "EU", "node": "node-3", "replicas": 1}).instances] == ["node-3"]
    with pytest.raises(ManifestError, match=re.escape("field 'services[0].node': pins one instance to a node, and replicas: 2 are spread")):
        services({"id": "a", "step": "s", "region": "EU", "node": "node-3", "replicas": 2})


def test_a_replicated_manifest_lends_its_services_to_another_topology_allowed(tmp_path):
    lent = tmp_path / "replicated.yaml"
    lent.write_text(manifest.yaml.safe_dump({"topology": "sidecar", "services": REPLICATED}))
    topology = manifest.load("central-entity", services=str(lent))
    assert topology.kind == "central-entity" and len(topology.instances) == sum(ENTRIES.values())


# ---- placement: every topology places each replica as an instance of its own

ENFORCING = ["sidecar", "central-entity", "dynamic-router-3", "dynamic-router-6"]
# Where the point deciding the hops out of an instance stands: beside it, or on the gateway.
DECIDES_OUT_ON = {"sidecar": "its node", "central-entity": "gateway", "dynamic-router-3": "its node", "dynamic-router-6": "its node"}


def replicated_plan(topology_name):
    return place(manifest.load(topology_name, overrides={"services": REPLICATED}))


@pytest.mark.parametrize("topology_name", [*ENFORCING, "baseline"])
def test_every_replica_is_a_service_of_its_own_on_its_node_allowed(topology_name):
    plan = replicated_plan(topology_name)
    by_id = {process.instance.id: process for process in plan.services}
    assert sorted(by_id) == sorted(i.id for i in plan.topology.instances)
    endpoints = [(p.endpoint.address, p.endpoint.port) for p in plan.services]
    assert len(set(endpoints)) == len(endpoints)
    for entry_id, count in ENTRIES.items():
        addresses = {by_id[i.id].endpoint.address for i in replicas_of(plan.topology, entry_id)}
        assert addresses == {i.node.address for i in replicas_of(plan.topology, entry_id)} and len(addresses) == count, entry_id


@pytest.mark.parametrize("topology_name", ENFORCING)
def test_every_replica_sends_through_a_listener_of_its_own_on_a_point_where_its_topology_puts_it_allowed(topology_name):
    plan = replicated_plan(topology_name)
    for instance in plan.topology.instances:
        deciding = [(point, listener) for point in plan.points for listener in point.deciding if listener.sender == instance.id]
        if plan.topology.next_step(instance.step) is None:
            assert deciding == [], instance.id
            continue
        [(point, listener)] = deciding
        assert listener.step == plan.topology.next_step(instance.step)
        expected_node = instance.node.name if DECIDES_OUT_ON[topology_name] == "its node" else "gateway"
        assert point.node == expected_node, (instance.id, point.name)
        egress = next(p.egress_url for p in plan.services if p.instance.id == instance.id)
        assert egress == listener.endpoint.url


@pytest.mark.parametrize("topology_name", ENFORCING)
def test_every_replica_is_a_destination_of_its_own_wherever_its_step_is_decided_allowed(topology_name):
    plan = replicated_plan(topology_name)
    for point in plan.points:
        steps = {listener.step for listener in point.deciding}
        for step in steps:
            replicas = {i.id for i in plan.topology.instances_of(step)}
            assert replicas <= set(point.destinations) and replicas <= set(point.catalog["instances"]), (point.name, step)
            reached = [point.destinations[i] for i in replicas]
            assert len(set(reached)) == len(reached), (point.name, step)


def test_the_baseline_sends_every_record_to_the_first_replica_of_the_next_step_denied():
    """The baseline decides nothing: its services call the first instance of the next step, so
    later replicas get no records there (as the rules, choosing one instance per hop, give them none)."""
    plan = replicated_plan("baseline")
    assert not plan.enforces
    first_analyser = next(p for p in plan.services if p.instance.id == "analyse-1")
    assert {p.egress_url for p in plan.services if p.instance.step == "ingest"} == {first_analyser.endpoint.url}
