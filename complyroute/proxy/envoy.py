"""The one enforcement point every topology uses: an Envoy that asks OPA before a record moves.

A topology only decides *where* enforcement points stand and what each serves (see its
folder's placement.py); this module turns such a description into Envoy's and OPA's
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
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from complyroute.topology import localhttp
from complyroute.policy.labels import Label

if TYPE_CHECKING:
    from complyroute.trust.identity import PointTrust

ROUTING_HEADER = "x-complyroute-destination"
TOKEN_ISSUER = "complyroute-entry"
# The entry's signed label token, and the digest of the record it was issued for (the
# services check it against the bytes they receive); see identity.py.
LABEL_TOKEN_HEADER = "x-complyroute-labels"
DIGEST_HEADER = "x-complyroute-digest"
# The revision of the rule set that decided a hop (complyroute/bundles.py).
REVISION_HEADER = "x-complyroute-revision"
POLICY_QUERY = "complyroute/envoy/response"
# The largest record any part accepts: Envoy's ext_authz buffer, the compiled engine's
# content-length matcher and the services' bodyLimit (services/app.js BODY_LIMIT) agree.
MAX_RECORD_BYTES = 64 * 1024
# The most a label header (each the rule set's label schema names, complyroute/labels.py) may
# hold where a point reads labels from its sender (the entry; any deciding listener without
# label tokens): bytes, and values (commas + 1, repeated headers joined by commas). More is
# refused before OPA is asked (label_bound): the policy answers every unknown value with a
# reason of its own, so an unbounded header drew an answer some 55 times its size (3,000
# purposes, 934 kB).
MAX_LABEL_BYTES = 1024
MAX_LABEL_VALUES = 64
UPSTREAM_IDLE_TIMEOUT = "30s"
RECORD_PATH = "/process"
READY_PATH = "/ready"


def hop_timeout_of(settings: dict) -> str:
    """How long a hop may take, from a manifest's engine settings."""
    return settings.get("hop_timeout", "60s")


def _seconds(duration: str) -> float:
    if not duration.endswith("s") or duration.endswith("ms"):
        raise ValueError(f"durations are written in seconds, such as '2s' or '0.5s': got {duration!r}")
    return float(duration[:-1])


def receive_timeouts(settings: dict) -> tuple[str, str]:
    """(request_headers_timeout, request_timeout) of every listener, from the engine settings.

    A record is at most MAX_RECORD_BYTES, so its whole request arrives in well under a second
    from any sender that means to send it; a sender that stops half way must not hold a stream
    (and the point's buffer) for as long as a hop may take. `receive_timeout` (default: a
    tenth of the hop timeout, at most 10 s) bounds the headers; the whole request may take that
    plus one decision, since Envoy counts the ext_authz call (which holds the body) into it.
    Both answer 408 in the JSON error shape.
    """
    hop = _seconds(hop_timeout_of(settings))
    receive = _seconds(settings.get("receive_timeout", f"{min(hop / 10, 10.0):g}s"))
    decision = _seconds(settings.get("decision_timeout", "2s"))
    if receive + decision > hop:
        raise ValueError(f"receive_timeout ({receive:g}s) plus decision_timeout ({decision:g}s) exceed hop_timeout ({hop:g}s)")
    return f"{receive:g}s", f"{receive + decision:g}s"


@dataclass(frozen=True)
class Endpoint:
    """Where a part listens (`address`) and the name others reach it by (`host`), or the unix
    domain socket it listens on (`path`).

    On one machine the two are the same loopback address; on Kubernetes a part binds 0.0.0.0
    (or 127.0.0.1 inside its pod) and is reached by its Service's DNS name. What only a point's
    own processes may reach (Envoy's admin, OPA's decision port and REST API) is a socket in a
    folder that only they can open (`unix`), on either.
    """

    address: str
    port: int
    host: str = ""
    path: str = ""

    @classmethod
    def unix(cls, path: str | Path) -> Endpoint:
        return cls("", 0, path=str(path))

    @property
    def reach(self) -> str:
        return self.host or self.address

    @property
    def url(self) -> str:
        return localhttp.url(self.path) if self.path else f"http://{self.reach}:{self.port}"

    @property
    def listen(self) -> str:
        """The address as OPA's flags and its plugin's `addr` take it."""
        return f"unix://{self.path}" if self.path else f"{self.address}:{self.port}"


