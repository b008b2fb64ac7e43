"""The answers an enforcement point's Envoy makes on its own: every one `{code, message,
request_id}` JSON, the same vocabulary as the services' (docs/architecture.md, the error
contract), by its local reply mappers (LOCAL_REPLIES); the policy's own denials keep OPA's body."""

from __future__ import annotations

from complyroute.proxy.contract import LABEL_TOKEN_HEADER, MAX_LABEL_BYTES, MAX_LABEL_VALUES, MAX_RECORD_BYTES

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
# (services/src/errors.js CODE_BY_STATUS), so a client reads one vocabulary whichever part refused.
REFUSALS = {
    400: ("BAD_REQUEST", "the enforcement point refused a malformed request"),
    404: ("NOT_FOUND", "the only route here is POST /process"),
    405: ("METHOD_NOT_ALLOWED", "a record is sent with POST"),
    408: ("REQUEST_TIMEOUT", "the request did not arrive in time"),
    413: ("BODY_TOO_LARGE", f"a record is at most {MAX_RECORD_BYTES} bytes"),
    426: ("UPGRADE_REQUIRED", "HTTP/1.1 or HTTP/2 is required"),
    431: ("HEADERS_TOO_LARGE", "the request headers are too large"),
}

# Set by the router, with 503, when a record reached no instance: none was healthy (UH: every
# instance of the compliant set ejected) or the last connection attempt failed (UF, after the
# retries inside the set, routes.RETRY_UNSENT).
REACHED_NO_INSTANCE = {"response_flag_filter": {"flags": ["UH", "UF"]}}
# A deciding listener's hop goes to the compliant set the decision gives (clusters.py
# set_cluster), and to nothing else: when none of its instances can be reached, this says so.
SET_DOWN = [
    _json_reply(REACHED_NO_INSTANCE, "COMPLIANT_INSTANCES_DOWN",
                "no instance the rules allow could be reached (%RESPONSE_CODE_DETAILS%); the record went to no instance"),
]
# A forwarding listener (a sidecar's ingress) that could not reach its own service says so in
# this header, so that the deciding point before it sends the record to another instance of the
# set (routes.retry_unsent); the ingress removes it from its service's answers, and the deciding
# point from what it answers, so only an ingress's own reply carries it.
UNDELIVERED_HEADER = "x-complyroute-undelivered"
INGRESS_DOWN = [
    {**_json_reply(REACHED_NO_INSTANCE, "COMPLIANT_INSTANCES_DOWN",
                   "no instance the rules allow could be reached (%RESPONSE_CODE_DETAILS% at the instance's own enforcement point, "
                   "after any other instance of the set); the record went to no instance"),
     "headers_to_add": [{"header": {"key": UNDELIVERED_HEADER, "value": "1"}, "append_action": "OVERWRITE_IF_EXISTS_OR_ADD"}]},
]

# Every answer Envoy or the plugin makes on its own is {code, message, request_id} JSON, like
# every other error in the system; %RESPONSE_CODE_DETAILS% says which check refused (for a
# codec error, before any request id exists, request_id is null). Denials by the policy (400,
# 451) carry OPA's body and keep it: a mapper's first match wins, so they are matched first.
def local_replies(deciding: bool) -> dict:
    """The local reply mappers of a listener: a deciding one's tell a compliant set that is down
    (SET_DOWN) from any other failure to deliver; a forwarding one's, which sends to its own
    service only, tell that service's being down to the deciding point before it (INGRESS_DOWN)."""
    mappers = LOCAL_REPLIES["mappers"]
    where = mappers.index(SET_DOWN[0])
    return {"mappers": mappers if deciding else [*mappers[:where], *INGRESS_DOWN, *mappers[where + 1:]]}


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
        *SET_DOWN,
        _json_reply(
            _status_at_least(500),
            "HOP_UNAVAILABLE",
            "the enforcement point could not deliver the record (%RESPONSE_CODE_DETAILS%)",
        ),
        *[_json_reply(_status_equal(status), code, f"{message} (%RESPONSE_CODE_DETAILS%)") for status, (code, message) in REFUSALS.items()],
        _json_reply(_status_at_least(400), "REQUEST_REFUSED", "the enforcement point refused the request (%RESPONSE_CODE_DETAILS%)"),
    ]
}
