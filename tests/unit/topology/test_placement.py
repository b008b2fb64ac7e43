"""Sidecar placement: one enforcement point per instance, each holding only the catalog it needs."""

import pytest
import yaml

from complyroute.policy import labels
from complyroute.policy.policyfiles import POLICIES
from complyroute.proxy.contract import ROUTING_HEADER
from complyroute.proxy.envoy import envoy_config
from complyroute.runtime.kubernetes import render, validate
from complyroute.topology import manifest
from complyroute.topology.plan import ROLES, LocalNetwork, place
from tests.rulesets import of_manifest


def plan():
    return place(manifest.load("topologies/examples/mixed-regions.yaml"))


def point(p, name):
    return next(x for x in p.points if x.name == name)


def test_every_instance_has_a_sidecar_and_the_entry_decides_the_first_step():
    p = plan()
    assert sorted(x.name for x in p.points) == sorted(["entry"] + [f"sidecar-{i.id}" for i in p.topology.instances])
    entry = point(p, "entry")
    assert entry.deciding[0].endpoint.url == "http://127.0.0.1:8080"
    assert entry.deciding[0].step == "ingest"
    assert set(entry.destinations) == {"ingest-eu-1", "ingest-eu-2", "ingest-us"}


def test_sidecar_catalog_holds_itself_and_next_step_only():
    sidecar = point(plan(), "sidecar-ingest-eu-1")
    assert set(sidecar.catalog["instances"]) == {"ingest-eu-1", "analyse-eu-1", "analyse-eu-2", "analyse-us"}
    assert set(sidecar.destinations) == {"analyse-eu-1", "analyse-eu-2", "analyse-us"}
    assert sidecar.deciding[0].sender == "ingest-eu-1" and sidecar.deciding[0].step == "analyse"


def test_last_step_sidecar_has_no_egress():
    p = plan()
    sidecar = point(p, "sidecar-store-eu-1")
    assert sidecar.deciding == [] and sidecar.destinations == {}
    store = next(s for s in p.services if s.instance.id == "store-eu-1")
    assert store.egress_url is None and store.next_step is None


def test_deciding_listener_fails_closed_and_strips_routing_header():
    p = plan()
    config = envoy_config(point(p, "sidecar-ingest-eu-1"), {}, labels=labels.schema(POLICIES))
    egress = next(l for l in config["static_resources"]["listeners"] if l["name"] == "egress")
    manager = egress["filter_chains"][0]["filters"][0]["typed_config"]
    filters = [f["name"] for f in manager["http_filters"]]
    # What only a decision sets removed; the headers counted and, without label tokens, the
    # labels (the sender's) bounded (one Lua filter) before OPA is asked.
    assert filters == ["envoy.filters.http.header_mutation", "envoy.filters.http.lua", "envoy.filters.http.ext_authz", "envoy.filters.http.router"]
    authz = manager["http_filters"][2]["typed_config"]
    assert authz["failure_mode_allow"] is False and authz["clear_route_cache"] is True
    route = manager["route_config"]["virtual_hosts"][0]["routes"][0]["route"]
    assert route["cluster_header"] == ROUTING_HEADER


def test_ports_are_unique_across_the_deployment():
    p = place(manifest.load("sidecar", services=50))
    ports = [(x.ready.address, x.ready.port) for x in p.points]
    ports += [(l.endpoint.address, l.endpoint.port) for x in p.points for l in [*x.deciding, *x.forwarding]]
    ports += [(s.endpoint.address, s.endpoint.port) for s in p.services]
    assert len(ports) == len(set(ports))


def listening(p) -> set[tuple[str, int]]:
    """Every TCP address a plan's parts listen on: entry, points' readiness and listeners, services."""
    ports = {(p.entry.address, p.entry.port)} | {(x.ready.address, x.ready.port) for x in p.points}
    ports |= {(l.endpoint.address, l.endpoint.port) for x in p.points for l in [*x.deciding, *x.forwarding]}
    return ports | {(s.endpoint.address, s.endpoint.port) for s in p.services}


