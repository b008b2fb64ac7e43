"""The one enforcement point every topology uses: an Envoy that asks OPA before a record moves.

This module writes its bootstrap: listeners; the clusters (clusters.py), the routes (routes.py), the answers
Envoy makes itself (replies.py) and TLS (tls.py) are its parts, and OPA's configuration is
opa.py's.

A topology only decides *where* enforcement points stand and what each serves (see its
folder's placement.py); proxy/ turns such a description into Envoy's and OPA's
configuration. Two kinds of listener exist:

- a *deciding* listener: Envoy strips any routing header the caller set, asks OPA over
  ext_authz gRPC (the raw body included), and routes to the instance named in the
  `x-complyroute-destination` header that only OPA's decision sets. No decision, no
  forwarding: `failure_mode_allow` is false.
- a *forwarding* listener: plain proxying to one endpoint (a sidecar's ingress to its own
  service).

How a deciding listener decides is the engine's business (complyroute/engines/): with
envoy-opa every record goes through the decision route below; an engine may put a matcher
tree in front of it (`matchers`), whose leaves route allowed hops without asking OPA and
whose misses fall through to the decision route.
"""

from __future__ import annotations

import copy
import hashlib
import json

from complyroute.policy.labels import Label
from complyroute.proxy.accesslog import access_log
from complyroute.proxy.clusters import cluster, set_cluster, socket
from complyroute.proxy.metrics import hop_stats, metrics_clusters, metrics_listener
from complyroute.proxy.contract import (DIGEST_HEADER, LABEL_TOKEN_HEADER, MAX_LABEL_BYTES, MAX_LABEL_VALUES, MAX_FORWARDED_HEADERS, MAX_RECORD_BYTES, MAX_REQUEST_HEADERS,
                                        RECORD_ID_HEADER, RECORD_PATH, REVISION_HEADER, ROUTING_HEADER, hop_timeout_of,
                                        receive_timeouts)
from complyroute.proxy.replies import OVER_BOUND_HEADER, UNDELIVERED_HEADER, local_replies
from complyroute.proxy.routes import EXT_AUTHZ_PER_ROUTE, decision_route, record_route, refusal_route, refusal_routes, retry_unsent
from complyroute.proxy.tls import filter_chain
from complyroute.topology.plan import READY_PATH, DecidingListener, EnforcementPoint, ForwardingListener
from complyroute.trust.identity import TOKEN_ISSUER, PointTrust

ENTRY_FORGETS_REQUEST_ID = {
    "name": "entry-forgets-request-id",
    "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.http.early_header_mutation.header_mutation.v3.HeaderMutation",
        "mutations": [{"remove": "x-request-id"}],
    },
}


def _connection_manager(stat_prefix: str, http_filters: list, virtual_host: dict, settings: dict, from_client: bool = False,
                        deciding: bool = False, logs: list[dict] = ()) -> dict:
    headers_timeout, request_timeout = receive_timeouts(settings)
    # A listener that asks no decision bounds the headers in its codec; a deciding one keeps Envoy's
    # bound, above its own (request_bounds), for the headers a decision adds.
    bounded = {} if deciding else {"common_http_protocol_options": {"max_headers_count": MAX_FORWARDED_HEADERS}}
    return {
        "name": "envoy.filters.network.http_connection_manager",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
            "stat_prefix": stat_prefix,
            # The entry assigns every record's id: a client's x-request-id is replaced (a client
            # could otherwise pass a record off as another in the audit logs, or send two).
            # Later hops keep the id the entry assigned, which the services send on.
            "preserve_external_request_id": True,
            "always_set_request_id_in_response": True,
            "request_headers_timeout": headers_timeout,
            "request_timeout": request_timeout,
            **bounded,
            "route_config": {"name": stat_prefix, "virtual_hosts": [virtual_host]},
            # At the entry, a client's id is removed before Envoy generates the record's.
            **({"early_header_mutation_extensions": [ENTRY_FORGETS_REQUEST_ID]} if from_client else {}),
            "http_filters": http_filters + [
                {"name": "envoy.filters.http.router", "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}
            ],
            "local_reply_config": local_replies(deciding),
            **({"access_log": list(logs)} if logs else {}),
        },
    }


