"""Compliant sets in the rendered configuration (docs/architecture.md, "Compliant sets"): a
cluster per set of several instances, a priority per tier, balanced and failed over inside the
set only; retries before delivery only; 503 COMPLIANT_INSTANCES_DOWN when none is up; and the
instance ids the sets are made of. Envoy itself checks a replicated configuration with mutual
TLS (`envoy --mode validate`)."""

import json

import pytest

from complyroute import engines
from complyroute.engines import precompute
from complyroute.policy.policyfiles import POLICIES
from complyroute.policy.ruleset import RuleSet
from complyroute.proxy.clusters import SOCKET_MATCH
from complyroute.proxy.contract import is_instance, set_tiers
from complyroute.proxy.replies import INGRESS_DOWN, SET_DOWN, UNDELIVERED_HEADER, local_replies
from complyroute.proxy.routes import RETRY_UNSENT, retry_unsent
from complyroute.runtime.local import rendering
from complyroute.topology import manifest
from complyroute.topology.manifest import ManifestError
from complyroute.topology.plan import METRICS_LISTENER, place
from complyroute.trust import identity

REPLICATED = """
name: replicated
topology: sidecar
gateway_region: US
services:
  - {id: ingest-eu,  step: ingest,  region: EU, purposes: [care], replicas: 2}
  - {id: ingest-us,  step: ingest,  region: US, purposes: [care]}
  - {id: store-eu,   step: store,   region: EU, purposes: [care], replicas: 2}
"""


def configured(tmp_path, topology: str, engine: str = "envoy-opa", secured: bool = False):
    source = tmp_path / "replicated.yaml"
    source.write_text(REPLICATED)
    loaded = manifest.load(topology, services=str(source), engine=engine)
    plan = place(loaded)
    point_trust = {}
    if secured:
        trust = identity.Trust.of(plan)
        credentials = identity.Credentials.issue(trust, "test")
        files = credentials.write(tmp_path / "pki")
        point_trust = {p.name: trust.point(p, files[identity.point_identity(p)], credentials.token_jwks) for p in plan.points}
    return plan, engines.configure(engine, plan.points, loaded.engine, RuleSet.of(POLICIES), point_trust)


def clusters_of(config) -> dict[str, dict]:
    return {c["name"]: c for c in config.envoy["static_resources"]["clusters"]}


def vhosts(config) -> dict[str, dict]:
    return {l["name"]: l["filter_chains"][0]["filters"][0]["typed_config"]["route_config"]["virtual_hosts"][0]
            for l in config.envoy["static_resources"]["listeners"] if l["name"] not in ("ready", METRICS_LISTENER)}


def test_set_names_hold_their_tiers_allowed():
    assert set_tiers("ingest-us|ingest-eu-1,ingest-eu-2") == [["ingest-us"], ["ingest-eu-1", "ingest-eu-2"]]
    assert not is_instance("ingest-eu-1,ingest-eu-2") and not is_instance("a|b")


def test_an_instance_is_its_own_set_denied():
    assert set_tiers("ingest-us") == [["ingest-us"]] and is_instance("ingest-us")


@pytest.mark.parametrize("topology", ["central-entity", "sidecar"])
def test_a_set_s_cluster_holds_its_tiers_as_priorities_allowed(tmp_path, topology):
    plan, configs = configured(tmp_path, topology)
    point = plan.points[0]  # the entry (the central entity's, which also decides every later hop)
    entry = clusters_of(configs[point.name])
    # The US gateway: a US subject's personal record prefers ingest-us, then the EU replicas; an EU one may go to EU only.
    cluster = entry["ingest-us|ingest-eu-1,ingest-eu-2"]
    endpoints = cluster["load_assignment"]["endpoints"]
    members = [[e["metadata"]["filter_metadata"][SOCKET_MATCH]["instance"] for e in tier["lb_endpoints"]] for tier in endpoints]
    assert members == [["ingest-us"], ["ingest-eu-1", "ingest-eu-2"]] and [t["priority"] for t in endpoints] == [0, 1]
    assert [[e["endpoint"]["address"]["socket_address"]["port_value"] for e in tier["lb_endpoints"]] for tier in endpoints] == [
        [point.destinations[i].port for i in tier] for tier in members]
    assert "ingest-eu-1,ingest-eu-2" in entry
    assert cluster["lb_policy"] == "LEAST_REQUEST"
    # One instance up keeps all of a tier's load there (100 x the largest tier), and none is panic routing.
    assert cluster["load_assignment"]["policy"]["overprovisioning_factor"] == 200
    assert cluster["common_lb_config"] == {"healthy_panic_threshold": {"value": 0}}
    outliers = cluster["outlier_detection"]
    assert outliers["consecutive_local_origin_failure"] == 2 and outliers["split_external_local_origin_errors"]
    assert outliers["enforcing_consecutive_5xx"] == 0  # a service's 5xx ejects no one
    assert outliers["max_ejection_percent"] == 50  # never the whole set: refused connections answer then
    # Retries in flight are not capped at Envoy's default of 3 per cluster.
    assert cluster["circuit_breakers"]["thresholds"][0]["max_retries"] == 100000
    listed = configs[point.name].data[precompute.QUICK_PATH_DOCUMENT]["set_clusters"]
    assert sorted(listed) == sorted(name for name in entry if not is_instance(name) and name != "opa")


