"""Mutual TLS and label tokens on Kubernetes: the trust of identity.py, with Secrets for files.

A render makes a new CA (pki.py, its key stays in memory), which issues one key and
certificate per part: per enforcement point as its pod runs it (a sidecar, the entry, the
central entity, the baseline gateway, one router DaemonSet), per service instance, and the
bundle server's (which also names its Service's DNS name: OPA checks the host it reaches). Each
becomes a Secret (tls.crt, tls.key, ca.crt) that only that part's containers mount, at
MOUNT, so every part reads its credential from the same three paths (FILES). The entry's
label-token signing key is a Secret too, which only the entry's OPA mounts as a second
data path (TOKEN_MOUNT): no private key is ever in a ConfigMap.

Who admits whom is read off the plan as locally (identity.Trust), with one difference:
Trust knows a part by the address it is reached at. On one machine every address is
unique (port blocks); in a cluster the pod's loopback is not. Every sidecar pod's service
listens on 127.0.0.1:3000 and its egress on 127.0.0.1:15002, so the trust is derived
from a copy of the plan in which a loopback address carries the name of its pod, and
each Envoy cluster is matched back to the real address it connects to.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace

from complyroute.topology.plan import Endpoint, EnforcementPoint, Plan, ServiceProcess
from complyroute.trust import identity

MOUNT = "/etc/complyroute/tls"
FILES = identity.TlsFiles(cert=f"{MOUNT}/tls.crt", key=f"{MOUNT}/tls.key", ca=f"{MOUNT}/ca.crt")
TOKEN_MOUNT = "/token"
TOKEN_FILE = "data.json"  # loaded by OPA at the root of data, beside the catalog: data.complyroute.token
# Secret files: read-only, for the owner (root) and the group, which is the pod's fsGroup
# (runtime/kubernetes/render.py's RUN_AS): the pod's user reads them, no other user does.
SECRET_MODE = 0o440
LOOPBACK = "127.0.0.1"
POD_LOOPBACK = ".pod-loopback"  # a loopback address as the trust sees it: "<pod>.pod-loopback"


def _in_pod(endpoint: Endpoint, pod: str) -> Endpoint:
    return replace(endpoint, host=pod + POD_LOOPBACK) if endpoint.reach == LOOPBACK else endpoint


def _url_in_pod(url: str | None, pod: str) -> str | None:
    if not url:
        return url
    scheme, rest = url.split("://", 1)
    host, port = rest.rsplit(":", 1)
    return f"{scheme}://{_in_pod(Endpoint(host, int(port)), pod).reach}:{port}"


def _point_in_pod(point: EnforcementPoint) -> EnforcementPoint:
    pod = point.group  # the workload it runs in: a sidecar in its service's pod, every other point in its own
    return replace(
        point,
        deciding=[replace(listener, endpoint=_in_pod(listener.endpoint, pod)) for listener in point.deciding],
        forwarding=[replace(f, endpoint=_in_pod(f.endpoint, pod), upstream=_in_pod(f.upstream, pod)) for f in point.forwarding],
        destinations={instance: _in_pod(endpoint, pod) for instance, endpoint in point.destinations.items()},
    )


def _service_in_pod(service: ServiceProcess) -> ServiceProcess:
    pod = service.instance.id
    return replace(service, endpoint=_in_pod(service.endpoint, pod), egress_url=_url_in_pod(service.egress_url, pod))


def _real(key: tuple[str, int]) -> tuple[str, int]:
    host, port = key
    return (LOOPBACK, port) if host.endswith(POD_LOOPBACK) else key


def tls_secret_name(part: str) -> str:
    return f"tls-{part}"


def token_secret_name(point: str) -> str:
    return f"token-{point}"


@dataclass(frozen=True)
class ClusterTrust:
    trust: identity.Trust  # over the pods' points, loopback addresses named by pod
    credentials: identity.Credentials
    points: dict[str, EnforcementPoint]  # by name, as the trust sees them
    services: dict[str, ServiceProcess]  # by instance id, likewise

    @classmethod
    def of(cls, plan: Plan, points: list[EnforcementPoint], name: str, bundle_server_host: str) -> ClusterTrust | None:
        """The trust of `points` (the enforcement points as their pods run them) and the
        plan's services, with a new CA named `name`, whose certificate for the bundle server
        also names `bundle_server_host` (its Service's DNS name, which OPA checks); None when
        the manifest turns mTLS off."""
        seen = Plan(plan.topology, plan.entry, [_point_in_pod(p) for p in points], [_service_in_pod(s) for s in plan.services])
        trust = identity.Trust.of(seen)
        if trust is None:
            return None
        return cls(trust, identity.Credentials.issue(trust, name, bundle_server_host),
                   {p.name: p for p in seen.points}, {s.instance.id: s for s in seen.services})

    def point(self, name: str) -> identity.PointTrust:
        """What the point's Envoy needs; its clusters are keyed by the addresses they connect to."""
        trust = self.trust.point(self.points[name], FILES, self.credentials.token_jwks)
        return replace(trust, upstream_identity={_real(key): who for key, who in trust.upstream_identity.items()})

    def service_environment(self, service: ServiceProcess) -> dict[str, str]:
        """TLS_CERT, TLS_KEY, TLS_CA (at MOUNT), the peers it admits, its egress over TLS."""
        return self.trust.service(self.services[service.instance.id], FILES).environment(service.egress_url)

    def tls_files(self, part_identity: str) -> dict[str, str]:
        """The files of a part's Secret (kubernetes.io/tls, plus the CA certificate)."""
        credential = self.credentials.parts[part_identity]
        return {"tls.crt": credential.cert_pem.decode(), "tls.key": credential.key_pem.decode(), "ca.crt": self.credentials.ca_pem.decode()}

    def point_tls_files(self, name: str) -> dict[str, str]:
        return self.tls_files(identity.point_identity(self.points[name]))

    def service_tls_files(self, instance_id: str) -> dict[str, str]:
        return self.tls_files(identity.service_identity(self.services[instance_id]))

    def token_files(self, name: str) -> dict[str, str] | None:
        """data.complyroute.token, with the private signing key, for the point that issues
        label tokens (the entry's OPA); None for every other point."""
        data = self.credentials.with_token_key(self.trust, self.points[name], {})
        if not data:
            return None
        return {TOKEN_FILE: json.dumps({"complyroute": {"token": data["complyroute"]["token"]}}, indent=2, sort_keys=True)}