def _removing(headers: list[str]) -> dict:
    return {
        "name": "envoy.filters.http.header_mutation",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.header_mutation.v3.HeaderMutation",
            "mutations": {"request_mutations": [{"remove": header} for header in headers]},
        },
    }
# Claims of a label token (policies/complyroute/envoy/envoy.rego issues them) and the headers
# jwt_authn writes them into: a claim per label, named as the label, into its header
# (token_claims), and these. They are removed before jwt_authn runs (as jwt_authn itself does
# with the headers it writes), so what a later filter, Envoy's matcher or the service reads
# came from a verified token only: a claim the token lacks (consent, for a record without
# consent values) stays absent.
RECORD_CLAIMS = [(RECORD_ID_HEADER, "rid"), (DIGEST_HEADER, "digest")]
# When the deciding point took the hop: its Envoy's start of the request, in milliseconds since
# the epoch, on the point's clock. Its OPA reads the clock for the decision after it, within the
# decision timeout (the ext_authz call); the receiving service's own time (its audit line's ts)
# comes later still, after the hop was forwarded, and on Kubernetes from another node's clock.
DECIDED_AT_HEADER = "x-complyroute-decided-at"
DECIDED_AT = "%START_TIME(%s%3f)%"

# A record goes on under the id its token names (the entry's), whatever x-request-id its
# sender sent; the sender's stays on anything refused before, so the refusal names it.
RECORD_ID_FROM_TOKEN = {"header": {"key": "x-request-id", "value": f"%REQ({RECORD_ID_HEADER})%"},
                        "append_action": "OVERWRITE_IF_EXISTS_OR_ADD"}


# The request's bounds, checked by one Lua filter at every deciding listener, after the headers
# only a decision sets are removed (so a sender can name no refusal) and before ext_authz or
# the token check. One filter: each Lua filter costs a coroutine and the headers' wrapper per
# request; the two that were here took the compiled engine's hop from 1.47x to 1.60x the router
# alone (make bench, plain HTTP, 2026-11-30).
#
# - Headers: more than MAX_REQUEST_HEADERS refused (431, HEADERS_TOO_LARGE). The connection
#   manager's own bound cannot be the one: ext_authz refuses to add a decision's headers past
#   it, and the request came back 500 (ext_authz_invalid, request_header_limits_reached: 90
#   extra headers from a client did), so it stays at Envoy's 100 and this bound leaves room
#   below it.
# - Labels, where a sender gives them (the entry; every deciding listener without label
#   tokens): a label header over the bounds refused (431, answered as LABEL_TOO_LARGE by the
#   local reply mappers, which the header it sets tells from the count's). Lua, since neither a
#   route nor a matcher can measure a header: a regular expression would be RE2's, whose `.`
#   and `[^,]` match no byte of invalid UTF-8, which the codec lets through.
HEADER_COUNT_LUA = f"""
  local headers = handle:headers()
  local count = 0
  for _, _ in pairs(headers) do
    count = count + 1
  end
  if count > {MAX_REQUEST_HEADERS} then
    handle:respond({{[":status"] = "431"}}, "")
    return
  end
"""
LABEL_BOUND_LUA = f"""\
  for _, name in ipairs(LABEL_HEADERS) do
    local value = headers:get(name)  -- repeated headers come joined by ","
    if value ~= nil then
      local _, commas = string.gsub(value, ",", "")
      if #value > {MAX_LABEL_BYTES} or commas >= {MAX_LABEL_VALUES} then
        headers:replace("{OVER_BOUND_HEADER}", name)
        handle:respond({{[":status"] = "431"}}, "")
        return
      end
    end
  end
"""