@dataclass(frozen=True)
class DecidingListener:
    name: str
    endpoint: Endpoint
    sender: str  # the instance or gateway the records come from, as the catalog names it
    step: str | None = None  # pinned target step; None: taken from the sender's x-complyroute-step header
    # Records come from outside (a client), not from a service: the body is unchecked until
    # this point's decision, so every engine asks OPA here.
    from_client: bool = False


@dataclass(frozen=True)
class ForwardingListener:
    name: str
    endpoint: Endpoint
    upstream: Endpoint


# What an enforcement point is to the rest of the house, set by the placement that makes it: the
# Kubernetes rendering, for one, runs each role as its own kind of workload (kubernetes/render.py).
ROLES = (
    "entry",  # on the gateway node, where clients send records: decides (or just forwards) the first hop
    "central",  # the entry and also the only way from one service to the next (central entity)
    "sidecar",  # beside one service instance, in its pod: decides the hops out of it
    "router",  # on a service node, shared by some of its services: decides the hops out of them
)


@dataclass
class EnforcementPoint:
    name: str
    node: str
    # Sockets in the point's private folder (Endpoint.unix; `private`), which only its own
    # processes open: Envoy's admin interface (for the control plane: reload, make bench), the
    # ext_authz server Envoy asks, and OPA's REST API (read-only: policies/system/authz).
    admin: Endpoint
    ready: Endpoint  # Envoy's readiness listener: GET /ready, its health check, and nothing else
    opa_grpc: Endpoint
    opa_http: Endpoint
    # OPA's --diagnostic-addr: /health?plugins is its health check, /metrics. A socket in the
    # private folder too, but on Kubernetes, where the kubelet probes it over TCP.
    opa_diagnostic: Endpoint
    concurrency: int = 1
    role: str = ""  # one of ROLES, which the placement gives (net.point); __post_init__ refuses any other
    # The points that run as one workload and are reached under one name: a sidecar's group is its
    # service instance's id (it runs in that pod); routers of one slot on every node share one group
    # (one DaemonSet); any other point is a group of its own, named as the point.
    group: str = ""
    deciding: list[DecidingListener] = field(default_factory=list)
    forwarding: list[ForwardingListener] = field(default_factory=list)
    destinations: dict[str, Endpoint] = field(default_factory=dict)  # instance id -> where it is reached
    catalog: dict = field(default_factory=dict)  # the catalog slice it decides with (its OPA loads it indexed: policydata)

    def __post_init__(self):
        if self.role not in ROLES:
            raise ValueError(f"enforcement point {self.name}: role {self.role!r} is not one of {list(ROLES)}")
        self.group = self.group or self.name

    @property
    def private(self) -> set[str]:
        """The folders of the point's sockets: only its own processes may open them."""
        endpoints = (self.admin, self.opa_grpc, self.opa_http, self.opa_diagnostic)
        return {str(Path(endpoint.path).parent) for endpoint in endpoints if endpoint.path}

    @property
    def opa_health_url(self) -> str:
        return f"{self.opa_diagnostic.url}/health?plugins"

    @property
    def opa_metrics_url(self) -> str:
        return f"{self.opa_diagnostic.url}/metrics"

    @property
    def envoy_ready_url(self) -> str:
        return f"{self.ready.url}{READY_PATH}"


# A socket Envoy listens on (its admin interface) is for its own user only.
OWNER_ONLY = 0o600


def _socket(endpoint: Endpoint) -> dict:
    if endpoint.path:
        return {"pipe": {"path": endpoint.path, "mode": OWNER_ONLY}}
    return {"socket_address": {"address": endpoint.address, "port_value": endpoint.port}}


def _is_ip(host: str) -> bool:
    return all(part.isdigit() for part in host.split(".")) and host.count(".") == 3


TLS_VERSIONS = {"tls_minimum_protocol_version": "TLSv1_3", "tls_maximum_protocol_version": "TLSv1_3"}


