"""What every part of a deployment agrees on, whichever renders it: the headers a record travels
with, the path it is sent to, the limits on its size and its labels, and the timeouts of a hop.
Envoy's listeners (envoy.py), the routes (routes.py), the answers Envoy makes itself (replies.py),
the compiled engine and the services (services/src/) read them here."""

from __future__ import annotations

ROUTING_HEADER = "x-complyroute-destination"
# What the routing header names: the cluster of the compliant set a decision gives, its tiers in
# order, each tier's instance ids joined with MEMBER_SEPARATOR, the tiers with TIER_SEPARATOR
# (policies/complyroute/envoy/envoy.rego `set_name`); a set of one instance is its id.
TIER_SEPARATOR = "|"
MEMBER_SEPARATOR = ","


def set_tiers(name: str) -> list[list[str]]:
    """The tiers of instance ids a routing header's cluster name holds."""
    return [tier.split(MEMBER_SEPARATOR) for tier in name.split(TIER_SEPARATOR)]


def is_instance(name: str) -> bool:
    """Whether a routing header's cluster name is one instance's (else a set of several)."""
    return TIER_SEPARATOR not in name and MEMBER_SEPARATOR not in name

# The entry's signed label token, and the digest of the record it was issued for (the
# services check it against the bytes they receive); see trust/identity.py.
LABEL_TOKEN_HEADER = "x-complyroute-labels"
DIGEST_HEADER = "x-complyroute-digest"
# The revision of the rule set that decided a hop (complyroute/policy/bundles.py).
REVISION_HEADER = "x-complyroute-revision"
# The largest record any part accepts: Envoy's ext_authz buffer, the compiled engine's
# content-length matcher and the services' bodyLimit (services/src/schemas.js BODY_LIMIT) agree.
MAX_RECORD_BYTES = 64 * 1024
# The most request headers (pseudo-headers counted) a deciding listener takes before ext_authz
# (proxy/envoy.py request_bounds); more are refused with 431 (HEADERS_TOO_LARGE). A hop carries
# about 20; the rest of Envoy's bound of 100 is for the headers a decision adds.
MAX_REQUEST_HEADERS = 64
# The most a listener that decides nothing takes (a sidecar's ingress, readiness), in Envoy's
# codec: what a deciding point may pass on, MAX_REQUEST_HEADERS and the headers its decision
# added (about 20).
MAX_FORWARDED_HEADERS = 90
# The most a label header (each the rule set's label schema names, complyroute/policy/labels.py) may
# hold where a point reads labels from its sender (the entry; any deciding listener without
# label tokens): bytes, and values (commas + 1, repeated headers joined by commas). More is
# refused before OPA is asked (proxy/envoy.py request_bounds): the policy answers every unknown value with a
# reason of its own, so an unbounded header drew an answer some 55 times its size (3,000
# purposes, 934 kB).
MAX_LABEL_BYTES = 1024
MAX_LABEL_VALUES = 64
UPSTREAM_IDLE_TIMEOUT = "30s"
RECORD_PATH = "/process"


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


# The record's id, as the label token names it (its `rid` claim; proxy/envoy.py RECORD_CLAIMS).
RECORD_ID_HEADER = "x-complyroute-record-id"
