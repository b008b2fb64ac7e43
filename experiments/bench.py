"""`make bench`: the CPU each part of a hop costs, beside a floor measured in the same run.

This machine is slow and shared, so absolute figures only describe it; the ratios of a part
to its floor are what count. Every part and its floor run side by side on loopback and are
measured in turns (several rounds, medians), each as the CPU time (user + system, all
threads) its process used for a fixed number of sequential records, divided by their number:

- service hop: a service instance (services/server.js) that receives a record, forwards it
  and answers, with no configured work, against a minimal Fastify app doing the same with the
  same client (services/bench/floor.js); the configured work is shown apart. Both forward to
  the same minimal app, which is not measured. A second pair has the next hop answer a path
  of 49 entries, as at the head of a 50-service chain: a hop must not grow with the chain.
- Envoy traversal: a forwarding listener as enforcement points render it, against an Envoy
  with nothing but the router filter.
- decision through ext_authz (engine envoy-opa): the central entity's listener for the hop
  into its last service, at 5 services. Envoy against the bare Envoy; OPA against `opa
  bench` of the same query on the same check request. An OPA whose policy allows everything,
  behind the same ext_authz, shows what the plugin costs before any rule runs.
- compiled engine (envoy-compiled): the same listener and record; Envoy against the bare
  Envoy. Its OPA must receive no call (checked on Envoy's ext_authz counter).
- mutual TLS (issue 9), every part a certificate of the bench's own CA (complyroute.trust.pki),
  identities as a deployment names them (complyroute.trust.identity): the forwarding listener with
  mTLS on both sides (its listener requires the sender's client certificate, its cluster
  speaks TLS to a next hop that requires Envoy's) against the same listener in plain HTTP;
  and the deciding listeners of both engines with mTLS against the same in plain HTTP. The
  bench then sends as the hop's sender (its certificate names svc-04, the identity the
  listener admits and OPA is told), and the next hop is the minimal app over TLS. The
  service hop with mTLS on both sides (TLS_CERT, RECORD_PEERS, EGRESS_IDENTITY, an https
  EGRESS_URL, as a deployment configures it; the bench sends as the point deciding the hop
  into it) against the same service in plain HTTP, and the floor app with mTLS against the
  floor in plain HTTP. Records go over one kept-alive connection, as between parts, so a
  handshake is not in the figures.
- label token check (issue 9): the same deciding listeners with jwt_authn verifying the
  entry's signed label token (ES256, the bench's own key, pki.signing_key()) against them
  with mTLS and no token: the token's cost at every point after the entry. Every record
  carries the same valid token (the next hop is the minimal app: nothing refuses a replayed
  request id); jwt_authn keeps no cache of verified tokens (the points configure none), so
  it verifies the signature of every record as it would a token per record. Envoy's
  jwt_authn counters must show every record verified, none refused. And the service in
  label-token mode (LABEL_TOKENS=1: the digest the point set must be the body's, a request
  id is taken once) against it with mTLS alone; it gets a token per record with its own
  request id and the digest header, as the point deciding the hop into it passes them on.

Where a point's Envoy and OPA are both measured, they are measured over the same records.
- the entry signing the label token: `opa bench` of the entry's query (central entity, 5
  services) with its signing key loaded as the control plane writes it, the route asking for
  the token (contextExtensions.label_token "issue") against the same route without: what
  issuing costs OPA per record at the entry (the answer of each is checked first).
- the policy: `opa bench` of the decision, this rule set against the one of commit d2d81e4
  (complyroute.authoring.policybench.compare).

Prints a table and writes it as CSV (default runs/bench/<time>/bench.csv).
"""

from __future__ import annotations

import csv
import hashlib
import http.client
import itertools
import json
import os
import signal
import ssl
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import psutil

from complyroute import engines
from complyroute.authoring import policybench
from complyroute.policy import bundles, labels, policyfiles
from complyroute.proxy.contract import DIGEST_HEADER, LABEL_TOKEN_HEADER
from complyroute.proxy.opa import BundleSource, write_data
from complyroute.runtime.local import rendering, supervision
from complyroute.topology import localhttp, manifest
from complyroute.topology.manifest import REPO
from complyroute.topology.plan import (ADMIN_SOCKET, API_SOCKET, DECISION_SOCKET, DIAGNOSTIC_SOCKET, DecidingListener, Endpoint, EnforcementPoint,
                                      ForwardingListener, place)
from complyroute.trust import identity, pki
from complyroute.trust.identity import TOKEN_ISSUER