def _common_tls(trust: PointTrust, peers: tuple[str, ...]) -> dict:
    """This point's certificate, and the identities (URI SANs) the other side must present."""
    return {
        "tls_params": TLS_VERSIONS,
        "tls_certificates": [{"certificate_chain": {"filename": trust.files.cert}, "private_key": {"filename": trust.files.key}}],
        "validation_context": {
            "trusted_ca": {"filename": trust.files.ca},
            "match_typed_subject_alt_names": [{"san_type": "URI", "matcher": {"exact": peer}} for peer in peers],
        },
    }


def _upstream_tls(trust: PointTrust, identity: str) -> dict:
    return {
        "name": "envoy.transport_sockets.tls",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
            "common_tls_context": _common_tls(trust, (identity,)),
        },
    }


def _downstream_tls(trust: PointTrust, peers: tuple[str, ...]) -> dict:
    """Only a client certificate of the deployment's CA naming one of `peers` completes the handshake."""
    return {
        "name": "envoy.transport_sockets.tls",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext",
            "require_client_certificate": True,
            "common_tls_context": _common_tls(trust, peers),
        },
    }


def _filter_chain(filters: list, trust: PointTrust | None, listener: str) -> dict:
    peers = trust.listener_peers.get(listener, ()) if trust else ()
    chain = {"filters": filters}
    if peers:
        chain["transport_socket"] = _downstream_tls(trust, peers)
    return chain


def _cluster(name: str, endpoint: Endpoint, http2: bool = False, trust: PointTrust | None = None) -> dict:
    # A socket (the point's own OPA) or an address is used as it is; a name (a Kubernetes
    # Service) is resolved by DNS.
    address = {"pipe": {"path": endpoint.path}} if endpoint.path else _socket(Endpoint(endpoint.reach, endpoint.port))
    cluster = {
        "name": name,
        "type": "STATIC" if endpoint.path or _is_ip(endpoint.reach) else "STRICT_DNS",
        "connect_timeout": "1s",
        "load_assignment": {
            "cluster_name": name,
            "endpoints": [{"lb_endpoints": [{"endpoint": {"address": address}}]}],
        },
        # Envoy's default of 1024 pending requests would turn load peaks into 503s that
        # measure Envoy's defaults rather than the topology.
        "circuit_breakers": {
            "thresholds": [{"max_connections": 100000, "max_pending_requests": 100000, "max_requests": 100000}]
        },
    }
    cluster["typed_extension_protocol_options"] = {
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
            "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
            # Shorter than the services' keep-alive (Fastify: 72 s), so Envoy never reuses a
            # connection the service is closing.
            "common_http_protocol_options": {"idle_timeout": UPSTREAM_IDLE_TIMEOUT},
            "explicit_http_config": {"http2_protocol_options": {}} if http2 else {"http_protocol_options": {}},
        }
    }
    if trust is not None:
        cluster["transport_socket"] = _upstream_tls(trust, trust.upstream_identity[(endpoint.reach, endpoint.port)])
    return cluster


def _json_reply(status_filter: dict, code: str, message: str) -> dict:
    return {
        "filter": status_filter,
        "body_format_override": {
            "json_format": {"code": code, "message": message, "request_id": "%REQ(X-REQUEST-ID)%"}
        },
    }


def _status(op: str, value: int) -> dict:
    return {"status_code_filter": {"comparison": {"op": op, "value": {"default_value": value, "runtime_key": "complyroute_unused"}}}}


def _status_at_least(value: int) -> dict:
    return _status("GE", value)


def _status_equal(value: int) -> dict:
    return _status("EQ", value)


UAEX = {"response_flag_filter": {"flags": ["UAEX"]}}  # the answer is ext_authz's (a denial, or no decision)
TOKEN_SENT = {"header_filter": {"header": {"name": LABEL_TOKEN_HEADER, "present_match": True}}}
# Set on the request by LABEL_BOUND only, naming the label header it refused (a sender's value
# is removed before): what tells its 431 from the codec's.
OVER_BOUND_HEADER = "x-complyroute-label-over-bound"
OVER_BOUND = {"header_filter": {"header": {"name": OVER_BOUND_HEADER, "present_match": True}}}

