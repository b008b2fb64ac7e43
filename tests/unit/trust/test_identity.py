"""Who admits whom (identity.py, read off each topology's plan) and the credentials (pki.py)."""

from pathlib import Path

import pytest
from cryptography import x509

from complyroute import engines
from complyroute.policy.policyfiles import POLICIES
from complyroute.policy.ruleset import RuleSet
from complyroute.topology import manifest
from complyroute.proxy.metrics import metrics_clusters
from complyroute.topology.plan import METRICS_LISTENER, place
from complyroute.trust import identity, pki

MIXED_REGIONS = str(manifest.REPO / "topologies" / "examples" / "mixed-regions.yaml")
DECIDING = ["sidecar", "central-entity", "dynamic-router-3", "dynamic-router-6"]


def trust_of(topology: str, **security) -> identity.Trust | None:
    overrides = {"security": security} if security else None
    return identity.Trust.of(place(manifest.load(topology, services=MIXED_REGIONS, overrides=overrides)))


def service_id(instance: str) -> str:
    return pki.spiffe_id("service", instance)


@pytest.mark.parametrize("topology", DECIDING)
def test_deciding_listener_admits_its_sender_only_allowed(topology):
    trust = trust_of(topology)
    for point in trust.plan.points:
        peers = trust.point(point, None, {}).listener_peers
        for listener in point.deciding:
            if listener.from_client:
                assert peers[listener.name] == ()  # clients: plain HTTP at the entry
            else:
                assert peers[listener.name] == (service_id(listener.sender),)


@pytest.mark.parametrize("topology", DECIDING)
def test_service_admits_only_points_deciding_hops_into_it_denied(topology):
    """No service admits another service, and each admits exactly the points whose plan sends to it."""
    trust = trust_of(topology)
    for service in trust.plan.services:
        peers = trust.service(service, None).record_peers
        assert peers and all(peer.startswith(pki.spiffe_id("point", "")) for peer in peers), (service.instance.id, peers)
        senders = {identity.point_identity(p) for p in trust.plan.points
                   if service.endpoint in p.destinations.values() or any(f.upstream == service.endpoint for f in p.forwarding)}
        assert set(peers) == senders


def test_sidecar_ingress_admits_the_previous_steps_deciders_allowed():
    trust = trust_of("sidecar")
    plan = trust.plan
    for point in plan.points:
        for listener in point.forwarding:
            deciders = {identity.point_identity(p) for p in plan.points if listener.endpoint in p.destinations.values()}
            assert set(trust.point(point, None, {}).listener_peers[listener.name]) == deciders and deciders


def test_baseline_services_admit_the_previous_step_allowed():
    """Each service admits the services that call it directly; one nothing calls admits nobody."""
    trust = trust_of("baseline")
    services = trust.plan.services
    assert trust.service(services[0], None).record_peers == (pki.spiffe_id("point", "gateway"),)
    for receiver in services[1:]:
        callers = {service_id(s.instance.id) for s in services if s.egress_url == receiver.endpoint.url}
        assert set(trust.service(receiver, None).record_peers) == callers
    assert any(not trust.service(s, None).record_peers for s in services)
    assert not trust.label_tokens  # nothing decides, so nothing issues tokens


def test_mtls_off_gives_no_trust_denied():
    assert trust_of("sidecar", mtls=False, label_tokens=False) is None
    with pytest.raises(manifest.ManifestError, match="security.label_tokens"):
        trust_of("sidecar", mtls=False)
    with pytest.raises(manifest.ManifestError, match="security.mtsl"):
        trust_of("sidecar", mtsl=True)


def test_certificate_names_its_part_and_verifies_against_its_ca_only():
    ca, other = pki.CertificateAuthority("a"), pki.CertificateAuthority("b")
    credential = ca.issue(service_id("svc-01"))
    cert = x509.load_pem_x509_certificate(credential.cert_pem)
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.UniformResourceIdentifier) == [service_id("svc-01")]
    cert.verify_directly_issued_by(ca.cert)
    with pytest.raises(Exception):
        cert.verify_directly_issued_by(other.cert)


def test_signing_key_pair_matches():
    jwk, jwks = pki.signing_key()
    assert jwks["keys"][0]["x"] == jwk["x"] and "d" not in jwks["keys"][0] and jwk["d"]


