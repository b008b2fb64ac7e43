"""Sidecar placement: one enforcement point per instance, each holding only the catalog it needs."""

from complyroute import enforcement, manifest
from complyroute.plan import place


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
    assert set(entry.destinations) == {"ingest-eu", "ingest-us"}


def test_sidecar_catalog_holds_itself_and_next_step_only():
    sidecar = point(plan(), "sidecar-ingest-eu")
    assert set(sidecar.catalog["instances"]) == {"ingest-eu", "analyse-eu", "analyse-us"}
    assert set(sidecar.destinations) == {"analyse-eu", "analyse-us"}
    assert sidecar.deciding[0].sender == "ingest-eu" and sidecar.deciding[0].step == "analyse"


def test_last_step_sidecar_has_no_egress():
    p = plan()
    sidecar = point(p, "sidecar-store-eu")
    assert sidecar.deciding == [] and sidecar.destinations == {}
    store = next(s for s in p.services if s.instance.id == "store-eu")
    assert store.egress_url is None and store.next_step is None


def test_deciding_listener_fails_closed_and_strips_routing_header():
    p = plan()
    config = enforcement.envoy_config(point(p, "sidecar-ingest-eu"), {})
    egress = next(l for l in config["static_resources"]["listeners"] if l["name"] == "egress")
    manager = egress["filter_chains"][0]["filters"][0]["typed_config"]
    filters = [f["name"] for f in manager["http_filters"]]
    assert filters == ["envoy.filters.http.header_mutation", "envoy.filters.http.ext_authz", "envoy.filters.http.router"]
    authz = manager["http_filters"][1]["typed_config"]
    assert authz["failure_mode_allow"] is False and authz["clear_route_cache"] is True
    route = manager["route_config"]["virtual_hosts"][0]["routes"][0]["route"]
    assert route["cluster_header"] == enforcement.ROUTING_HEADER


def test_ports_are_unique_across_the_deployment():
    p = place(manifest.load("sidecar", services=50))
    ports = [(x.address, port) for x in p.points for port in (x.admin_port, x.opa_grpc_port, x.opa_http_port)]
    ports += [(l.endpoint.address, l.endpoint.port) for x in p.points for l in [*x.deciding, *x.forwarding]]
    ports += [(s.endpoint.address, s.endpoint.port) for s in p.services]
    assert len(ports) == len(set(ports))