FLOOR_APP = REPO / "services" / "bench" / "floor.js"
RUNS = REPO / "runs" / "bench"
HOST = "127.0.0.1"
# Clear of deployments (8080, 20000-27999), of the local Kubernetes cluster (30257 and up) and
# below Linux's ephemeral ports (32768-60999), where a connection of anything else running on
# the machine (or its TIME_WAIT) can hold a port the bench would listen on.
BASE_PORT = 28000
# The bench's record: canonical labels (one value each, consent sorted), as an entry hands them
# on, by name; the headers they travel in are the rule set's (its label schema).
RECORD_LABELS = policybench.record_labels(["analytics", "billing", "care"])
SCHEMA = labels.schema(policyfiles.POLICIES)
LABELS = {label.header: RECORD_LABELS[label.name] for label in SCHEMA if label.name in RECORD_LABELS}
LABEL_SETTING = {"COMPLYROUTE_LABELS": labels.service_setting(SCHEMA)}  # what a forwarding service is told
BODY = json.dumps({"subject": "alice", "amount": 12}).encode()
LONG_PATH = 49  # path entries a next hop answers at the head of a 50-service chain
CSV_FIELDS = ["part", "process", "value", "unit", "floor", "floor_value", "ratio", "target", "verdict"]
TOKEN_LIFETIME = 3600  # s: outlives any bench run
# The audience the bench's tokens name and its token-checking listeners require, as a later
# step's listeners do in a deployment (identity.Trust.audience).
TOKEN_AUDIENCE = identity.TOKEN_STEP + "bench"


@dataclass(frozen=True)
class Pair:
    """A part measured in every round, and the row it is compared with."""

    part: str  # the row's name
    process: str  # the running process measured (a key of Bench.pids)
    url: str  # where the records go
    floor: str = ""  # the row it is compared with; "" for a row shown alone
    target: float | None = None  # the ratio to its floor must stay at or under this
    client: str = ""  # the identity the bench presents over mutual TLS (an https url); "" for plain HTTP
    # The label token records carry: "" none; "shared" one valid token for every record (a
    # point checks the signature of each); "per-record" a token per record, each with its own
    # request id and the digest header a point sets, as a service in label-token mode takes them.
    token: str = ""


@dataclass
class Row:
    part: str
    process: str
    value: float  # ms of CPU per request (or `unit`), median over the rounds
    floor: str = ""
    floor_value: float | None = None
    target: float | None = None
    unit: str = "ms CPU/request"

    @property
    def ratio(self) -> float | None:
        return self.value / self.floor_value if self.floor_value else None

    @property
    def verdict(self) -> str:
        if self.target is None or self.ratio is None:
            return ""
        return "met" if self.ratio <= self.target else "NOT MET"

    def to_csv(self) -> dict:
        rounded = lambda x, digits: None if x is None else round(x, digits)
        return {
            "part": self.part, "process": self.process, "value": rounded(self.value, 4), "unit": self.unit,
            "floor": self.floor, "floor_value": rounded(self.floor_value, 4), "ratio": rounded(self.ratio, 3),
            "target": self.target, "verdict": self.verdict,
        }