def request_bounds(labels: tuple[Label, ...] = ()) -> dict:
    """The Lua filter bounding the request's headers, and the headers of `labels` (none: the
    count alone)."""
    source = f"function envoy_on_request(handle){HEADER_COUNT_LUA}"  # defines `headers`
    if labels:
        names = ", ".join(json.dumps(label.header) for label in labels)
        source = f"local LABEL_HEADERS = {{{names}}}\n{source}{LABEL_BOUND_LUA}"
    return {
        "name": "envoy.filters.http.lua",
        "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua",
                         "default_source_code": {"inline_string": f"{source}end\n"}},
    }


def token_claims(labels: tuple[Label, ...]) -> list[tuple[str, str]]:
    """(header, claim) of every claim of a label token jwt_authn writes into a header."""
    return [(label.header, label.name) for label in labels] + RECORD_CLAIMS


def _label_token_check(trust: PointTrust, listener: str, labels: tuple[Label, ...]) -> dict:
    return {
        "name": "envoy.filters.http.jwt_authn",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.jwt_authn.v3.JwtAuthentication",
            "providers": {
                "entry": {
                    "issuer": TOKEN_ISSUER,
                    # A token names where it may be used (identity.Trust.audience): one taken
                    # from another hop or instance is refused here (403, LABEL_TOKEN_ELSEWHERE).
                    "audiences": [trust.token_audiences[listener]],
                    "local_jwks": {"inline_string": trust.jwks},
                    "from_headers": [{"name": LABEL_TOKEN_HEADER}],
                    "forward": True,  # the service sends it on to the next point
                    "claim_to_headers": [{"header_name": header, "claim_name": claim} for header, claim in token_claims(labels)],
                    # The compiled engine's matcher chooses the route on the labels just written.
                    "clear_route_cache": True,
                }
            },
            # Records only: anything else is refused by the listener's routes, token or not.
            "rules": [{"match": {"path": RECORD_PATH, "headers": [{"name": ":method", "string_match": {"exact": "POST"}}]},
                       "requires": {"provider_name": "entry"}}],
        },
    }


# What only a decision sets on a request (the routing header; the revision, which the access log
# and the receiving service read): a sender's values are removed before anything reads them.
DECIDED_HEADERS = (ROUTING_HEADER, REVISION_HEADER)


