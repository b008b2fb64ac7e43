"""What an enforcement point tells Prometheus: its hops counted by outcome by Envoy (hop_stats, a
stats access logger on every deciding listener), and a metrics listener that serves Envoy's
statistics and its OPA's metrics, and nothing else of either (metrics_listener).

A point's admin interface and OPA's diagnostic address stay on the point's private sockets
(docs/architecture.md, Admin surfaces). The metrics listener is the one read-only window on
them: GET /metrics is Envoy's /stats/prometheus, GET /metrics/opa OPA's /metrics; every other
request is answered 404 by Envoy itself. Under mutual TLS it admits the scraper's identity only
(pki.MONITORING, identity.Trust.point); without, it listens where the point's readiness
listener does (locally the node's loopback address).
"""

from __future__ import annotations

from complyroute.proxy.clusters import cluster, socket
from complyroute.proxy.replies import local_replies
from complyroute.proxy.tls import filter_chain
from complyroute.topology.plan import METRICS_LISTENER, Endpoint, EnforcementPoint
from complyroute.trust.identity import PointTrust

ENVOY_PATH, OPA_PATH = "/metrics", "/metrics/opa"
# What the metrics listener answers anything else: the error contract's JSON, its 404 saying what
# it serves; the codec's refusals as every listener answers them (replies.py).
NOT_METRICS = {
    "filter": {"status_code_filter": {"comparison": {"op": "EQ", "value": {"default_value": 404, "runtime_key": "complyroute_unused"}}}},
    "body_format_override": {"json_format": {"code": "NOT_FOUND", "message": f"a metrics listener serves GET {ENVOY_PATH} and GET {OPA_PATH} only",
                                             "request_id": "%REQ(X-REQUEST-ID)%"}},
}
ADMIN_CLUSTER, OPA_DIAGNOSTIC_CLUSTER = "envoy-admin", "opa-diagnostic"
# Every request a deciding listener answered, by its status and who answered (RESPONSE_CODE_DETAILS:
# via_upstream, the next hop; ext_authz_denied, the policy, with the denial's code; ext_authz_error,
# no decision; else a check of the point's own, as its access log line says): envoy_complyroute_hops,
# labelled with the listener (a hop: sender -> step). The values come from a bounded set: statuses,
# Envoy's details, the rule set's codes. The time each hop took at the point is Envoy's own histogram
# of its listener's connection manager (envoy_http_downstream_rq_time, by envoy_http_conn_manager_prefix:
# the listener), which the same statistics carry.
HOP_TAGS = [
    {"name": "status", "value_format": "%RESPONSE_CODE%"},
    {"name": "answered_by", "value_format": "%RESPONSE_CODE_DETAILS%"},
    {"name": "code", "value_format": "%DYNAMIC_METADATA(envoy.filters.http.ext_authz:code)%"},
]


def hop_stats(listener: str) -> dict:
    """The stats access logger of a deciding listener: its hops counted by outcome (envoy_complyroute_hops)."""
    return {
        "name": "envoy.access_loggers.stats",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.access_loggers.stats.v3.Config",
            "stat_prefix": "complyroute",
            "counters": [{"stat": {"name": "hops", "tags": [{"name": "listener", "value_format": listener}, *HOP_TAGS]}, "value_fixed": 1}],
        },
    }


def _inside(endpoint: Endpoint) -> Endpoint:
    """Where the point's own Envoy reaches one of its point's parts: its socket, or (a pod's OPA
    listening on every address for the kubelet's probes) the pod's loopback."""
    return endpoint if endpoint.path else Endpoint("127.0.0.1", endpoint.port)


def _read_only(path: str, cluster_name: str, upstream_path: str) -> dict:
    return {
        "match": {"path": path, "headers": [{"name": ":method", "string_match": {"exact": "GET"}}]},
        "route": {"cluster": cluster_name, "prefix_rewrite": upstream_path, "timeout": "5s"},
    }


def metrics_clusters(point: EnforcementPoint) -> list[dict]:
    """The clusters the metrics listener reads from: the point's Envoy admin and its OPA's diagnostic address."""
    if point.metrics is None:
        return []
    clusters = [cluster(ADMIN_CLUSTER, _inside(point.admin))]
    if point.deciding:
        clusters.append(cluster(OPA_DIAGNOSTIC_CLUSTER, _inside(point.opa_diagnostic)))
    return clusters


def metrics_listener(point: EnforcementPoint, trust: PointTrust | None) -> dict:
    """The point's metrics listener (module docstring)."""
    routes = [_read_only(ENVOY_PATH, ADMIN_CLUSTER, "/stats/prometheus")]
    if point.deciding:
        routes.append(_read_only(OPA_PATH, OPA_DIAGNOSTIC_CLUSTER, "/metrics"))
    routes.append({"name": "not-metrics", "match": {"prefix": "/"}, "direct_response": {"status": 404}})
    manager = {
        "name": "envoy.filters.network.http_connection_manager",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
            "stat_prefix": METRICS_LISTENER,
            "route_config": {"name": METRICS_LISTENER, "virtual_hosts": [{"name": METRICS_LISTENER, "domains": ["*"], "routes": routes}]},
            "http_filters": [{"name": "envoy.filters.http.router",
                              "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}],
            "local_reply_config": {"mappers": [NOT_METRICS, *local_replies(deciding=False)["mappers"]]},
        },
    }
    return {"name": METRICS_LISTENER, "address": socket(point.metrics), "filter_chains": [filter_chain([manager], trust, METRICS_LISTENER)]}
