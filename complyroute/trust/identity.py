"""Who may talk to whom in a deployment, derived from its plan, and the credentials for it.

A placement says where records go: each point's destinations and forwarding upstreams, each
service's egress URL. Those are the only connections a deployment makes, so they are the
only ones its parts accept: with mutual TLS on (the manifest's `security.mtls`, on by
default), a listener or a service admits exactly the parts whose plan sends to it, by the
identity in their certificate, and a part checks that whatever it sends to presents the
identity the plan expects there. Nothing here is per topology: it is read off the plan.

So a service only takes records from the enforcement point(s) that decide hops into it
(or, in a sidecar topology, from its own sidecar, whose ingress only takes them from the
points that decide hops into the instance), and a point's deciding listener only from the
one sender it decides for: the sender OPA is told (ext_authz's source principal) is the
verified peer, not the port.

Label tokens (`security.label_tokens`, on by default where points decide): the entry's OPA
signs the record's labels, its request id and the digest of its bytes (ES256); every later
deciding listener verifies the token with Envoy's jwt_authn and decides on its claims
(proxy/envoy.py), and the receiving service checks the digest (services/src/label-tokens.js).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from complyroute.files import write_whole
from complyroute.topology.plan import METRICS_LISTENER, Endpoint, EnforcementPoint, Plan, ServiceProcess
from complyroute.trust import pki

# The issuer a label token names (`iss`): the entry's OPA signs it, every later deciding listener
# checks it (proxy/envoy.py).
TOKEN_ISSUER = "complyroute-entry"


@dataclass(frozen=True)
class TlsFiles:
    """Where one part reads its key, its certificate and the deployment's CA."""

    cert: str
    key: str
    ca: str


@dataclass(frozen=True)
class PointTrust:
    """What an enforcement point's Envoy (and the entry's OPA) need for mTLS and label tokens."""

    files: TlsFiles
    listener_peers: dict[str, tuple[str, ...]]  # listener name -> identities admitted; () = clients (plain HTTP)
    upstream_identity: dict[tuple[str, int], str]  # (host, port) reached -> identity it must present
    label_tokens: bool
    jwks: str  # the public key set label tokens are verified with (JSON)
    token_lifetime_seconds: int
    # Deciding listener name -> the audience a label token must name to be taken there
    # (Trust.audience); every listener that verifies tokens has one.
    token_audiences: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ServiceTrust:
    files: TlsFiles
    record_peers: tuple[str, ...]
    control_peers: tuple[str, ...]
    egress_identity: str | None
    label_tokens: bool
    monitoring_peers: tuple[str, ...] = ()  # who may read GET /metrics

    def environment(self, egress_url: str | None) -> dict[str, str]:
        """The service's TLS configuration (services/config.js reads it); its egress over TLS."""
        env = {
            "TLS_CERT": self.files.cert,
            "TLS_KEY": self.files.key,
            "TLS_CA": self.files.ca,
            "RECORD_PEERS": ",".join(self.record_peers),
            "CONTROL_PEERS": ",".join(self.control_peers),
            "MONITORING_PEERS": ",".join(self.monitoring_peers),
        }
        if self.egress_identity:
            env["EGRESS_IDENTITY"] = self.egress_identity
            env["EGRESS_URL"] = "https://" + egress_url.split("://", 1)[1]
        if self.label_tokens:
            env["LABEL_TOKENS"] = "1"
        return env


# The audiences of label tokens (Trust.audience): a first-step instance's deciding listener, a
# later step's deciding listeners.
TOKEN_INSTANCE = pki.spiffe_id("service", "") + "/"
TOKEN_STEP = pki.spiffe_id("step", "") + "/"


def point_identity(point: EnforcementPoint) -> str:
    return pki.spiffe_id("point", point.name)


def service_identity(service: ServiceProcess) -> str:
    return pki.spiffe_id("service", service.instance.id)


def _key(endpoint: Endpoint) -> tuple[str, int]:
    return (endpoint.reach, endpoint.port)


def _url_key(url: str) -> tuple[str, int]:
    host, port = url.split("://", 1)[1].rsplit(":", 1)
    return (host, int(port))