def _deciding_listener(listener: DecidingListener, settings: dict, matcher: dict | None, point: str, trust: PointTrust | None,
                       labels: tuple[Label, ...], behind_ingress: bool = False, log_path: str = "/dev/stdout") -> dict:
    if not labels:
        raise ValueError(f"point {point}: a deciding listener needs the rule set's labels (complyroute/policy/labels.py)")
    decision_timeout = settings.get("decision_timeout", "2s")
    context = {"sender": listener.sender}
    if listener.step:
        context["step"] = listener.step
    tokens = trust is not None and trust.label_tokens
    if tokens and listener.from_client:
        # The entry's OPA signs the labels it allows (data.complyroute.token holds its key); a
        # client's token or digest is dropped first, so only OPA's answer can set them.
        context["label_token"] = "issue"
        checks = [_removing([*DECIDED_HEADERS, LABEL_TOKEN_HEADER, DIGEST_HEADER, OVER_BOUND_HEADER]), request_bounds(labels)]
    elif tokens:
        # The labels come from the verified token, which the entry issued for bounded labels only.
        checks = [_removing([*DECIDED_HEADERS, OVER_BOUND_HEADER, *(header for header, _ in token_claims(labels))]), request_bounds(),
                  _label_token_check(trust, listener.name, labels)]
    else:
        checks = [_removing([*DECIDED_HEADERS, OVER_BOUND_HEADER]), request_bounds(labels)]
    filters = [
        *checks,
        {
            "name": "envoy.filters.http.ext_authz",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.ext_authz.v3.ExtAuthz",
                "transport_api_version": "V3",
                "grpc_service": {"envoy_grpc": {"cluster_name": "opa"}, "timeout": decision_timeout},
                "failure_mode_allow": False,
                "status_on_error": {"code": "ServiceUnavailable"},
                "with_request_body": {"max_request_bytes": MAX_RECORD_BYTES, "allow_partial_message": False},
                # The decision adds the routing header; the route is chosen again after it.
                "clear_route_cache": True,
            },
        },
    ]
    virtual_host = {
        "name": listener.name,
        "domains": ["*"],
        "typed_per_filter_config": {
            "envoy.filters.http.ext_authz": {
                "@type": EXT_AUTHZ_PER_ROUTE,
                "check_settings": {"context_extensions": context},
            }
        },
        # Every record this listener passes says who sent it, which point decided its hop and
        # when; the receiving service writes them into its audit line (complyroute/evidence/audit.py
        # checks them, and asks a rule that reads the clock at that time: this point's, not the
        # receiver's). Overwritten: a sender cannot choose them. The revision of the rule set that
        # decided (REVISION_HEADER) is the decision's own: OPA's answer sets it, or the
        # compiled route that stands for one.
        "request_headers_to_add": [
            {"header": {"key": key, "value": value}, "append_action": "OVERWRITE_IF_EXISTS_OR_ADD"}
            for key, value in [
                ("x-complyroute-sender", listener.sender),
                ("x-complyroute-decided-by", point),
                (DECIDED_AT_HEADER, DECIDED_AT),
            ]
        ] + ([RECORD_ID_FROM_TOKEN] if tokens and not listener.from_client else []),
        "retry_policy": retry_unsent(behind_ingress),
        # Only an ingress's own reply says the record was not delivered; nobody after this point reads it.
        "response_headers_to_remove": [UNDELIVERED_HEADER],
    }
    if matcher is None:
        virtual_host["routes"] = [decision_route(hop_timeout_of(settings)), *refusal_routes(deciding=True)]
    else:
        virtual_host["matcher"] = matcher
    return {
        "name": listener.name,
        "address": socket(listener.endpoint),
        "filter_chains": [filter_chain([_connection_manager(listener.name, filters, virtual_host, settings, listener.from_client, deciding=True,
                                                            logs=[access_log(log_path, point, listener.name, listener.sender, listener.step),
                                                                  hop_stats(listener.name)])],
                                      trust, listener.name)],
    }


# A forwarding listener takes the whole record before it forwards it, and refuses one over
# the limit itself (413 in the error contract): streamed on, an oversized body would be
# refused by the service while Envoy still sends, and the reset would answer 503.
WHOLE_RECORD = {
    "name": "envoy.filters.http.buffer",
    "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.buffer.v3.Buffer", "max_request_bytes": MAX_RECORD_BYTES},
}


def _forwarding_listener(listener: ForwardingListener, settings: dict, trust: PointTrust | None = None, point: str = "",
                         log_path: str = "/dev/stdout") -> dict:
    forward = record_route({"route": {"cluster": f"upstream-{listener.name}", "timeout": hop_timeout_of(settings)}})
    virtual_host = {"name": listener.name, "domains": ["*"], "routes": [forward, *refusal_routes(deciding=False)],
                    # The service cannot claim its record undelivered: only this listener's own reply can.
                    "response_headers_to_remove": [UNDELIVERED_HEADER]}
    return {
        "name": listener.name,
        "address": socket(listener.endpoint),
        "filter_chains": [filter_chain([_connection_manager(listener.name, [WHOLE_RECORD], virtual_host, settings,
                                                            logs=[access_log(log_path, point, listener.name)])], trust, listener.name)],
    }