# Envoy's own refusals, by status: the codes the services give the same statuses
# (services/app.js CODE_BY_STATUS), so a client reads one vocabulary whichever part refused.
REFUSALS = {
    400: ("BAD_REQUEST", "the enforcement point refused a malformed request"),
    404: ("NOT_FOUND", "the only route here is POST /process"),
    405: ("METHOD_NOT_ALLOWED", "a record is sent with POST"),
    408: ("REQUEST_TIMEOUT", "the request did not arrive in time"),
    413: ("BODY_TOO_LARGE", f"a record is at most {MAX_RECORD_BYTES} bytes"),
    426: ("UPGRADE_REQUIRED", "HTTP/1.1 or HTTP/2 is required"),
    431: ("HEADERS_TOO_LARGE", "the request headers are too large"),
}

# Every answer Envoy or the plugin makes on its own is {code, message, request_id} JSON, like
# every other error in the system; %RESPONSE_CODE_DETAILS% says which check refused (for a
# codec error, before any request id exists, request_id is null). Denials by the policy (400,
# 451) carry OPA's body and keep it: a mapper's first match wins, so they are matched first.
LOCAL_REPLIES = {
    "mappers": [
        # The policy's 451 reaches Envoy as 403 (ext_authz's status enum has no 451; see
        # wire_status in policies/complyroute/envoy/envoy.rego); restore it, body untouched.
        {"filter": {"and_filter": {"filters": [UAEX, _status_equal(403)]}}, "status_code": 451},
        _json_reply(
            {"and_filter": {"filters": [UAEX, _status_at_least(500)]}},
            "DECISION_UNAVAILABLE",
            "no policy decision could be obtained (%RESPONSE_CODE_DETAILS%); the record was not forwarded",
        ),
        # Any other ext_authz answer is the policy's denial: as OPA wrote it. (The plugin's own
        # plain-text 400, request_parse_error, comes from a path or query it cannot unescape;
        # only an exact `:path: /process` reaches ext_authz, so it never answers here.)
        {"filter": UAEX},
        # LABEL_BOUND's refusal: before the codec's 431, which it would otherwise take.
        _json_reply(
            {"and_filter": {"filters": [_status_equal(431), OVER_BOUND]}},
            "LABEL_TOO_LARGE",
            f"the label header %REQ({OVER_BOUND_HEADER})% holds more than {MAX_LABEL_BYTES} bytes or {MAX_LABEL_VALUES} values; "
            "the record was not let in",
        ),
        # jwt_authn's refusals. 403: the token verifies but names another listener (its `aud`).
        _json_reply(
            {"and_filter": {"filters": [_status_equal(403), TOKEN_SENT]}},
            "LABEL_TOKEN_ELSEWHERE",
            "the record's label token was issued for another hop or instance (%RESPONSE_CODE_DETAILS%); the record was not forwarded",
        ),
        # 401: the label token is absent, or does not verify (altered, expired, signed by
        # another key, malformed). The record goes no further.
        _json_reply(
            {"and_filter": {"filters": [_status_equal(401), TOKEN_SENT]}},
            "LABEL_TOKEN_INVALID",
            "the record's label token does not verify (%RESPONSE_CODE_DETAILS%); the record was not forwarded",
        ),
        _json_reply(
            _status_equal(401),
            "LABEL_TOKEN_MISSING",
            f"a record between services carries the label token the entry issued ({LABEL_TOKEN_HEADER}); the record was not forwarded",
        ),
        _json_reply(
            _status_at_least(500),
            "HOP_UNAVAILABLE",
            "the enforcement point could not deliver the record (%RESPONSE_CODE_DETAILS%)",
        ),
        *[_json_reply(_status_equal(status), code, f"{message} (%RESPONSE_CODE_DETAILS%)") for status, (code, message) in REFUSALS.items()],
        _json_reply(_status_at_least(400), "REQUEST_REFUSED", "the enforcement point refused the request (%RESPONSE_CODE_DETAILS%)"),
    ]
}

