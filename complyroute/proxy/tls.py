"""Mutual TLS between the parts, as Envoy takes it: TLS 1.3 only, each side's certificate from the
deployment's CA, and the identities (URI SANs) the other side must present (trust/identity.py
PointTrust says which)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from complyroute.trust.identity import PointTrust

TLS_VERSIONS = {"tls_minimum_protocol_version": "TLSv1_3", "tls_maximum_protocol_version": "TLSv1_3"}


def common_tls(trust: PointTrust, peers: tuple[str, ...]) -> dict:
    """This point's certificate, and the identities (URI SANs) the other side must present."""
    return {
        "tls_params": TLS_VERSIONS,
        "tls_certificates": [{"certificate_chain": {"filename": trust.files.cert}, "private_key": {"filename": trust.files.key}}],
        "validation_context": {
            "trusted_ca": {"filename": trust.files.ca},
            "match_typed_subject_alt_names": [{"san_type": "URI", "matcher": {"exact": peer}} for peer in peers],
        },
    }


def upstream_tls(trust: PointTrust, identity: str) -> dict:
    return {
        "name": "envoy.transport_sockets.tls",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
            "common_tls_context": common_tls(trust, (identity,)),
        },
    }


def downstream_tls(trust: PointTrust, peers: tuple[str, ...]) -> dict:
    """Only a client certificate of the deployment's CA naming one of `peers` completes the handshake."""
    return {
        "name": "envoy.transport_sockets.tls",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext",
            "require_client_certificate": True,
            "common_tls_context": common_tls(trust, peers),
        },
    }


def filter_chain(filters: list, trust: PointTrust | None, listener: str) -> dict:
    peers = trust.listener_peers.get(listener, ()) if trust else ()
    chain = {"filters": filters}
    if peers:
        chain["transport_socket"] = downstream_tls(trust, peers)
    return chain