@pytest.mark.parametrize("topology", ["central-entity", "dynamic-router-3", "dynamic-router-6", "sidecar"])
def test_a_plan_on_a_loopback_network_of_its_own_shares_no_address_with_a_deployment_allowed(topology, tmp_path):
    # The engines' differential test runs so beside the end-to-end suite's deployments.
    deployed = listening(place(manifest.load(topology, services=5), LocalNetwork(tmp_path)))
    beside = listening(place(manifest.load(topology, services=5), LocalNetwork(tmp_path, loopback="127.0.9")))
    assert not deployed & beside
    assert {port for _, port in deployed} == {port for _, port in beside}  # the same ports, other addresses
    assert {address.rsplit(".", 1)[0] for address, _ in beside} == {"127.0.9"}


@pytest.mark.parametrize("loopback", ["10.0.0", "127.0.9.1", "127.0", "localhost"])
def test_a_loopback_network_must_be_three_bytes_of_127_denied(loopback):
    with pytest.raises(ValueError, match="is not a loopback network"):
        LocalNetwork(loopback=loopback)


def test_a_deployment_beside_another_takes_the_loopback_network_its_environment_names_allowed(monkeypatch, tmp_path):
    # make test runs the experiments' end-to-end tests so, beside the other end-to-end tests' deployments.
    monkeypatch.setenv("COMPLYROUTE_LOOPBACK", "127.0.7")
    beside = listening(place(manifest.load("sidecar", services=5), LocalNetwork(tmp_path)))
    assert {address.rsplit(".", 1)[0] for address, _ in beside} == {"127.0.7"}
    assert LocalNetwork(tmp_path, loopback="127.0.9").loopback == "127.0.9"  # a plan's own network goes first
    # Denied twins: unset, the default addresses; set to what is not a loopback network, refused.
    monkeypatch.delenv("COMPLYROUTE_LOOPBACK")
    assert "127.0.0.1" in {address for address, _ in listening(place(manifest.load("sidecar", services=5), LocalNetwork(tmp_path)))}
    monkeypatch.setenv("COMPLYROUTE_LOOPBACK", "10.0.0")
    with pytest.raises(ValueError, match="is not a loopback network"):
        LocalNetwork(tmp_path)


def points_by_name(p):
    return {x.name: x for x in p.points}


def test_central_entity_is_the_only_point_and_holds_the_whole_catalog():
    p = place(manifest.load("central-entity", services="topologies/examples/mixed-regions.yaml"))
    assert [x.name for x in p.points] == ["central-entity"]
    central = p.points[0]
    assert set(central.catalog["instances"]) == {i.id for i in p.topology.instances}
    # The entry plus one listener per sending service, each pinning sender and next step.
    assert [(d.sender, d.step) for d in central.deciding] == [
        ("gateway", "ingest"), ("ingest-eu-1", "analyse"), ("ingest-eu-2", "analyse"), ("ingest-us", "analyse"),
        ("analyse-eu-1", "store"), ("analyse-eu-2", "store"), ("analyse-us", "store"),
    ]
    assert all(s.egress_url is None or s.egress_url.startswith("http://127.0.1.1:") for s in p.services)


def test_dr3_has_one_router_per_service_node_owning_its_services():
    p = place(manifest.load("dynamic-router-3", services=7))
    routers = [x for x in p.points if x.name.startswith("router-")]
    assert [r.name for r in routers] == ["router-node-1-1", "router-node-2-1", "router-node-3-1"]
    for router in routers:
        owned = {d.sender for d in router.deciding}
        assert owned == {i.id for i in p.topology.instances if i.node.name == router.node and p.topology.next_step(i.step)}