def _ready_listener(point: EnforcementPoint, settings: dict) -> dict:
    """GET /ready answers 200 while Envoy serves (its listeners only accept once it is
    initialised); everything else 404. The deployment's and the kubelet's health check, so
    the admin interface stays on loopback."""
    health_check = {
        "name": "envoy.filters.http.health_check",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.health_check.v3.HealthCheck",
            "pass_through_mode": False,
            "headers": [{"name": ":path", "string_match": {"exact": READY_PATH}}],
        },
    }
    virtual_host = {"name": "ready", "domains": ["*"], "routes": [refusal_route("not-ready-check", 404, [], deciding=False)]}
    return {
        "name": "ready",
        "address": socket(point.ready),
        "filter_chains": [{"filters": [_connection_manager("ready", [health_check], virtual_host, settings)]}],
    }


def envoy_config(point: EnforcementPoint, engine: dict, matchers: dict[str, dict] | None = None, trust: PointTrust | None = None,
                 labels: tuple[Label, ...] = (), set_clusters: tuple[str, ...] = ()) -> dict:
    """Envoy bootstrap for one enforcement point.

    `matchers`: by deciding listener name, a route matcher tree (xds.type.matcher.v3.Matcher
    whose actions are routes) that replaces the listener's routes. `trust`: mutual TLS on
    every listener parts send to and every cluster but OPA's (which stays inside the point),
    and label tokens (identity.py); None: plain HTTP. `labels`: the rule set's label schema,
    whose headers a deciding listener bounds and writes a label token's claims into.
    `set_clusters`: the compliant sets of several instances the point routes to (by their names,
    contract.set_tiers), a cluster each beside every destination instance's own.
    """
    clusters = [cluster("opa", point.opa_grpc, http2=True)] if point.deciding else []
    clusters += [cluster(instance, endpoint, trust=trust) for instance, endpoint in sorted(point.destinations.items())]
    clusters += [set_cluster(name, point, trust) for name in sorted(set_clusters)]
    clusters += [cluster(f"upstream-{f.name}", f.upstream, trust=trust) for f in point.forwarding]
    clusters += metrics_clusters(point)
    listeners = [_deciding_listener(d, engine, (matchers or {}).get(d.name), point.name, trust, labels, point.destinations_behind_ingress,
                                    point.access_log)
                 for d in point.deciding]
    listeners += [_forwarding_listener(f, engine, trust, point.name, point.access_log) for f in point.forwarding]
    listeners.append(_ready_listener(point, engine))
    if point.metrics is not None:
        listeners.append(metrics_listener(point, trust))
    return {
        "node": {"id": point.name, "cluster": point.node},
        "admin": {"address": socket(point.admin)},
        "static_resources": {"listeners": listeners, "clusters": clusters},
    }


LISTENER = "type.googleapis.com/envoy.config.listener.v3.Listener"
LISTENERS_FILE = "listeners.json"


def split_listeners(envoy: dict, folder: str) -> tuple[dict, dict[str, str], str]:
    """Every listener of the bootstrap `envoy` into one file Envoy reads from `folder` (LDS from
    the filesystem, as split_routes does for routes): returns the bootstrap, which names the file
    instead, the file (LISTENERS_FILE: a compact JSON discovery response) and its version (a
    digest of the listeners, so a changed listener has a new one). `envoy` is left as it is.

    What a deciding listener filters depends on the rule set's labels (request_bounds,
    claim_to_headers): from a file, a reload that adds a label rewrites it, and Envoy updates the
    listeners whose content changed in place (the same socket; connections opened before are
    drained: each is closed after its next answer), without a restart. Every listener goes,
    the readiness one with them: a point is ready only once its listeners file was taken.
    """
    bootstrap = copy.deepcopy(envoy)
    resources = [{"@type": LISTENER, **listener} for listener in bootstrap["static_resources"].pop("listeners")]
    version = hashlib.sha256(json.dumps(resources, sort_keys=True).encode()).hexdigest()[:16]
    bootstrap["dynamic_resources"] = {"lds_config": {
        "path_config_source": {"path": f"{folder}/{LISTENERS_FILE}", "watched_directory": {"path": folder}},
        "resource_api_version": "V3",
    }}
    content = json.dumps({"version_info": version, "resources": resources}, separators=(",", ":"))
    return bootstrap, {LISTENERS_FILE: content}, version