class Bench:
    """The processes of one bench run: started together, measured in turns, stopped together."""

    def __init__(self, folder: Path, scratch: Path | None = None):
        self.folder = folder
        self.keys = (scratch or folder) / "pki"  # where credentials are written: the run's scratch folder
        # The points' private folders (their sockets): the scratch folder's path is short.
        self.private = (scratch or folder) / "private"
        self.pids: dict[str, int] = {}
        self.urls: dict[str, str] = {}
        self.last_port = BASE_PORT
        # The bench's own CA and label-token key: its parts trust nothing else.
        self.ca = pki.CertificateAuthority("bench")
        self.token_jwk, self.token_jwks = pki.signing_key()
        self.credentials: dict[str, identity.TlsFiles] = {}
        self.clients: dict[str, ssl.SSLContext] = {}
        self.bundles: BundleSource | None = None  # the bench's bundle server, once a point needs it
        self.health_urls: dict[str, str] = {}  # OPAs: healthy once their bundle is loaded

    def endpoint(self) -> Endpoint:
        self.last_port += 1
        return Endpoint(HOST, self.last_port)

    def start(self, part: rendering.Part) -> None:
        self.pids[part.name] = rendering.start(part)
        if part.kind == "opa":
            self.health_urls[part.name] = part.health_url

    def bundle_source(self) -> BundleSource:
        """The bench's bundle server (plain HTTP on loopback: the bench measures hops, and its
        OPAs read their bundle once), started with the first point that has an OPA."""
        if self.bundles is None:
            endpoint = self.endpoint()
            self.start(rendering.bundle_server_part(self.folder / rendering.BUNDLES, endpoint, "bench", self.folder, None, None))
            self.bundles = BundleSource(endpoint.url)
        return self.bundles

    def node_app(self, name: str, script: Path, env: dict) -> Endpoint:
        endpoint = self.endpoint()
        env = {**env, "HOST": endpoint.address, "PORT": str(endpoint.port)}
        self.start(rendering.Part(name, "service", "bench", [rendering.node_binary(), str(script)], env, "", str(self.folder / f"{name}.log")))
        self.urls[name] = https(endpoint) if env.get("TLS_CERT") else endpoint.url
        return endpoint

    def tls_files(self, name: str) -> identity.TlsFiles:
        """The key and certificate naming `name` (an identity), issued by the bench's CA, as files."""
        if name not in self.credentials:
            credentials = identity.Credentials(self.ca.cert_pem, {name: self.ca.issue(name)}, self.token_jwk, self.token_jwks)
            self.credentials.update(credentials.write(self.keys))
        return self.credentials[name]

    def tls_env(self, name: str) -> dict:
        """The TLS variables of a Node process (the floor app, a service) that is `name`."""
        files = self.tls_files(name)
        return {"TLS_CERT": files.cert, "TLS_KEY": files.key, "TLS_CA": files.ca}

    def client(self, name: str) -> ssl.SSLContext | None:
        """TLS as the part `name`, the way parts reach each other; None for plain HTTP."""
        if name and name not in self.clients:
            self.clients[name] = supervision.control_context(self.tls_files(name))
        return self.clients.get(name)

    def point_trust(self, point: EnforcementPoint, peer: str, upstream: str, label_tokens: bool) -> identity.PointTrust:
        """Mutual TLS at every listener of `point`, admitting `peer` only, to upstreams presenting
        `upstream`; with `label_tokens`, jwt_authn verifying the bench's key at deciding listeners."""
        upstreams = [*point.destinations.values(), *(listener.upstream for listener in point.forwarding)]
        return identity.PointTrust(
            files=self.tls_files(identity.point_identity(point)),
            listener_peers={listener.name: (peer,) for listener in [*point.deciding, *point.forwarding]},
            upstream_identity={(endpoint.reach, endpoint.port): upstream for endpoint in upstreams},
            label_tokens=label_tokens,
            jwks=json.dumps(self.token_jwks, sort_keys=True),
            token_lifetime_seconds=TOKEN_LIFETIME,
            token_audiences={listener.name: TOKEN_AUDIENCE for listener in point.deciding} if label_tokens else {},
        )

    def socket(self, point: str, name: str) -> Endpoint:
        return Endpoint.unix(self.private / point / name)

    def enforcement_point(self, name: str) -> EnforcementPoint:
        # A point that stands alone between a sender and a sink, as a router does between services;
        # what only it uses on sockets in its private folder, as in a deployment (plan.LocalNetwork).
        return EnforcementPoint(name, "bench", admin=self.socket(name, ADMIN_SOCKET), ready=self.endpoint(),
                                opa_grpc=self.socket(name, DECISION_SOCKET), opa_http=self.socket(name, API_SOCKET),
                                opa_diagnostic=self.socket(name, DIAGNOSTIC_SOCKET), role="router")

    def point(self, point: EnforcementPoint, kind: str, settings: dict, policies: Path = policyfiles.POLICIES,
              trust: identity.PointTrust | None = None) -> None:
        config = engines.configure(kind, [point], settings, policyfiles.POLICIES, {point.name: trust} if trust else None)[point.name]
        revision = bundles.revision(policies)
        if config.opa is not None:
            bundles.write(self.folder / rendering.BUNDLES, {point.name: config.data}, policies, revision)
        for part in rendering.point_parts(point, config, self.folder / point.name, self.folder, revision, self.bundle_source(), {}):
            self.start(part)

    def wait_until_listening(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        for name, pid in self.pids.items():
            while not listening(pid):
                if not supervision.alive(pid) or time.monotonic() > deadline:
                    raise RuntimeError(f"bench: {name} did not start; its log is in {self.folder}")
                time.sleep(0.1)
        for name, url in self.health_urls.items():
            while not supervision.healthy(url):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"bench: {name} did not load its bundle; its log is in {self.folder}")
                time.sleep(0.1)

    def cpu_seconds(self, name: str) -> float:
        times = psutil.Process(self.pids[name]).cpu_times()
        return times.user + times.system

    def stop(self) -> None:
        for pid in self.pids.values():
            try:
                os.killpg(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(supervision.alive(pid) for pid in self.pids.values()):
            time.sleep(0.1)
        for pid in self.pids.values():
            if supervision.alive(pid):
                os.killpg(pid, signal.SIGKILL)


def listening(pid: int) -> bool:
    """Whether the process listens on a TCP port, or holds a unix socket (an OPA of a point
    listens on sockets only; its health check, bench.health_urls, follows)."""
    try:
        process = psutil.Process(pid)
        return (any(c.status == psutil.CONN_LISTEN for c in process.net_connections())
                or any(c.laddr for c in process.net_connections(kind="unix")))
    except psutil.Error:
        return False


def send(url: str, records: int, context: ssl.SSLContext | None = None, headers: dict | Callable[[], dict] | None = None) -> None:
    """`records` sequential POSTs over one keep-alive connection; each must be answered 200.

    An https `url` is reached over TLS with `context` (the bench's certificate as a part);
    `headers` are sent with the labels: a dict, or a function giving each record's.
    """
    scheme, address = url.split("://", 1)
    host, port = address.split(":")
    if scheme == "https":
        connection = http.client.HTTPSConnection(host, int(port), timeout=30, context=context)
    else:
        connection = http.client.HTTPConnection(host, int(port), timeout=30)
    common = {"content-type": "application/json", **LABELS}
    fixed = {**common, **(headers or {})} if not callable(headers) else None
    try:
        for _ in range(records):
            connection.request("POST", "/process", body=BODY, headers=fixed or {**common, **headers()})
            answer = connection.getresponse()
            body = answer.read()
            if answer.status != 200:
                raise RuntimeError(f"bench: {url} answered {answer.status}: {body[:300]!r}")
    finally:
        connection.close()


def label_token(jwk: dict, body: bytes, request_id: str, lifetime: int = TOKEN_LIFETIME) -> str:
    """The label token an entry issues for `body` with the bench's labels, signed with the private JWK `jwk`."""
    now = int(time.time())
    claims = {"iss": TOKEN_ISSUER, "rid": request_id, **RECORD_LABELS, "digest": "sha256:" + hashlib.sha256(body).hexdigest(),
              "iat": now, "exp": now + lifetime, "aud": [TOKEN_AUDIENCE]}
    return pki.sign_token(claims, jwk)


def read(url: str) -> str:
    """What a point's socket (localhttp) answers; an error unless 200."""
    status, body = localhttp.request(url, timeout=10)
    if status != 200:
        raise RuntimeError(f"bench: {url} answered {status}: {body[:200]!r}")
    return body.decode()


def envoy_counter(admin: Endpoint, name: str) -> int:
    text = read(f"{admin.url}/stats?filter=^{name}$").strip()
    return int(text.rsplit(":", 1)[1]) if text else 0


def plugin_handler_ms(metrics_url: str) -> float:
    """Mean wall time of a check inside opa-envoy-plugin (its grpc_request_duration_seconds)."""
    lines = read(metrics_url).splitlines()
    total = {}
    for line in lines:
        for suffix in ("_sum", "_count"):
            if line.startswith(f"grpc_request_duration_seconds{suffix}"):
                total[suffix] = total.get(suffix, 0.0) + float(line.rsplit(" ", 1)[1])
    if not total.get("_count"):
        raise RuntimeError(f"bench: {metrics_url} has no grpc_request_duration_seconds (enable-performance-metrics)")
    return total["_sum"] / total["_count"] * 1000


def bare_envoy(listener: Endpoint, upstream: Endpoint, admin: Endpoint) -> dict:
    """An Envoy that forwards with nothing but the router filter: the floor of a traversal."""
    socket = lambda e: {"pipe": {"path": e.path, "mode": 0o600}} if e.path else {"socket_address": {"address": e.address, "port_value": e.port}}
    manager = {
        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
        "stat_prefix": "bare",
        "route_config": {"virtual_hosts": [{"name": "bare", "domains": ["*"], "routes": [{"match": {"prefix": "/"}, "route": {"cluster": "upstream"}}]}]},
        "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}],
    }
    return {
        "admin": {"address": socket(admin)},
        "static_resources": {
            "listeners": [{"name": "bare", "address": socket(listener),
                           "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": manager}]}]}],
            "clusters": [{"name": "upstream", "type": "STATIC",
                          "load_assignment": {"cluster_name": "upstream", "endpoints": [{"lb_endpoints": [{"endpoint": {"address": socket(upstream)}}]}]}}],
        },
    }