def test_only_the_entry_gets_the_signing_key_allowed():
    trust = trust_of("sidecar")
    credentials = identity.Credentials.issue(trust, "test")
    for point in trust.plan.points:
        data = credentials.with_token_key(trust, point, {"complyroute": {"index": {}}} if point.deciding else None)
        holds_key = bool(data) and "token" in data["complyroute"]
        assert holds_key == any(listener.from_client for listener in point.deciding), point.name


@pytest.mark.parametrize("engine", manifest.ENGINES)
def test_envoy_checks_tokens_after_the_entry_and_issues_them_at_it(engine, tmp_path):
    trust = trust_of("central-entity")
    credentials = identity.Credentials.issue(trust, "test")
    files = credentials.write(tmp_path)
    point = trust.plan.points[0]
    config = engines.configure(engine, [point], trust.plan.topology.engine, RuleSet.of(POLICIES),
                               {point.name: trust.point(point, files[identity.point_identity(point)], credentials.token_jwks)})
    for listener in config[point.name].envoy["static_resources"]["listeners"]:
        manager = listener["filter_chains"][0]["filters"][0]["typed_config"]
        filters = [f["name"] for f in manager["http_filters"]]
        tls = "transport_socket" in listener["filter_chains"][0]
        if listener["name"] in ("entry", "ready"):
            assert "envoy.filters.http.jwt_authn" not in filters and not tls
        elif listener["name"] == METRICS_LISTENER:  # no record: no token; the scraper's certificate only
            assert "envoy.filters.http.jwt_authn" not in filters and tls
        else:
            assert filters.index("envoy.filters.http.jwt_authn") < filters.index("envoy.filters.http.ext_authz") and tls
    entry = next(l for l in config[point.name].envoy["static_resources"]["listeners"] if l["name"] == "entry")
    context = entry["filter_chains"][0]["filters"][0]["typed_config"]["route_config"]["virtual_hosts"][0]["typed_per_filter_config"]
    assert context["envoy.filters.http.ext_authz"]["check_settings"]["context_extensions"]["label_token"] == "issue"
    clusters = {c["name"]: c for c in config[point.name].envoy["static_resources"]["clusters"]}
    # OPA, and what the metrics listener reads (its Envoy's admin, its OPA's diagnostics), stay inside the point.
    inside = {"opa", *(c["name"] for c in metrics_clusters(point))}
    assert inside == {"opa", "envoy-admin", "opa-diagnostic"} and not any("transport_socket" in clusters[name] for name in inside)
    instances = {name: c for name, c in clusters.items() if name not in inside and "transport_socket_matches" not in c}
    assert all("transport_socket" in c for c in instances.values())
    # A compliant set's cluster verifies each endpoint against its own instance's identity.
    for name, cluster in clusters.items():
        if "transport_socket_matches" in cluster:
            members = [e["metadata"]["filter_metadata"]["envoy.transport_socket_match"]["instance"]
                       for priority in cluster["load_assignment"]["endpoints"] for e in priority["lb_endpoints"]]
            assert sorted(m["match"]["instance"] for m in cluster["transport_socket_matches"]) == sorted(members)
            for match in cluster["transport_socket_matches"]:
                sans = match["transport_socket"]["typed_config"]["common_tls_context"]["validation_context"]["match_typed_subject_alt_names"]
                assert sans == instances[match["match"]["instance"]]["transport_socket"]["typed_config"]["common_tls_context"][
                    "validation_context"]["match_typed_subject_alt_names"]


def test_key_files_are_private(tmp_path):
    trust = trust_of("central-entity")
    files = identity.Credentials.issue(trust, "test").write(tmp_path)
    for tls in files.values():
        assert (tmp_path / tls.key).stat().st_mode & 0o077 == 0


def test_writing_credentials_again_replaces_each_file_at_once_allowed(tmp_path):
    # The bench writes ca.pem again with every part's credential while parts started before read
    # it: one that opened the file meanwhile reads it whole (the old bytes), never truncated.
    trust = trust_of("central-entity")
    first, second = identity.Credentials.issue(trust, "test"), identity.Credentials.issue(trust, "test")
    assert first.ca_pem != second.ca_pem  # two CAs: which bytes a reader got shows
    ca = Path(next(iter(first.write(tmp_path).values())).ca)
    with ca.open("rb") as reading:
        second.write(tmp_path)
        assert reading.read() == first.ca_pem  # the file it opened, whole
    assert ca.read_bytes() == second.ca_pem and ca.stat().st_mode & 0o777 == 0o644
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no temporary file left