def test_dr6_routers_split_their_node_in_halves_and_hold_only_what_they_decide():
    p = place(manifest.load("dynamic-router-6", services=12))
    routers = [x for x in p.points if x.name.startswith("router-")]
    assert len(routers) == 6 and {r.node for r in routers} == {"node-1", "node-2", "node-3"}
    owners = {}
    for router in routers:
        for listener in router.deciding:
            owners.setdefault(listener.sender, []).append(router.name)
            next_step = p.topology.next_step(p.topology.instances[int(listener.sender[-2:]) - 1].step)
            assert listener.step == next_step
        # Its catalog: the services it owns (a last step's too, though it decides nothing for
        # it) and the candidates of their next steps; nothing else.
        decided = {d.sender for d in router.deciding} | set(router.destinations)
        extra = set(router.catalog["instances"]) - decided
        assert decided <= set(router.catalog["instances"])
        assert all(p.topology.next_step(p.topology.instances[int(i[-2:]) - 1].step) is None for i in extra)
    assert all(len(names) == 1 for names in owners.values())  # each hop decided by exactly one router
    per_router = sorted(len(r.deciding) for r in routers)
    assert per_router[-1] - per_router[0] <= 1  # 11 deciding services over 6 routers: 1 or 2 each


def test_baseline_decides_nothing_and_chains_services_directly():
    p = place(manifest.load("baseline", services="topologies/examples/mixed-regions.yaml"))
    assert [x.name for x in p.points] == ["gateway"] and p.points[0].deciding == []
    egress = {s.instance.id: s.egress_url for s in p.services}
    assert egress["ingest-us"] == "http://127.0.1.2:20004"  # analyse-eu-1 (node-1, the 4th instance): the first of the next step
    assert egress["store-eu-1"] is None


def test_a_manifests_work_iterations_reach_every_service_allowed():
    p = place(manifest.load("sidecar", services=3))  # workload.work_iterations: 100
    assert [s.environment(p.topology.workload, "a.jsonl", {})["WORK_ITERATIONS"] for s in p.services] == ["100"] * 3
    other = place(manifest.load("sidecar", services=3, overrides={"workload": {"work_iterations": 7}}))
    assert {s.environment(other.topology.workload, "a.jsonl", {})["WORK_ITERATIONS"] for s in other.services} == {"7"}


def test_without_work_iterations_the_service_keeps_its_own_default_denied():
    """The default is defined once, by the service (services/config.js): the control plane sets none."""
    p = place(manifest.load("sidecar", services=3, overrides={"workload": {}}))
    assert "work_iterations" not in p.topology.workload
    assert not any("WORK_ITERATIONS" in s.environment(p.topology.workload, "a.jsonl", {}) for s in p.services)


def test_placement_tags_each_point_with_its_role_and_group():
    expected = {
        "sidecar": {"entry": ("entry", "entry"), "sidecar-svc-01": ("sidecar", "svc-01")},
        "central-entity": {"central-entity": ("central", "central-entity")},
        # The routers of one slot on every node share a group: on Kubernetes one DaemonSet.
        "dynamic-router-6": {"entry": ("entry", "entry"), "router-node-1-2": ("router", "router-2"), "router-node-3-2": ("router", "router-2")},
        "baseline": {"gateway": ("entry", "gateway")},
    }
    for topology, tags in expected.items():
        points = {p.name: (p.role, p.group) for p in place(manifest.load(topology, services=6)).points}
        assert {name: points[name] for name in tags} == tags, topology
        assert {role for role, _ in points.values()} <= set(ROLES)


def test_a_topology_outside_the_repository_is_its_folder_and_its_manifest_allowed(hub_topology, tmp_path):
    """Placed, and rendered for Kubernetes as its roles say; tests/e2e/test_new_topology_e2e.py deploys it."""
    assert hub_topology.kind == "hub" and hub_topology.folder == (tmp_path / "hub").resolve()
    p = place(hub_topology)
    assert [(x.name, x.role) for x in p.points] == [("entry", "entry"), ("hub", "router")] and p.enforces
    assert {s.egress_url for s in p.services if s.next_step} == {listener.endpoint.url for listener in point(p, "hub").deciding}
    path = tmp_path / "hub.k8s.yaml"
    path.write_text(render.render(hub_topology, tmp_path / "kustomization", of_manifest(hub_topology)))
    assert validate.validate(path) == []
    rendered = [o for o in yaml.safe_load_all(path.read_text()) if o]
    assert {(o["kind"], o["metadata"]["name"]) for o in rendered if o["kind"] in ("Deployment", "DaemonSet")} == {
        ("Deployment", "entry"), ("DaemonSet", "hub"), ("Deployment", "bundle-server"), *(("Deployment", f"svc-0{n}") for n in (1, 2, 3))}
