"""An enforcement point's OPA: its configuration (the Envoy ext_authz gRPC server on the point's
socket, decision logs), where it fetches its bundle (bundle_config), and the document it loads
beside the rule set (write_data)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from complyroute.policy.bundles import SIGNING_ALGORITHM, SIGNING_KEY_ID
from complyroute.topology.plan import EnforcementPoint

POLICY_QUERY = "complyroute/envoy/response"


def write_data(data_dir: Path, document: dict) -> None:
    """Write the document a point's OPA loads beside the rule set, given data_dir as data."""
    data_dir.mkdir(parents=True, exist_ok=True)
    path = data_dir / "data.json"
    # The entry's holds the label-token signing key: readable by its owner (OPA's user) only.
    path.touch(mode=0o600)
    path.write_text(json.dumps(document, indent=2, sort_keys=True))


@dataclass(frozen=True)
class BundleSource:
    """Where a point's OPA fetches its bundle (complyroute/policy/bundleserver.py), the public key
    its bundles are signed for (policy/bundles.py verification_key, PEM), and, with mutual TLS, the
    CA that server's certificate is checked against and the point's own credential."""

    url: str  # http(s)://host:port of the bundle server
    verification_key: str
    ca: str | None = None
    cert: str | None = None
    key: str | None = None


BUNDLE_NAME = "complyroute"
# How long the bundle server may hold a request for a new bundle (long polling): a new bundle
# arrives as soon as it is written; an idle OPA asks again this often.
LONG_POLLING_SECONDS = 30


def bundle_config(point: EnforcementPoint, source: BundleSource) -> dict:
    """OPA's `services`, `bundles` and `keys`: the point's bundle, long-polled from the bundle
    server, activated only once its signature verifies against the deployment's key; and the
    status plugin's Prometheus metrics, where a refused bundle shows with OPA's reason
    (bundle_failed_load_counter) on the diagnostic address's /metrics."""
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
                # A key id, not an empty block: OPA before 1.21.3 required the signature only
                # when the block names one (GHSA-g2pf-6v5v-qcc8).
                "signing": {"keyid": SIGNING_KEY_ID},
            }
        },
        "keys": {SIGNING_KEY_ID: {"algorithm": SIGNING_ALGORITHM, "key": source.verification_key}},
        # Prometheus only: without it (or console logs), OPA would send status to its one service.
        "status": {"prometheus": True},
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