ALLOW_ALL_POLICY = """package complyroute.envoy

# make bench: a decision through ext_authz without any rule, the floor of the plugin's own cost.
response := {"allowed": true, "headers": {"x-complyroute-destination": "%s"}}
"""


def start_parts(bench: Bench, scratch: Path) -> tuple[list[Pair], dict]:
    """Start every part and floor; returns the pairs to measure and what the checks need."""
    topology = manifest.load("central-entity", services=5)
    plan = place(topology)
    central = plan.points[0]
    hop = next(listener for listener in central.deciding if listener.sender == "svc-04")
    destination = next(i.id for i in topology.instances if i.step == hop.step)
    settings = dict(topology.engine)

    # Identities under mutual TLS: the bench sends as the hop's sender (the identity its
    # listener admits and OPA is told); the next hop is the destination instance.
    as_sender = identity.service_identity(next(s for s in plan.services if s.instance.id == hop.sender))
    as_destination = pki.spiffe_id("service", destination)

    sink = bench.node_app("sink", FLOOR_APP, {})
    tls_sink = bench.node_app("sink-tls", FLOOR_APP, bench.tls_env(as_destination))
    long_sink = bench.node_app("sink-49", FLOOR_APP, {"ANSWER_PATH_LENGTH": str(LONG_PATH)})
    bench.node_app("floor-forwarder", FLOOR_APP, {"EGRESS_URL": sink.url, **LABEL_SETTING})
    bench.node_app("floor-forwarder-49", FLOOR_APP, {"EGRESS_URL": long_sink.url, **LABEL_SETTING})
    sender = next(s for s in plan.services if s.instance.id == hop.sender)
    for name, work, upstream in (("service", 0, sink), ("service-work", None, sink), ("service-49", 0, long_sink)):
        endpoint = bench.endpoint()
        process = replace(sender, endpoint=endpoint, egress_url=upstream.url)
        part = rendering.service_part(process, {} if work is None else {"work_iterations": work}, scratch / f"{name}.audit.jsonl", bench.folder,
                                       LABEL_SETTING)
        bench.start(replace(part, name=name))
        bench.urls[name] = endpoint.url
    # The service and the floor with mutual TLS on both sides: they admit the point deciding
    # the hop into them (the bench sends as that point), and reach the next hop over TLS.
    as_point = identity.point_identity(central)
    as_service = identity.service_identity(sender)
    bench.node_app("floor-forwarder-mtls", FLOOR_APP,
                   {**bench.tls_env(as_service), "EGRESS_URL": https(tls_sink), "EGRESS_IDENTITY": as_destination, **LABEL_SETTING})
    endpoint = bench.endpoint()
    trust = identity.ServiceTrust(bench.tls_files(as_service), record_peers=(as_point,), control_peers=(pki.CONTROL,),
                                  egress_identity=as_destination, label_tokens=False)
    part = rendering.service_part(replace(sender, endpoint=endpoint, egress_url=tls_sink.url), {"work_iterations": 0},
                                   scratch / "service-mtls.audit.jsonl", bench.folder, LABEL_SETTING, trust,
                                   bench.tls_files(pki.CONTROL))
    bench.start(replace(part, name="service-mtls"))
    bench.urls["service-mtls"] = https(endpoint)
    endpoint = bench.endpoint()
    part = rendering.service_part(replace(sender, endpoint=endpoint, egress_url=tls_sink.url), {"work_iterations": 0},
                                   scratch / "service-token.audit.jsonl", bench.folder, LABEL_SETTING,
                                   replace(trust, label_tokens=True), bench.tls_files(pki.CONTROL))
    bench.start(replace(part, name="service-token"))
    bench.urls["service-token"] = https(endpoint)

    listener, admin = bench.endpoint(), bench.socket("bare-envoy", ADMIN_SOCKET)
    admin_folder = Path(admin.path).parent
    admin_folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    (scratch / "bare-envoy.json").write_text(json.dumps(bare_envoy(listener, sink, admin)))
    bench.start(rendering.Part("bare-envoy", "envoy", "bench",
                                [rendering.envoy_binary(), "-c", str(scratch / "bare-envoy.json"), "--concurrency", "1", "--disable-hot-restart", "--log-level", "warn"],
                                {}, "", str(bench.folder / "bare-envoy.log")))
    bench.urls["bare-envoy"] = listener.url

    forwarding = bench.enforcement_point("forwarding")
    forwarding.forwarding.append(ForwardingListener("forward", bench.endpoint(), sink))
    bench.point(forwarding, "envoy-opa", settings)
    bench.urls["forwarding"] = forwarding.forwarding[0].endpoint.url
    forwarding_mtls = bench.enforcement_point("forwarding-mtls")
    forwarding_mtls.forwarding.append(ForwardingListener("forward", bench.endpoint(), tls_sink))
    bench.point(forwarding_mtls, "envoy-opa", settings, trust=bench.point_trust(forwarding_mtls, as_sender, as_destination, label_tokens=False))
    bench.urls["forwarding-mtls"] = https(forwarding_mtls.forwarding[0].endpoint)

    allow_all = scratch / "allow-all"
    (allow_all / "complyroute" / "envoy").mkdir(parents=True)
    (allow_all / "complyroute" / "envoy" / "response.rego").write_text(ALLOW_ALL_POLICY % destination)
    admins, opas = {}, {}
    # name, engine, policies, security: "" plain HTTP, "mtls", "token" (mTLS and the label token check)
    deciding = [("envoy-opa", "envoy-opa", policyfiles.POLICIES, ""), ("allow-all", "envoy-opa", allow_all, ""),
                ("envoy-compiled", "envoy-compiled", policyfiles.POLICIES, ""),
                ("envoy-compiled-mtls", "envoy-compiled", policyfiles.POLICIES, "mtls"), ("envoy-compiled-token", "envoy-compiled", policyfiles.POLICIES, "token"),
                ("envoy-opa-mtls", "envoy-opa", policyfiles.POLICIES, "mtls"), ("envoy-opa-token", "envoy-opa", policyfiles.POLICIES, "token")]
    for name, kind, policies, security in deciding:
        point = bench.enforcement_point(name)
        point.deciding.append(DecidingListener(hop.name, bench.endpoint(), sender=hop.sender, step=hop.step))
        point.destinations = {destination: tls_sink if security else sink}
        point.catalog = central.catalog
        trust = bench.point_trust(point, as_sender, as_destination, label_tokens=security == "token") if security else None
        bench.point(point, kind, settings, policies, trust)
        bench.urls[name] = https(point.deciding[0].endpoint) if security else point.deciding[0].endpoint.url
        admins[name] = point.admin
        opas[name] = point.opa_metrics_url

    bare = "Envoy, router filter only"
    opa_alone = "policy evaluation alone (opa bench, same query)"
    traversal = "Envoy traversal (forwarding listener)"
    opa_envoy, opa_opa = "decision through ext_authz: Envoy", "decision through ext_authz: OPA"
    compiled = "compiled engine: Envoy deciding the hop"
    opa_envoy_mtls, opa_opa_mtls = "decision through ext_authz, mTLS: Envoy", "decision through ext_authz, mTLS: OPA"
    compiled_mtls = "compiled engine, mTLS: Envoy deciding the hop"
    pairs = [
        Pair("service hop floor (Fastify + undici)", "floor-forwarder", bench.urls["floor-forwarder"]),
        Pair("service hop, beyond its work", "service", bench.urls["service"], "service hop floor (Fastify + undici)", 1.5),
        Pair("service hop with its work (the service's default WORK_ITERATIONS)", "service-work", bench.urls["service-work"], "service hop, beyond its work"),
        Pair("service hop floor, mTLS on both sides", "floor-forwarder-mtls", bench.urls["floor-forwarder-mtls"], "service hop floor (Fastify + undici)",
             client=as_point),
        Pair("service hop, mTLS on both sides", "service-mtls", bench.urls["service-mtls"], "service hop, beyond its work", client=as_point),
        Pair("service hop, mTLS and label tokens", "service-token", bench.urls["service-token"], "service hop, mTLS on both sides",
             client=as_point, token="per-record"),
        Pair(f"service hop floor, next hop answers {LONG_PATH} path entries", "floor-forwarder-49", bench.urls["floor-forwarder-49"]),
        Pair(f"service hop, next hop answers {LONG_PATH} path entries", "service-49", bench.urls["service-49"],
             f"service hop floor, next hop answers {LONG_PATH} path entries", 1.5),
        Pair(bare, "bare-envoy", bench.urls["bare-envoy"]),
        Pair(traversal, "forwarding/envoy", bench.urls["forwarding"], bare),
        Pair("Envoy traversal, mTLS on both sides (forwarding listener)", "forwarding-mtls/envoy", bench.urls["forwarding-mtls"], traversal,
             client=as_sender),
        Pair(opa_envoy, "envoy-opa/envoy", bench.urls["envoy-opa"], bare),
        Pair(opa_opa, "envoy-opa/opa", bench.urls["envoy-opa"], opa_alone),
        Pair("OPA allowing everything, through ext_authz", "allow-all/opa", bench.urls["allow-all"], opa_alone),
        Pair(opa_envoy_mtls, "envoy-opa-mtls/envoy", bench.urls["envoy-opa-mtls"], opa_envoy, client=as_sender),
        Pair(opa_opa_mtls, "envoy-opa-mtls/opa", bench.urls["envoy-opa-mtls"], opa_opa, client=as_sender),
        Pair("decision through ext_authz, mTLS and label token check: Envoy", "envoy-opa-token/envoy", bench.urls["envoy-opa-token"], opa_envoy_mtls,
             client=as_sender, token="shared"),
        Pair("decision through ext_authz, mTLS and label token check: OPA", "envoy-opa-token/opa", bench.urls["envoy-opa-token"], opa_opa_mtls,
             client=as_sender, token="shared"),
        Pair(compiled, "envoy-compiled/envoy", bench.urls["envoy-compiled"], bare, 1.3),
        Pair("compiled engine: its OPA", "envoy-compiled/opa", bench.urls["envoy-compiled"]),
        Pair(compiled_mtls, "envoy-compiled-mtls/envoy", bench.urls["envoy-compiled-mtls"], compiled, client=as_sender),
        Pair("compiled engine, mTLS and label token check: Envoy deciding the hop", "envoy-compiled-token/envoy", bench.urls["envoy-compiled-token"],
             compiled_mtls, client=as_sender, token="shared"),
    ]
    context = {"admins": admins, "opas": opas, "concurrency": central.concurrency, "listener": hop.name, "point": central, "sender": hop.sender, "step": hop.step,
               "labels": RECORD_LABELS, "opa_alone": opa_alone,
               "compiled": [name for name, kind, *_ in deciding if kind == "envoy-compiled"],
               "token_checked": [name for name, *_, security in deciding if security == "token"]}
    return pairs, context