EXT_AUTHZ_PER_ROUTE = "type.googleapis.com/envoy.extensions.filters.http.ext_authz.v3.ExtAuthzPerRoute"
EXT_AUTHZ_DISABLED = {"envoy.filters.http.ext_authz": {"@type": EXT_AUTHZ_PER_ROUTE, "disabled": True}}

# What a listener takes, as (header, string match) pairs that both a route's header matchers
# and the compiled engine's matcher tree express: a record is POST /process, exactly (no
# query string, whose escapes the plugin could not parse). A request that matches none of
# REQUEST_FORMS' predicates is answered 404.
A_RECORD = [(":method", {"exact": "POST"}), (":path", {"exact": RECORD_PATH})]
REQUEST_FORMS = [
    # (name, predicates, status): tried in order after A_RECORD.
    ("query-string", [(":method", {"exact": "POST"}), (":path", {"safe_regex": {"regex": r"/process\?.*"}})], 400),
    ("not-post", [(":path", {"safe_regex": {"regex": r"/process(\?.*)?"}})], 405),
]


def refusal_route(name: str, status: int, predicates: list, deciding: bool) -> dict:
    """A route answering `status` from Envoy itself (the local reply mappers write the body)."""
    route = {
        "name": name,
        "match": {"prefix": "/", "headers": [{"name": header, "string_match": match} for header, match in predicates]},
        "direct_response": {"status": status},
    }
    if status == 405:
        route["response_headers_to_add"] = [{"header": {"key": "allow", "value": "POST"}, "append_action": "OVERWRITE_IF_EXISTS_OR_ADD"}]
    if deciding:  # nothing to decide: OPA is not asked
        route["typed_per_filter_config"] = EXT_AUTHZ_DISABLED
    return route


def refusal_routes(deciding: bool) -> list[dict]:
    """What a listener answers to anything that is not a record, in order, after the record's route."""
    return [refusal_route(name, status, predicates, deciding) for name, predicates, status in REQUEST_FORMS] + [
        refusal_route("not-a-record", 404, [], deciding)
    ]


def record_route(route: dict) -> dict:
    """The route of a record (`route`: its action and settings)."""
    return {"match": {"prefix": "/", "headers": [{"name": h, "string_match": m} for h, m in A_RECORD]}, **route}


ENTRY_FORGETS_REQUEST_ID = {
    "name": "entry-forgets-request-id",
    "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.http.early_header_mutation.header_mutation.v3.HeaderMutation",
        "mutations": [{"remove": "x-request-id"}],
    },
}


def _connection_manager(stat_prefix: str, http_filters: list, virtual_host: dict, settings: dict, from_client: bool = False) -> dict:
    headers_timeout, request_timeout = receive_timeouts(settings)
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
            "route_config": {"name": stat_prefix, "virtual_hosts": [virtual_host]},
            # At the entry, a client's id is removed before Envoy generates the record's.
            **({"early_header_mutation_extensions": [ENTRY_FORGETS_REQUEST_ID]} if from_client else {}),
            "http_filters": http_filters + [
                {"name": "envoy.filters.http.router", "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}
            ],
            "local_reply_config": LOCAL_REPLIES,
        },
    }


def decision_route(hop_timeout: str) -> dict:
    """The route of a record whose hop OPA decides: to the instance its decision names."""
    return record_route({"route": {"cluster_header": ROUTING_HEADER, "timeout": hop_timeout}})


def decided_route(destination: str, hop_timeout: str, revision: str) -> dict:
    """The route of a record whose hop was decided ahead of time: no call to OPA. It names the
    revision of the rule set that decided it, as OPA's answer does on the decision route."""
    return record_route({
        "route": {"cluster": destination, "timeout": hop_timeout},
        "typed_per_filter_config": EXT_AUTHZ_DISABLED,
        "request_headers_to_add": [{"header": {"key": REVISION_HEADER, "value": revision}, "append_action": "OVERWRITE_IF_EXISTS_OR_ADD"}],
    })


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
RECORD_ID_HEADER = "x-complyroute-record-id"
RECORD_CLAIMS = [(RECORD_ID_HEADER, "rid"), (DIGEST_HEADER, "digest")]
# A record goes on under the id its token names (the entry's), whatever x-request-id its
# sender sent; the sender's stays on anything refused before, so the refusal names it.
RECORD_ID_FROM_TOKEN = {"header": {"key": "x-request-id", "value": f"%REQ({RECORD_ID_HEADER})%"},
                        "append_action": "OVERWRITE_IF_EXISTS_OR_ADD"}


