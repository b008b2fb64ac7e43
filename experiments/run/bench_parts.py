"""The processes `make bench` measures (bench.py): every part and its floor, started side by side on
loopback from the plan of a central entity at 5 services, with the bench's own CA and label-token
key, and the pairs (a part, the row it is compared with) measured over them.

The bench's ports start at BASE_PORT; its points' sockets are in a scratch folder. start_parts
says what runs and against what; bench.py says how it is measured and reported.

Over 400 lines: start_parts starts every part and floor and names the pairs measured over them;
split, a pair would be read apart from the processes it compares.
"""

from __future__ import annotations

import json
import os
import signal
import ssl
import time
from dataclasses import dataclass, replace
from pathlib import Path

import psutil

from complyroute.authoring import policybench
from complyroute.engines import configuration
from complyroute.policy import bundles
from complyroute.policy.ruleset import RuleSet
from complyroute.proxy.opa import BundleSource
from complyroute.runtime.local import rendering, supervision
from complyroute.topology import manifest
from complyroute.topology.manifest import REPO
from complyroute.topology.plan import (ADMIN_SOCKET, API_SOCKET, DECISION_SOCKET, DIAGNOSTIC_SOCKET, LOOPBACK_VARIABLE, DecidingListener, Endpoint,
                                      EnforcementPoint, ForwardingListener, place)
from complyroute.trust import identity, pki

from experiments.design.matrix import BENCH_DECISION_LOG

FLOOR_APP = REPO / "services" / "bench" / "floor.js"
# The bench's address when no loopback network is named; with COMPLYROUTE_LOOPBACK set, the
# bench takes BENCH_HOST_BYTE on that network instead (bench_host), so that benches of sessions
# on networks of their own run side by side (on one address their listeners, which Envoy opens
# with SO_REUSEPORT, shared a port and each took the other's records). No node of a deployment
# takes that byte (nodes are numbered from 1, the entry is .254).
HOST = "127.0.0.1"
BENCH_HOST_BYTE = 253
# Clear of deployments (8080, 20000-27999), of the local Kubernetes cluster (30257 and up) and
# below Linux's ephemeral ports (32768-60999), where a connection of anything else running on
# the machine (or its TIME_WAIT) can hold a port the bench would listen on.
BASE_PORT = 28000
# The bench's record: canonical labels (one value each, consent sorted), as an entry hands them
# on, by name; the headers they travel in are the rule set's (its label schema).
RECORD_LABELS = policybench.record_labels(["analytics", "billing", "care"])


LONG_PATH = 49  # path entries a next hop answers at the head of a 50-service chain
TOKEN_LIFETIME = 3600  # s: outlives any bench run
# The audience the bench's tokens name and its token-checking listeners require, as a later
# step's listeners do in a deployment (identity.Trust.audience).
TOKEN_AUDIENCE = identity.TOKEN_STEP + "bench"


def bench_host() -> str:
    """Where the bench's parts listen: HOST, or on the loopback network COMPLYROUTE_LOOPBACK names."""
    loopback = os.environ.get(LOOPBACK_VARIABLE)
    return f"{loopback}.{BENCH_HOST_BYTE}" if loopback else HOST


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