def https(endpoint: Endpoint) -> str:
    return "https://" + endpoint.url.split("://", 1)[1]


def measure(bench: Bench, pairs: list[Pair], records: int, rounds: int, out=sys.stdout) -> dict[str, float]:
    """Median ms of CPU per record of every pair's process, over `rounds` turns of `records` each.

    Pairs with the same url (Envoy and OPA of one point) are measured over the same records.
    """
    samples: dict[str, list[float]] = {pair.part: [] for pair in pairs}
    by_url: dict[str, list[Pair]] = {}
    for pair in pairs:
        by_url.setdefault(pair.url, []).append(pair)
    shared = {LABEL_TOKEN_HEADER: label_token(bench.token_jwk, BODY, "bench-1")}
    ids = itertools.count(1)
    digest = "sha256:" + hashlib.sha256(BODY).hexdigest()

    def per_record() -> dict:
        request_id = f"bench-record-{next(ids)}"
        return {"x-request-id": request_id, LABEL_TOKEN_HEADER: label_token(bench.token_jwk, BODY, request_id), DIGEST_HEADER: digest}

    sending = {}
    for url, group in by_url.items():
        if len({(pair.client, pair.token) for pair in group}) > 1:
            raise ValueError(f"bench: the pairs measured at {url} send differently")
        sending[url] = {"context": bench.client(group[0].client), "headers": {"": None, "shared": shared, "per-record": per_record}[group[0].token]}
        send(url, 200, **sending[url])  # warm every path up: connections, JIT, caches
    for round_number in range(1, rounds + 1):
        for url, group in by_url.items():
            before = {pair.part: bench.cpu_seconds(pair.process) for pair in group}
            send(url, records, **sending[url])
            for pair in group:
                samples[pair.part].append((bench.cpu_seconds(pair.process) - before[pair.part]) * 1000 / records)
        print(f"bench: round {round_number}/{rounds} measured", file=out, flush=True)
    return {part: statistics.median(values) for part, values in samples.items()}