def test_no_set_of_one_gets_a_cluster_of_its_own_denied(tmp_path):
    _, configs = configured(tmp_path, "central-entity")
    for config in configs.values():
        sets = [name for name, cluster in clusters_of(config).items() if "lb_policy" in cluster]
        assert sets and all(not is_instance(name) for name in sets)
        # Each instance keeps its own cluster, which a set of one is routed to.
        assert {"ingest-us", "ingest-eu-1", "ingest-eu-2"} <= set(clusters_of(config))


def test_each_endpoint_of_a_set_is_checked_against_its_own_identity_and_envoy_takes_it_allowed(tmp_path):
    _, configs = configured(tmp_path, "sidecar", "envoy-compiled", secured=True)
    for name, config in configs.items():
        clusters = clusters_of(config)
        for cluster in clusters.values():
            if "transport_socket_matches" not in cluster:
                continue
            for match in cluster["transport_socket_matches"]:
                own = clusters[match["match"]["instance"]]["transport_socket"]
                assert match["transport_socket"] == own, (name, match["name"])
            assert "transport_socket" not in cluster  # no socket that would accept any member's identity
        bootstrap = tmp_path / f"{name}.json"
        bootstrap.write_text(json.dumps(config.envoy))
        checked = rendering.subprocess.run([rendering.envoy_binary(), "--mode", "validate", "-c", str(bootstrap), "--log-level", "error"],
                                           capture_output=True, text=True)
        assert checked.returncode == 0, (name, checked.stdout + checked.stderr)


def test_a_set_reaches_only_its_members_denied(tmp_path):
    plan, configs = configured(tmp_path, "central-entity", secured=True)
    point = plan.points[0]
    for name, cluster in clusters_of(configs[point.name]).items():
        if "transport_socket_matches" in cluster:
            ports = {e["endpoint"]["address"]["socket_address"]["port_value"]
                     for tier in cluster["load_assignment"]["endpoints"] for e in tier["lb_endpoints"]}
            members = {m for tier in set_tiers(name) for m in tier}
            assert ports == {point.destinations[m].port for m in members}
            others = set(point.destinations) - members
            assert not ports & {point.destinations[m].port for m in others}


def test_deciding_listeners_retry_inside_the_set_before_delivery_allowed(tmp_path):
    _, configs = configured(tmp_path, "sidecar")
    entry = vhosts(configs["entry"])["entry"]
    # The sidecar topology: an ingress's own 503 with the header says the record reached no service.
    assert entry["retry_policy"] == retry_unsent(True)
    assert "retriable-headers" in entry["retry_policy"]["retry_on"]
    assert entry["retry_policy"]["retriable_headers"] == [{"name": UNDELIVERED_HEADER, "present_match": True}]
    assert entry["response_headers_to_remove"] == [UNDELIVERED_HEADER]
    ingress = vhosts(configs["sidecar-ingest-eu-1"])["ingress"]
    assert ingress["response_headers_to_remove"] == [UNDELIVERED_HEADER]  # a service cannot claim it
    assert "retry_policy" not in ingress


def test_points_that_reach_services_directly_believe_no_undelivered_header_denied(tmp_path):
    _, configs = configured(tmp_path, "central-entity")
    for name, vhost in vhosts(configs["central-entity"]).items():
        assert vhost["retry_policy"] == RETRY_UNSENT and "retriable_headers" not in vhost["retry_policy"], name
        # Only failures before a byte was sent: never a status, never a reset after.
        assert set(vhost["retry_policy"]["retry_on"].split(",")) == {"connect-failure", "refused-stream", "reset-before-request"}


def test_a_set_down_is_answered_with_its_own_code_allowed():
    deciding = local_replies(deciding=True)["mappers"]
    forwarding = local_replies(deciding=False)["mappers"]
    codes = lambda mappers: [m.get("body_format_override", {}).get("json_format", {}).get("code") for m in mappers]
    assert SET_DOWN[0] in deciding and codes(deciding).index("COMPLIANT_INSTANCES_DOWN") < codes(deciding).index("HOP_UNAVAILABLE")
    assert INGRESS_DOWN[0] in forwarding and codes(forwarding).index("COMPLIANT_INSTANCES_DOWN") < codes(forwarding).index("HOP_UNAVAILABLE")
    assert INGRESS_DOWN[0]["headers_to_add"][0]["header"] == {"key": UNDELIVERED_HEADER, "value": "1"}
    assert json.dumps(SET_DOWN[0]["filter"]) == json.dumps({"response_flag_filter": {"flags": ["UH", "UF"]}})


def test_only_an_ingress_marks_a_record_undelivered_denied():
    deciding = local_replies(deciding=True)["mappers"]
    assert INGRESS_DOWN[0] not in deciding and not any("headers_to_add" in m for m in deciding)
    assert SET_DOWN[0] not in local_replies(deciding=False)["mappers"]


@pytest.mark.parametrize("bad", ["store,eu", "store|eu", "Store-EU", "-store", "store-"])
def test_an_id_that_a_set_name_could_not_hold_is_refused_denied(tmp_path, bad):
    source = tmp_path / "bad.yaml"
    source.write_text(REPLICATED.replace("ingest-us", json.dumps(bad)))
    with pytest.raises(ManifestError, match=r"services\[1\]\.id.*is not an instance id"):
        manifest.load("sidecar", services=str(source))