@dataclass
class Trust:
    """The deployment's identities and who admits whom, derived from a plan."""

    plan: Plan
    label_tokens: bool
    # A token outlives a record's journey (a hop's timeout is 60 s by default; a journey past
    # it is refused as expired, closed) and stays within the services' replay window
    # (services/src/label-tokens.js REPLAY_WINDOW).
    token_lifetime_seconds: int = 120
    owner: dict[tuple[str, int], str] = field(default_factory=dict)  # endpoint -> identity listening there
    senders: dict[tuple[str, int], set[str]] = field(default_factory=dict)  # endpoint -> identities sending to it

    def __post_init__(self):
        for point in self.plan.points:
            for listener in [*point.deciding, *point.forwarding]:
                self.owner[_key(listener.endpoint)] = point_identity(point)
            for endpoint in point.destinations.values():
                self.senders.setdefault(_key(endpoint), set()).add(point_identity(point))
            for listener in point.forwarding:
                self.senders.setdefault(_key(listener.upstream), set()).add(point_identity(point))
        for service in self.plan.services:
            self.owner[_key(service.endpoint)] = service_identity(service)
            if service.egress_url:
                self.senders.setdefault(_url_key(service.egress_url), set()).add(service_identity(service))

    @classmethod
    def of(cls, plan: Plan) -> Trust | None:
        """The plan's trust, or None when its manifest turns mutual TLS off."""
        security = plan.topology.security
        if not security["mtls"]:
            return None
        decides = any(point.deciding for point in plan.points)
        return cls(plan, label_tokens=security["label_tokens"] and decides)

    def peers(self, endpoint: Endpoint) -> tuple[str, ...]:
        return tuple(sorted(self.senders.get(_key(endpoint), ())))

    def audience(self, sender: str) -> str:
        """Where a label token may be used, as its `aud` names it: the deciding listener of the
        instance `sender`, which only that instance's certificate reaches.

        The entry issues one token per record and knows only the first hop's instance (it
        chose it); each later hop's instance is chosen by the point before it, which under
        envoy-compiled asks no OPA and holds no key. So a first-step instance's listener takes
        only tokens naming that instance (TOKEN_INSTANCE), a later step's listener those naming
        its step (TOKEN_STEP): the entry names the instance it routes to and every later step
        of the chain (data.complyroute.token.audience)."""
        step = next(instance.step for instance in self.plan.topology.instances if instance.id == sender)
        if step == self.plan.topology.steps[0]:
            return TOKEN_INSTANCE + sender
        return TOKEN_STEP + step

    def token_audience(self) -> dict:
        """What the entry's OPA names in a token's `aud` (policies/complyroute/envoy): the first
        hop's instance after this prefix, then every later step but the last (which sends nothing on)."""
        return {"first_hop": TOKEN_INSTANCE, "later_steps": [TOKEN_STEP + step for step in self.plan.topology.steps[1:-1]]}

    def point(self, point: EnforcementPoint, files: TlsFiles, jwks: dict) -> PointTrust:
        # Clients send to the entry (a deciding listener from_client, or the baseline's
        # forwarding one, which nothing in the plan sends to): plain HTTP, no peers.
        listener_peers = {listener.name: () if getattr(listener, "from_client", False) else self.peers(listener.endpoint)
                          for listener in [*point.deciding, *point.forwarding]}
        if point.metrics is not None:  # its metrics listener admits the scraper only
            listener_peers[METRICS_LISTENER] = (pki.MONITORING,)
        upstreams = [*point.destinations.values(), *(f.upstream for f in point.forwarding)]
        return PointTrust(
            files=files,
            listener_peers=listener_peers,
            upstream_identity={_key(e): self.owner[_key(e)] for e in upstreams},
            label_tokens=self.label_tokens,
            jwks=json.dumps(jwks, sort_keys=True),
            token_lifetime_seconds=self.token_lifetime_seconds,
            token_audiences={listener.name: self.audience(listener.sender) for listener in point.deciding
                             if self.label_tokens and not listener.from_client},
        )

    def service(self, service: ServiceProcess, files: TlsFiles) -> ServiceTrust:
        return ServiceTrust(
            files=files,
            record_peers=self.peers(service.endpoint),
            control_peers=(pki.CONTROL,),
            monitoring_peers=(pki.MONITORING,),
            egress_identity=self.owner[_url_key(service.egress_url)] if service.egress_url else None,
            label_tokens=self.label_tokens,
        )


@dataclass(frozen=True)
class Credentials:
    """A deployment's CA certificate, every part's credential, and the label-token key."""

    ca_pem: bytes
    parts: dict[str, pki.Credential]  # identity -> credential
    token_jwk: dict  # private (the entry's OPA signs with it)
    token_jwks: dict  # public (every later point verifies with it)

    @classmethod
    def issue(cls, trust: Trust, name: str, bundle_server_host: str = "127.0.0.1") -> Credentials:
        """Every part's credential; the bundle server's also names the host OPAs reach it by."""
        ca = pki.CertificateAuthority(name)
        identities = [point_identity(p) for p in trust.plan.points] + [service_identity(s) for s in trust.plan.services] + [pki.CONTROL,
                                                                                                                       pki.MONITORING]
        jwk, jwks = pki.signing_key()
        parts = {identity: ca.issue(identity) for identity in identities}
        parts[pki.BUNDLE_SERVER] = ca.issue(pki.BUNDLE_SERVER, hosts=(bundle_server_host,))
        return cls(ca.cert_pem, parts, jwk, jwks)

    def with_token_key(self, trust: Trust, point: EnforcementPoint, data: dict | None) -> dict | None:
        """A point's OPA data, plus data.complyroute.token (policies/complyroute/envoy) when it
        issues label tokens: only the entry's OPA holds the signing key."""
        if data is None or not trust.label_tokens or not any(listener.from_client for listener in point.deciding):
            return data
        token = {"issuer": TOKEN_ISSUER, "kid": self.token_jwk["kid"], "jwk": self.token_jwk,
                 "lifetime_seconds": trust.token_lifetime_seconds, "audience": trust.token_audience()}
        return {**data, "complyroute": {**data.get("complyroute", {}), "token": token}}

    def write(self, folder: Path) -> dict[str, TlsFiles]:
        """Write every credential into `folder` (keys readable by the owner only); files by identity."""
        folder.mkdir(parents=True, exist_ok=True)
        write_whole(folder / "ca.pem", self.ca_pem, 0o644)
        files = {}
        for identity, credential in self.parts.items():
            files[identity] = credential_files(folder, identity)
            write_whole(Path(files[identity].cert), credential.cert_pem, 0o644)
            write_whole(Path(files[identity].key), credential.key_pem, 0o600)
        return files


def credential_files(folder: Path, identity: str) -> TlsFiles:
    """Where Credentials.write puts the credential of `identity` in `folder`."""
    stem = identity.removeprefix(f"spiffe://{pki.TRUST_DOMAIN}/").replace("/", "-")
    return TlsFiles(str(folder / f"{stem}.pem"), str(folder / f"{stem}.key"), str(folder / "ca.pem"))