def policy_evaluation(context: dict, scratch: Path) -> float:
    """ms per evaluation of the query Envoy asks, by `opa bench`, on the bench's check request."""
    request = policybench.envoy_input(context["sender"], context["step"], context["labels"])
    decision, figures = policybench.bench_query(context["point"], request, scratch, context["concurrency"])
    if not decision.get("allowed"):
        raise RuntimeError(f"bench: the policy does not allow the bench's record: {decision}")
    return figures["median_us"] / 1000


def entry_signing(jwk: dict, jwks: dict, scratch: Path) -> dict[str, float]:
    """ms per evaluation of the entry's query (central entity, 5 services), by `opa bench`, with
    the entry's data and signing key as the control plane writes them: {"issue": its route asks
    for the label token (contextExtensions.label_token "issue"), "plain": the same without}."""
    plan = place(manifest.load("central-entity", services=5))
    central = plan.points[0]
    entry = next(listener for listener in central.deciding if listener.from_client)
    rule_set = policybench.current()
    document = rule_set.data({"point": central})["point"]
    document = identity.Credentials(b"", {}, jwk, jwks).with_token_key(identity.Trust.of(plan), central, document)
    data_dir = scratch / "entry-signing"
    write_data(data_dir, document)
    plain = policybench.envoy_input(entry.sender, entry.step, RECORD_LABELS)
    issuing = json.loads(json.dumps(plain))
    issuing["attributes"]["contextExtensions"]["label_token"] = "issue"
    requests = {"plain": plain, "issue": issuing}
    for name, request in requests.items():  # both answers checked before anything is timed
        input_file = scratch / f"entry-{name}.json"
        input_file.write_text(json.dumps(request))
        answer = json.loads(policybench.opa("eval", "--format", "json", *policybench.loading(rule_set, data_dir), "--input", str(input_file),
                                            policybench.QUERY))["result"][0]["expressions"][0]["value"]
        if not answer.get("allowed") or (LABEL_TOKEN_HEADER in answer.get("headers", {})) != (name == "issue"):
            raise RuntimeError(f"bench: the entry's answer ({name}) is not the one to measure: {json.dumps(answer)[:300]}")
    return {name: policybench.bench(rule_set, data_dir, request, scratch, central.concurrency)["median_us"] / 1000
            for name, request in requests.items()}