# Refuses, before ext_authz, a request whose label header exceeds the bounds (431, answered as
# LABEL_TOO_LARGE by the local reply mappers). Lua, since neither a route nor a matcher can
# measure a header: a regular expression would be RE2's, whose `.` and `[^,]` match no byte
# of invalid UTF-8, which the codec lets through.
LABEL_BOUND_LUA = f"""
function envoy_on_request(handle)
  local headers = handle:headers()
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
end
"""


def token_claims(labels: tuple[Label, ...]) -> list[tuple[str, str]]:
    """(header, claim) of every claim of a label token jwt_authn writes into a header."""
    return [(label.header, label.name) for label in labels] + RECORD_CLAIMS


def label_bound(labels: tuple[Label, ...]) -> dict:
    """The Lua filter bounding every label header (LABEL_BOUND_LUA, the headers named before it)."""
    names = ", ".join(json.dumps(label.header) for label in labels)
    return {
        "name": "envoy.filters.http.lua",
        "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua",
                         "default_source_code": {"inline_string": f"local LABEL_HEADERS = {{{names}}}\n{LABEL_BOUND_LUA}"}},
    }


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


def _deciding_listener(listener: DecidingListener, settings: dict, matcher: dict | None, point: str, trust: PointTrust | None,
                       labels: tuple[Label, ...]) -> dict:
    if not labels:
        raise ValueError(f"point {point}: a deciding listener needs the rule set's labels (complyroute/labels.py)")
    decision_timeout = settings.get("decision_timeout", "2s")
    context = {"sender": listener.sender}
    if listener.step:
        context["step"] = listener.step
    tokens = trust is not None and trust.label_tokens
    if tokens and listener.from_client:
        # The entry's OPA signs the labels it allows (data.complyroute.token holds its key); a
        # client's token or digest is dropped first, so only OPA's answer can set them.
        context["label_token"] = "issue"
        checks = [_removing([ROUTING_HEADER, LABEL_TOKEN_HEADER, DIGEST_HEADER, OVER_BOUND_HEADER]), label_bound(labels)]
    elif tokens:
        # The labels come from the verified token, which the entry issued for bounded labels only.
        checks = [_removing([ROUTING_HEADER, *(header for header, _ in token_claims(labels))]), _label_token_check(trust, listener.name, labels)]
    else:
        checks = [_removing([ROUTING_HEADER, OVER_BOUND_HEADER]), label_bound(labels)]
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
        # Every record this listener passes says who sent it and which point decided its hop;
        # the receiving service writes them into its audit line (complyroute/audit.py checks
        # them). Overwritten: a sender cannot choose them. The revision of the rule set that
        # decided (REVISION_HEADER) is the decision's own: OPA's answer sets it, or the
        # compiled route that stands for one.
        "request_headers_to_add": [
            {"header": {"key": key, "value": value}, "append_action": "OVERWRITE_IF_EXISTS_OR_ADD"}
            for key, value in [
                ("x-complyroute-sender", listener.sender),
                ("x-complyroute-decided-by", point),
            ]
        ] + ([RECORD_ID_FROM_TOKEN] if tokens and not listener.from_client else []),
    }
    if matcher is None:
        virtual_host["routes"] = [decision_route(hop_timeout_of(settings)), *refusal_routes(deciding=True)]
    else:
        virtual_host["matcher"] = matcher
    return {
        "name": listener.name,
        "address": _socket(listener.endpoint),
        "filter_chains": [_filter_chain([_connection_manager(listener.name, filters, virtual_host, settings, listener.from_client)], trust, listener.name)],
    }


# A forwarding listener takes the whole record before it forwards it, and refuses one over
# the limit itself (413 in the error contract): streamed on, an oversized body would be
# refused by the service while Envoy still sends, and the reset would answer 503.
WHOLE_RECORD = {
    "name": "envoy.filters.http.buffer",
    "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.buffer.v3.Buffer", "max_request_bytes": MAX_RECORD_BYTES},
}


