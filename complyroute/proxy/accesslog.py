"""What an enforcement point's Envoy records of each request: a JSON access log line per request
at every listener that takes records (access_log), and the flags that make Envoy write them
promptly (ENVOY_FLAGS)."""

from __future__ import annotations

from complyroute.proxy.contract import REVISION_HEADER

# One JSON line per request a listener of a point takes (Envoy's file access log, written by its
# own flush thread, never on a request's path): what it decided and where the record went. The
# fields Envoy fills in per request; the listener's own (point, listener, sender, step) are added
# as constants (access_log). `revision` is the allowed hop's (the decision sets the header: OPA's
# answer or the compiled route standing for it; a sender's is removed before the decision),
# `denial_code` and `denial_revision` a denial's, as OPA's answer names them to Envoy
# (dynamic_metadata, policies/complyroute/envoy). `instance` is the endpoint the record went to
# (its hostname: clusters.py names each after its instance), `destination` its cluster: the
# compliant set or the instance. `details` says who answered (via_upstream: the next hop; else
# which check of this point refused, as in the error contract's messages).
ACCESS_LOG_FIELDS = {
    "time": "%START_TIME%",
    "record_id": "%REQ(X-REQUEST-ID)%",
    "peer": "%DOWNSTREAM_PEER_URI_SAN%",
    "status": "%RESPONSE_CODE%",
    "details": "%RESPONSE_CODE_DETAILS%",
    "flags": "%RESPONSE_FLAGS%",
    "destination": "%UPSTREAM_CLUSTER%",
    "instance": "%UPSTREAM_HOST_NAME%",
    "revision": f"%REQ({REVISION_HEADER})%",
    "denial_code": "%DYNAMIC_METADATA(envoy.filters.http.ext_authz:code)%",
    "denial_revision": "%DYNAMIC_METADATA(envoy.filters.http.ext_authz:revision)%",
    "duration_ms": "%DURATION%",
}


# Flags of every point's Envoy, wherever it runs: its access log lines reach their file within a
# second (Envoy's default, 10 s, left a trace just after a record without its hops).
ENVOY_FLAGS = ("--log-level", "warn", "--file-flush-interval-msec", "1000")


def access_log(path: str, point: str, listener: str, sender: str | None = None, step: str | None = None) -> dict:
    """The access log of one listener: a JSON line per request into `path` (ACCESS_LOG_FIELDS)."""
    constants = {"point": point, "listener": listener, **({"sender": sender} if sender else {}), **({"step": step} if step else {})}
    return {
        "name": "envoy.access_loggers.file",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog",
            "path": path,
            "log_format": {"json_format": {**constants, **ACCESS_LOG_FIELDS}},
        },
    }