def run(out_file: Path | None = None, records: int = 1500, rounds: int = 3, out=sys.stdout) -> list[Row]:
    """Measure everything once; print the table, write the CSV, return the rows."""
    out_file = out_file or RUNS / time.strftime("%Y%m%d-%H%M%S") / "bench.csv"
    out_file.parent.mkdir(parents=True, exist_ok=True)
    print(f"bench: {rounds} rounds of {records} sequential records per part; CSV: {out_file}", file=out, flush=True)
    with tempfile.TemporaryDirectory() as scratch_name:
        scratch = Path(scratch_name)
        bench = Bench(out_file.parent / "processes", scratch)
        bench.folder.mkdir(parents=True, exist_ok=True)
        try:
            pairs, context = start_parts(bench, scratch)
            bench.wait_until_listening()
            medians = measure(bench, pairs, records, rounds, out)
            handler_ms = plugin_handler_ms(context["opas"]["envoy-opa"])
            for name in context["compiled"]:
                compiled_asked = envoy_counter(context["admins"][name], f"http.{context['listener']}.ext_authz.ok")
                if compiled_asked:
                    raise RuntimeError(f"bench: the compiled engine ({name}) asked OPA {compiled_asked} times for records it should route itself")
            for name in context["token_checked"]:
                verified = {outcome: envoy_counter(context["admins"][name], f"http.{context['listener']}.jwt_authn.{outcome}")
                            for outcome in ("allowed", "denied")}
                if verified["denied"] or verified["allowed"] < records * rounds:
                    raise RuntimeError(f"bench: {name} verified {verified['allowed']} label tokens and refused {verified['denied']}, "
                                       f"for {records * rounds} measured records")
        finally:
            bench.stop()
        medians[context["opa_alone"]] = policy_evaluation(context, scratch)
        signing = entry_signing(bench.token_jwk, bench.token_jwks, scratch)
    rows = [Row(pair.part, pair.process, medians[pair.part], pair.floor, medians.get(pair.floor), pair.target) for pair in pairs]
    at = [r.part for r in rows].index("decision through ext_authz: OPA")
    rows[at:at] = [
        Row(context["opa_alone"], "opa bench", medians[context["opa_alone"]], unit="ms/evaluation"),
        Row("decision through ext_authz: inside the plugin (wall time)", "envoy-opa/opa", handler_ms, context["opa_alone"],
            medians[context["opa_alone"]], unit="ms/decision"),
    ]
    at = [r.part for r in rows].index("compiled engine: Envoy deciding the hop")
    plain_entry = "policy at the entry, no label token (opa bench)"
    rows[at:at] = [
        Row(plain_entry, "opa bench", signing["plain"], unit="ms/evaluation"),
        Row("policy at the entry, issuing the label token (opa bench)", "opa bench", signing["issue"], plain_entry, signing["plain"], unit="ms/evaluation"),
    ]
    print("bench: the policy, this rule set against commit d2d81e4 (opa bench, medians)", file=out, flush=True)
    for case in policybench.compare(out=out):
        # The target is the allowed hop's, the common case; a denial evaluates every rule to explain itself.
        target = 0.1 if case["record"] == "allowed" else None
        rows.append(Row(f"policy: {case['case']}", "opa bench", case["new_us"] / 1000, f"the same case at {policybench.BASELINE_COMMIT}",
                        case["old_us"] / 1000, target, unit="ms/evaluation"))
    with out_file.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=CSV_FIELDS)
        writer.writeheader()
        writer.writerows(row.to_csv() for row in rows)
    print(table(rows), file=out)
    print(f"bench: {out_file}", file=out)
    return rows


def table(rows: list[Row]) -> str:
    width = max([58, *(len(row.part) + 2 for row in rows)])
    lines = [f"{'part':<{width}}{'value':>9}  {'unit':<15}{'floor':>9}  {'ratio':>7}  {'target':>7}  verdict",]
    for row in rows:
        floor = f"{row.floor_value:9.3f}" if row.floor_value is not None else " " * 9
        ratio = f"{row.ratio:6.2f}x" if row.ratio is not None else " " * 7
        target = f"<={row.target:g}x" if row.target is not None else ""
        lines.append(f"{row.part:<{width}}{row.value:9.3f}  {row.unit:<15}{floor}  {ratio}  {target:>7}  {row.verdict}")
        if row.floor:
            lines.append(f"{'':<4}floor: {row.floor}")
    return "\n".join(lines)