def _forwarding_listener(listener: ForwardingListener, settings: dict, trust: PointTrust | None = None) -> dict:
    forward = record_route({"route": {"cluster": f"upstream-{listener.name}", "timeout": hop_timeout_of(settings)}})
    virtual_host = {"name": listener.name, "domains": ["*"], "routes": [forward, *refusal_routes(deciding=False)]}
    return {
        "name": listener.name,
        "address": _socket(listener.endpoint),
        "filter_chains": [_filter_chain([_connection_manager(listener.name, [WHOLE_RECORD], virtual_host, settings)], trust, listener.name)],
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
        "address": _socket(point.ready),
        "filter_chains": [{"filters": [_connection_manager("ready", [health_check], virtual_host, settings)]}],
    }


def envoy_config(point: EnforcementPoint, engine: dict, matchers: dict[str, dict] | None = None, trust: PointTrust | None = None,
                 labels: tuple[Label, ...] = ()) -> dict:
    """Envoy bootstrap for one enforcement point.

    `matchers`: by deciding listener name, a route matcher tree (xds.type.matcher.v3.Matcher
    whose actions are routes) that replaces the listener's routes. `trust`: mutual TLS on
    every listener parts send to and every cluster but OPA's (which stays inside the point),
    and label tokens (identity.py); None: plain HTTP. `labels`: the rule set's label schema,
    whose headers a deciding listener bounds and writes a label token's claims into.
    """
    clusters = [_cluster("opa", point.opa_grpc, http2=True)] if point.deciding else []
    clusters += [_cluster(instance, endpoint, trust=trust) for instance, endpoint in sorted(point.destinations.items())]
    clusters += [_cluster(f"upstream-{f.name}", f.upstream, trust=trust) for f in point.forwarding]
    listeners = [_deciding_listener(d, engine, (matchers or {}).get(d.name), point.name, trust, labels) for d in point.deciding]
    listeners += [_forwarding_listener(f, engine, trust) for f in point.forwarding]
    listeners.append(_ready_listener(point, engine))
    return {
        "node": {"id": point.name, "cluster": point.node},
        "admin": {"address": _socket(point.admin)},
        "static_resources": {"listeners": listeners, "clusters": clusters},
    }


ROUTE_CONFIGURATION = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration"


def split_routes(envoy: dict, folder: str, version: str = "1", listeners: set[str] | None = None) -> tuple[dict, dict[str, str]]:
    """The route configurations of `listeners` (None: every listener) out of the bootstrap
    `envoy`, into files Envoy reads from `folder` (RDS from the filesystem): returns the
    bootstrap, whose connection managers name their file instead, and the files,
    `<listener>.json` each, as compact JSON discovery responses of `version`. `envoy` itself
    is left as it is.

    Envoy watches `folder` and reads a route configuration again when a file is moved into it
    (a rename: reload.py's rewrite, or Kubernetes swapping a ConfigMap volume's contents), so
    a listener's routes change without a restart and without a dropped request. Each file
    costs its Envoy an inotify instance, of the 128 a user holds by default
    (fs.inotify.max_user_instances): a deployment moves only the routes that change with the
    rule set (rule_set_routes).
    """
    bootstrap = copy.deepcopy(envoy)
    files: dict[str, str] = {}
    for listener in bootstrap["static_resources"]["listeners"]:
        if listeners is not None and listener["name"] not in listeners:
            continue
        for chain in listener["filter_chains"]:
            for network_filter in chain["filters"]:
                manager = network_filter["typed_config"]
                if "route_config" not in manager:
                    continue
                name = f"{listener['name']}.json"
                if name in files:
                    raise ValueError(f"listener {listener['name']} has more than one route configuration")
                route_config = manager["route_config"]
                rds = {
                    "route_config_name": route_config["name"],
                    "config_source": {
                        "path_config_source": {"path": f"{folder}/{name}", "watched_directory": {"path": folder}},
                        "resource_api_version": "V3",
                    },
                }
                # In route_config's place, so the manager's fields keep their order.
                network_filter["typed_config"] = dict(("rds", rds) if key == "route_config" else (key, value) for key, value in manager.items())
                files[name] = json.dumps({"version_info": version, "resources": [{"@type": ROUTE_CONFIGURATION, **route_config}]},
                                         separators=(",", ":"))
    return bootstrap, files