class Bench:
    """The processes of one bench run: started together, measured in turns, stopped together."""

    def __init__(self, folder: Path, rule_set: RuleSet, scratch: Path | None = None):
        self.folder = folder
        self.rule_set = rule_set  # what configures every bench point (its label headers, index, table), made by the caller
        self.keys = (scratch or folder) / "pki"  # where credentials are written: the run's scratch folder
        # The points' private folders (their sockets): the scratch folder's path is short.
        self.private = (scratch or folder) / "private"
        self.pids: dict[str, int] = {}
        self.logs: dict[str, str] = {}  # each part's log, whose end a part that did not start shows
        self.urls: dict[str, str] = {}
        self.host = bench_host()
        self.last_port = BASE_PORT
        # The bench's own CA and label-token key: its parts trust nothing else.
        self.ca = pki.CertificateAuthority("bench")
        self.token_jwk, self.token_jwks = pki.signing_key()
        self.credentials: dict[str, identity.TlsFiles] = {}
        self.clients: dict[str, ssl.SSLContext] = {}
        self.bundles: BundleSource | None = None  # the bench's bundle server, once a point needs it
        self.signing_key = bundles.new_signing_key()  # the bench's own bundle signing key, as a deployment's
        self.points: dict[str, tuple[EnforcementPoint, configuration.PointConfiguration]] = {}  # each point and what it was given
        self.health_urls: dict[str, str] = {}  # OPAs: healthy once their bundle is loaded

    @property
    def label_setting(self) -> dict[str, str]:
        """What a forwarding service is told of the rule set's labels (its environment)."""
        return {"COMPLYROUTE_LABELS": self.rule_set.service_setting}

    @property
    def record_headers(self) -> dict[str, str]:
        """The bench's record's labels in the headers the rule set's label schema names."""
        return {label.header: RECORD_LABELS[label.name] for label in self.rule_set.schema if label.name in RECORD_LABELS}

    def endpoint(self) -> Endpoint:
        self.last_port += 1
        return Endpoint(self.host, self.last_port)

    def start(self, part: rendering.Part) -> None:
        self.pids[part.name] = rendering.start(part)
        self.logs[part.name] = part.log
        if part.kind == "opa":
            self.health_urls[part.name] = part.health_url

    def bundle_source(self) -> BundleSource:
        """The bench's bundle server (plain HTTP on loopback: the bench measures hops, and its
        OPAs read their bundle once), started with the first point that has an OPA."""
        if self.bundles is None:
            endpoint = self.endpoint()
            self.start(rendering.bundle_server_part(self.folder / rendering.BUNDLES, endpoint, "bench", self.folder, None, None))
            self.bundles = BundleSource(endpoint.url, bundles.verification_key(self.signing_key))
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
        # Its access log into a file, as a deployment's (its cost is measured: observability_rows).
        return EnforcementPoint(name, "bench", admin=self.socket(name, ADMIN_SOCKET), ready=self.endpoint(),
                                opa_grpc=self.socket(name, DECISION_SOCKET), opa_http=self.socket(name, API_SOCKET),
                                opa_diagnostic=self.socket(name, DIAGNOSTIC_SOCKET), role="router",
                                access_log=str(self.folder / f"{name}.access.log"))

    def point(self, point: EnforcementPoint, kind: str, settings: dict, bundled: Path | None = None,
              trust: identity.PointTrust | None = None, disk_data: dict | None = None) -> None:
        """Start the point's Envoy and OPA, configured by the bench's rule set (its label headers,
        the catalog's index, the allowed table) whatever rules its bundle holds (`bundled`): the
        allow-all floor's rules (ALLOW_ALL_POLICY) have no label schema or index to configure
        from, and its Envoy is to be the envoy-opa point's, of which it is the floor. None: the bench's rules.
        `disk_data`: what its OPA loads from disk beside its bundle (the entry's label-token key)."""
        generated = configuration.generate([point], {**settings, "kind": kind}, self.rule_set, {point.name: trust} if trust else None,
                                           rendering.layout(self.folder), self.signing_key, bundled=bundled).points[point.name]
        self.points[point.name] = (point, generated)
        if generated.bundle is not None:
            bundles.write(self.folder / rendering.BUNDLES, {point.name: generated.bundle}, generated.versions.revision)
        for part in rendering.point_parts(point, generated, self.folder / point.name, self.folder, self.bundle_source(), disk_data or {}):
            self.start(part)

    def wait_until_listening(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        for name, pid in self.pids.items():
            while not listening(pid):
                exited = not supervision.alive(pid)
                if exited or time.monotonic() > deadline:
                    # The log's end in the error itself: a CI run keeps no folder.
                    why = "exited" if exited else f"listened on nothing within {timeout:.0f} s"
                    raise RuntimeError(f"bench: {name} did not start: it {why}; the end of its log ({self.logs[name]}):\n"
                                       f"{supervision.tail(self.logs[name])}")
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


ENTRY_OPA = "the entry's decision and label token through ext_authz (envoy-compiled): OPA"


def start_parts(bench: Bench, scratch: Path, engine_settings: dict) -> tuple[list[Pair], dict]:
    """Start every part and floor; returns the pairs to measure and what the checks need. The points
    take `engine_settings` over the manifest's."""
    topology = manifest.load("central-entity", services=5)
    plan = place(topology)
    central = plan.points[0]
    hop = next(listener for listener in central.deciding if listener.sender == "svc-04")
    destination = next(i.id for i in topology.instances if i.step == hop.step)
    settings = {**topology.engine, **engine_settings}

    # Identities under mutual TLS: the bench sends as the hop's sender (the identity its
    # listener admits and OPA is told); the next hop is the destination instance.
    as_sender = identity.service_identity(next(s for s in plan.services if s.instance.id == hop.sender))
    as_destination = pki.spiffe_id("service", destination)

    sink = bench.node_app("sink", FLOOR_APP, {})
    tls_sink = bench.node_app("sink-tls", FLOOR_APP, bench.tls_env(as_destination))
    long_sink = bench.node_app("sink-49", FLOOR_APP, {"ANSWER_PATH_LENGTH": str(LONG_PATH)})
    bench.node_app("floor-forwarder", FLOOR_APP, {"EGRESS_URL": sink.url, **bench.label_setting})
    bench.node_app("floor-forwarder-49", FLOOR_APP, {"EGRESS_URL": long_sink.url, **bench.label_setting})
    sender = next(s for s in plan.services if s.instance.id == hop.sender)
    for name, work, upstream in (("service", 0, sink), ("service-work", None, sink), ("service-49", 0, long_sink)):
        endpoint = bench.endpoint()
        process = replace(sender, endpoint=endpoint, egress_url=upstream.url)
        part = rendering.service_part(process, {} if work is None else {"work_iterations": work}, scratch / f"{name}.audit.jsonl", bench.folder,
                                       bench.label_setting)
        bench.start(replace(part, name=name))
        bench.urls[name] = endpoint.url
    # The service and the floor with mutual TLS on both sides: they admit the point deciding
    # the hop into them (the bench sends as that point), and reach the next hop over TLS.
    as_point = identity.point_identity(central)
    as_service = identity.service_identity(sender)
    bench.node_app("floor-forwarder-mtls", FLOOR_APP,
                   {**bench.tls_env(as_service), "EGRESS_URL": https(tls_sink), "EGRESS_IDENTITY": as_destination, **bench.label_setting})
    endpoint = bench.endpoint()
    trust = identity.ServiceTrust(bench.tls_files(as_service), record_peers=(as_point,), control_peers=(pki.CONTROL,),
                                  egress_identity=as_destination, label_tokens=False)
    part = rendering.service_part(replace(sender, endpoint=endpoint, egress_url=tls_sink.url), {"work_iterations": 0},
                                   scratch / "service-mtls.audit.jsonl", bench.folder, bench.label_setting, trust,
                                   bench.tls_files(pki.CONTROL))
    bench.start(replace(part, name="service-mtls"))
    bench.urls["service-mtls"] = https(endpoint)
    endpoint = bench.endpoint()
    part = rendering.service_part(replace(sender, endpoint=endpoint, egress_url=tls_sink.url), {"work_iterations": 0},
                                   scratch / "service-token.audit.jsonl", bench.folder, bench.label_setting,
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
    # name, engine, the rules its bundle holds (None: the bench's), security: "" plain HTTP, "mtls", "token" (mTLS and the label token check)
    deciding = [("envoy-opa", "envoy-opa", None, ""), ("allow-all", "envoy-opa", allow_all, ""),
                ("envoy-compiled", "envoy-compiled", None, ""),
                ("envoy-compiled-mtls", "envoy-compiled", None, "mtls"), ("envoy-compiled-token", "envoy-compiled", None, "token"),
                ("envoy-opa-mtls", "envoy-opa", None, "mtls"), ("envoy-opa-token", "envoy-opa", None, "token")]
    for name, kind, bundled, security in deciding:
        point = bench.enforcement_point(name)
        point.deciding.append(DecidingListener(hop.name, bench.endpoint(), sender=hop.sender, step=hop.step))
        point.destinations = {destination: tls_sink if security else sink}
        point.catalog = central.catalog
        trust = bench.point_trust(point, as_sender, as_destination, label_tokens=security == "token") if security else None
        bench.point(point, kind, settings, bundled, trust)
        bench.urls[name] = https(point.deciding[0].endpoint) if security else point.deciding[0].endpoint.url
        admins[name] = point.admin
        opas[name] = point.opa_metrics_url

    # The central entity's entry under envoy-compiled, whose OPA decides nothing else: its decision,
    # the token it signs (key and audience as a deployment's), and again with its decision log.
    # Clients reach it in plain HTTP; it sends on over mTLS, as a deployment's entry does.
    entry = next(listener for listener in central.deciding if listener.from_client)
    token_data = identity.Credentials(b"", {}, bench.token_jwk, bench.token_jwks).with_token_key(identity.Trust.of(plan), central, {})
    for name, decision_logs in (("entry", "off"), ("entry-logged", "file")):
        point = bench.enforcement_point(name)
        point.deciding.append(DecidingListener(entry.name, bench.endpoint(), sender=entry.sender, step=entry.step, from_client=True))
        point.destinations, point.catalog = {next(i.id for i in topology.instances if i.step == entry.step): tls_sink}, central.catalog
        trust = identity.PointTrust(bench.tls_files(identity.point_identity(point)), {entry.name: ()}, {(tls_sink.reach, tls_sink.port): as_destination},
                                    label_tokens=True, jwks=json.dumps(bench.token_jwks, sort_keys=True), token_lifetime_seconds=TOKEN_LIFETIME)
        bench.point(point, "envoy-compiled", {**settings, "decision_logs": decision_logs}, None, trust, token_data)
        bench.urls[name], opas[name] = point.deciding[0].endpoint.url, point.opa_metrics_url

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
        Pair(ENTRY_OPA, "entry/opa", bench.urls["entry"], "OPA allowing everything, through ext_authz"),
        Pair("the entry's decision and label token through ext_authz (envoy-compiled): Envoy", "entry/envoy", bench.urls["entry"], bare),
        Pair(BENCH_DECISION_LOG, "entry-logged/opa", bench.urls["entry-logged"], ENTRY_OPA),
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
    context = {"admins": admins, "opas": opas, "observed": {"envoy-opa": "decision through ext_authz", "envoy-compiled": "compiled engine"}, "listener": hop.name, "point": central, "sender": hop.sender, "step": hop.step,
               "labels": RECORD_LABELS, "opa_alone": opa_alone,
               "compiled": [name for name, kind, *_ in deciding if kind == "envoy-compiled"],
               "token_checked": [name for name, *_, security in deciding if security == "token"]}
    return pairs, context


def https(endpoint: Endpoint) -> str:
    return "https://" + endpoint.url.split("://", 1)[1]
