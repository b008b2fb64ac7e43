"""An enforcement point's clusters, where Envoy sends what a listener passes: its own OPA, each
destination instance, each compliant set of several instances (a priority per preference tier,
balanced and failed over inside the set only), a forwarding listener's upstream."""

from __future__ import annotations

from complyroute.proxy.contract import UPSTREAM_IDLE_TIMEOUT, set_tiers
from complyroute.proxy.tls import upstream_tls
from complyroute.topology.plan import Endpoint, EnforcementPoint
from complyroute.trust.identity import PointTrust

# A socket Envoy listens on (its admin interface) is for its own user only.
OWNER_ONLY = 0o600


def socket(endpoint: Endpoint) -> dict:
    if endpoint.path:
        return {"pipe": {"path": endpoint.path, "mode": OWNER_ONLY}}
    return {"socket_address": {"address": endpoint.address, "port_value": endpoint.port}}


def _is_ip(host: str) -> bool:
    return all(part.isdigit() for part in host.split(".")) and host.count(".") == 3


def _address(endpoint: Endpoint) -> dict:
    # A socket (the point's own OPA) or an address is used as it is; a name (a Kubernetes
    # Service) is resolved by DNS.
    return {"pipe": {"path": endpoint.path}} if endpoint.path else socket(Endpoint(endpoint.reach, endpoint.port))


def _cluster_type(endpoints: list[Endpoint]) -> str:
    return "STATIC" if all(endpoint.path or _is_ip(endpoint.reach) for endpoint in endpoints) else "STRICT_DNS"


def cluster(name: str, endpoint: Endpoint, http2: bool = False, trust: PointTrust | None = None) -> dict:
    config = {
        "name": name,
        "type": _cluster_type([endpoint]),
        "connect_timeout": "1s",
        "load_assignment": {
            "cluster_name": name,
            # Named, so that the access log names where a record went (%UPSTREAM_HOST_NAME%).
            "endpoints": [{"lb_endpoints": [{"endpoint": {"address": _address(endpoint), "hostname": name}}]}],
        },
        **_cluster_limits(http2),
    }
    if trust is not None:
        config["transport_socket"] = _verified_as_its_owner(trust, endpoint)
    return config


def _verified_as_its_owner(trust: PointTrust, endpoint: Endpoint) -> dict:
    """TLS to `endpoint`, which must present the identity of the part that listens there."""
    return upstream_tls(trust, trust.upstream_identity[(endpoint.reach, endpoint.port)])


def _cluster_limits(http2: bool = False) -> dict:
    return {
        # Envoy's default of 1024 pending requests would turn load peaks into 503s that
        # measure Envoy's defaults rather than the topology.
        "circuit_breakers": {
            # And its default of 3 retries in flight per cluster refused the retries a dead
            # instance of a set causes at 50 records/s (sets-20261127: 167 refused against 118
            # made), answering 503 with a twin up.
            "thresholds": [{"max_connections": 100000, "max_pending_requests": 100000, "max_requests": 100000,
                            "max_retries": 100000}]
        },
        "typed_extension_protocol_options": {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                # Shorter than the services' keep-alive (Fastify: 72 s), so Envoy never reuses a
                # connection the service is closing.
                "common_http_protocol_options": {"idle_timeout": UPSTREAM_IDLE_TIMEOUT},
                "explicit_http_config": {"http2_protocol_options": {}} if http2 else {"http_protocol_options": {}},
            }
        },
    }


# Which transport socket an endpoint of a set's cluster takes (transport_socket_matches): its
# instance's, so each is verified against its own identity.
SOCKET_MATCH = "envoy.transport_socket_match"
# A tier's traffic moves to the next only when the tier has no healthy instance: Envoy gives a
# priority min(100%, healthy share x factor / 100) of the load, so a factor of 100 x the
# largest tier keeps all of it on a tier with one instance up. (Envoy's default, 140, would spill
# 30% of a two-instance tier to the next with one instance down.)
OVERPROVISIONING_PER_INSTANCE = 100


def set_cluster(name: str, point: EnforcementPoint, trust: PointTrust | None) -> dict:
    """The cluster of a compliant set (the routing header's name: its tiers, contract.set_tiers):
    the set's instances, a priority per tier. Envoy balances each record to the healthy
    instance of the first tier with the fewest requests in flight, moves to the next tier only
    when the first has none healthy, and never leaves the set: with every instance down the hop
    is answered 503 COMPLIANT_INSTANCES_DOWN (replies.py), as no panic routing applies.

    Healthy means not ejected: an instance whose connection fails twice in a row (refused, timed
    out, reset before the request was sent, TLS not completed) is ejected, at most half of the
    set at a time, and every such record is sent again to another instance of the set
    (routes.RETRY_UNSENT). HTTP answers, 5xx included, eject no one: a service's 502 says its
    own next hop failed, not that it did."""
    tiers = set_tiers(name)
    members = [instance for tier in tiers for instance in tier]
    config = {
        "name": name,
        "type": _cluster_type([point.destinations[instance] for instance in members]),
        "connect_timeout": "1s",
        "lb_policy": "LEAST_REQUEST",
        "load_assignment": {
            "cluster_name": name,
            "endpoints": [{
                "priority": priority,
                "lb_endpoints": [{
                    "endpoint": {"address": _address(point.destinations[instance]), "hostname": instance},
                    "metadata": {"filter_metadata": {SOCKET_MATCH: {"instance": instance}}},
                } for instance in tier],
            } for priority, tier in enumerate(tiers)],
            "policy": {"overprovisioning_factor": OVERPROVISIONING_PER_INSTANCE * max(len(tier) for tier in tiers)},
        },
        # No panic routing: with no healthy instance, no instance at all.
        "common_lb_config": {"healthy_panic_threshold": {"value": 0}},
        "outlier_detection": {
            "split_external_local_origin_errors": True,
            # Two in a row: a dead instance refuses every connection, while a live one on a busy
            # machine may miss one connect timeout (sets-20261127 saw the live twin ejected so).
            "consecutive_local_origin_failure": 2,
            "enforcing_consecutive_local_origin_failure": 100,
            "enforcing_consecutive_5xx": 0,
            "enforcing_success_rate": 0,
            "enforcing_local_origin_success_rate": 0,
            "interval": "1s",
            "base_ejection_time": "1s",
            # Each ejection of an instance lasts longer (base x count) up to this: an instance
            # that failed while it restarted is back in the set within 2 s of being ready, before
            # its twin's death could leave the set with nobody eligible (k8s-e2e at load 35).
            "max_ejection_time": "2s",
            # Never the whole set: with every instance down, the refused connections themselves
            # answer 503 COMPLIANT_INSTANCES_DOWN, and a live instance ejected by mistake beside a
            # dead one would leave the dead one alone to be picked.
            "max_ejection_percent": 50,
        },
        **_cluster_limits(),
    }
    if trust is not None:
        config["transport_socket_matches"] = [{
            "name": instance,
            "match": {"instance": instance},
            "transport_socket": _verified_as_its_owner(trust, point.destinations[instance]),
        } for instance in members]
    return config