def rule_set_routes(envoy: dict) -> set[str]:
    """The listeners whose routes hold decisions of the rule set: those with the compiled
    engine's matcher tree (its leaves are OPA's answers, and name their revision). Every other
    route configuration is the same whatever the rule set says."""
    return {
        listener["name"]
        for listener in envoy["static_resources"]["listeners"]
        for chain in listener["filter_chains"]
        for network_filter in chain["filters"]
        if any("matcher" in host for host in network_filter["typed_config"].get("route_config", {}).get("virtual_hosts", []))
    }


def write_data(data_dir: Path, document: dict) -> None:
    """Write the document a point's OPA loads beside the rule set, given data_dir as data."""
    data_dir.mkdir(parents=True, exist_ok=True)
    path = data_dir / "data.json"
    # The entry's holds the label-token signing key: readable by its owner (OPA's user) only.
    path.touch(mode=0o600)
    path.write_text(json.dumps(document, indent=2, sort_keys=True))


@dataclass(frozen=True)
class BundleSource:
    """Where a point's OPA fetches its bundle (complyroute/bundleserver.py), and, with mutual
    TLS, the CA that server's certificate is checked against and the point's own credential."""

    url: str  # http(s)://host:port of the bundle server
    ca: str | None = None
    cert: str | None = None
    key: str | None = None


BUNDLE_NAME = "complyroute"
# How long the bundle server may hold a request for a new bundle (long polling): a new bundle
# arrives as soon as it is written; an idle OPA asks again this often.
LONG_POLLING_SECONDS = 30


def bundle_config(point: EnforcementPoint, source: BundleSource) -> dict:
    """OPA's `services` and `bundles`: the point's bundle, long-polled from the bundle server."""
    service = {"url": source.url}
    if source.ca:
        service["tls"] = {"ca_cert": source.ca}
        service["credentials"] = {"client_tls": {"cert": source.cert, "private_key": source.key}}
    return {
        "services": {"control": service},
        "bundles": {
            BUNDLE_NAME: {
                "service": "control",
                "resource": f"bundles/{point.name}.tar.gz",
                # Between failed fetches (the server unreachable); long polling otherwise.
                "polling": {"min_delay_seconds": 1, "max_delay_seconds": 2, "long_polling_timeout_seconds": LONG_POLLING_SECONDS},
            }
        },
    }


def opa_config(point: EnforcementPoint, bundles: BundleSource | None = None, decision_logs: str = "off") -> dict:
    """OPA configuration: the Envoy ext_authz gRPC server answering with the policy's response,
    deciding with the bundle `bundles` serves (None: with the rule set given on the command line).

    decision_logs "file": every decision as a JSON line ("msg": "Decision Log") on OPA's console
    logger, which writes whatever the log level, into the point's OPA log; masked by
    policies/system/log (no record body, no label token). Console only: with a decision_logs
    section and no console, OPA would upload decisions to its one service, the bundle server.
    """
    return {
        **(bundle_config(point, bundles) if bundles else {}),
        **({"decision_logs": {"console": True}} if decision_logs == "file" else {}),
        "plugins": {
            "envoy_ext_authz_grpc": {
                # A socket in the point's private folder (Endpoint.unix): only its own Envoy
                # asks. Anyone else reaching it could have any input decided, and at the entry
                # signed: a label token over labels of their choosing.
                "addr": point.opa_grpc.listen,
                "path": POLICY_QUERY,
                # The policy parses the body itself so a malformed record gets a clear 400
                # instead of an evaluation error.
                "skip-request-body-parse": True,
                # grpc_request_duration_seconds on the diagnostic address's /metrics: what a decision costs inside the
                # plugin, beside the policy's evaluation alone (make bench shows both).
                "enable-performance-metrics": True,
            }
        },
    }
