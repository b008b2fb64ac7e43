"""make bench: how a part's row is judged against its floor, how the plugin's metric is read,
how records are sent (over mutual TLS with the bench's own CA, with its label token) and measured."""

import base64
import dataclasses
import hashlib
import json
import os
import signal
import socketserver
import ssl
import tarfile
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from threading import Thread

import pytest
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature

from complyroute import engines
from complyroute.policy import bundles, policyfiles
from complyroute.policy.ruleset import RuleSet
from complyroute.runtime.local import rendering
from complyroute.topology import manifest
from complyroute.topology.plan import DecidingListener, Endpoint, place
from complyroute.trust import pki
from experiments.run import bench, bench_parts

SHIPPED = RuleSet.of("policies")


def test_row_within_its_target_is_met_allowed():
    row = bench.Row("compiled engine", "envoy", 0.26, "bare Envoy", 0.20, 1.3)
    assert row.ratio == pytest.approx(1.3) and row.verdict == "met"
    assert row.to_csv()["ratio"] == 1.3


def test_row_over_its_target_is_not_met_denied():
    row = bench.Row("compiled engine", "envoy", 0.27, "bare Envoy", 0.20, 1.3)
    assert row.verdict == "NOT MET"
    assert "NOT MET" in bench.table([row])


def test_row_without_a_floor_has_no_ratio_or_verdict():
    row = bench.Row("bare Envoy", "envoy", 0.2)
    assert row.ratio is None and row.verdict == ""


@pytest.mark.parametrize("given", [True, False], ids=["allow-all", "shipped"])
def test_a_bench_point_is_configured_by_the_shipped_rule_set_whatever_its_bundle_holds(given, tmp_path, monkeypatch):
    """Bench.point: the allow-all floor's point is configured as the envoy-opa point it is the
    floor of (the shipped rule set's label headers, index and table); its bundle holds the rules
    given, the shipped point's the shipped ones. Its processes stand in."""
    bench_ = bench_parts.Bench(tmp_path / "processes", SHIPPED, tmp_path)
    central = place(manifest.load("central-entity", services=5)).points[0]
    hop = next(listener for listener in central.deciding if listener.sender == "svc-04")
    allow_all = tmp_path / "allow-all"
    (allow_all / "complyroute" / "envoy").mkdir(parents=True)
    (allow_all / "complyroute" / "envoy" / "response.rego").write_text(bench_parts.ALLOW_ALL_POLICY % "svc-05")
    point = bench_.enforcement_point("floor")
    point.deciding.append(DecidingListener(hop.name, bench_.endpoint(), sender=hop.sender, step=hop.step))
    point.destinations = {"svc-05": bench_.endpoint()}
    point.catalog = central.catalog
    configured, started = [], []
    configure = engines.configure
    monkeypatch.setattr(engines, "configure", lambda kind, points, settings, rule_set, *rest: configured.append(rule_set.folder) or
                        configure(kind, points, settings, rule_set, *rest))
    monkeypatch.setattr(bench_, "start", lambda part: started.append(part.name))
    bench_.point(point, "envoy-opa", {}, *([allow_all] if given else []))
    assert configured == [policyfiles.POLICIES]
    rules = bundles.rule_set_files(allow_all if given else policyfiles.POLICIES)
    with tarfile.open(bench_.folder / rendering.BUNDLES / "floor.tar.gz") as bundle:
        held = {member.name.lstrip("/"): bundle.extractfile(member).read() for member in bundle.getmembers()}
    # Its modules (opa build merges the data files into its data.json).
    assert {name: content for name, content in held.items() if name not in bundles.BUNDLE_FILES} == {
        name: content for name, content in rules.items() if name.endswith(".rego")}
    assert json.loads(held[".manifest"])["revision"] == bundles.revision(allow_all if given else policyfiles.POLICIES)
    assert started == ["control/bundles", "floor/opa", "floor/envoy"]


def test_the_bench_record_travels_in_the_headers_of_the_rule_set_it_was_given_allowed(tmp_path):
    """Bench.record_headers and label_setting follow the bench's rule set: the shipped headers, and
    another header where a rule set moves a label (its twin)."""
    shipped = bench_parts.Bench(tmp_path / "processes", SHIPPED, tmp_path)
    assert shipped.record_headers == {"x-data-region": "EU", "x-data-category": "personal", "x-data-consent": "analytics,billing,care"}
    assert shipped.label_setting == {"COMPLYROUTE_LABELS": SHIPPED.service_setting}
    moved = tuple(dataclasses.replace(label, header="x-subject-region") if label.name == "region" else label for label in SHIPPED.schema)
    other = bench_parts.Bench(tmp_path / "other", dataclasses.replace(SHIPPED, schema=moved), tmp_path / "other")
    assert other.record_headers["x-subject-region"] == "EU" and "x-data-region" not in other.record_headers
    assert "x-subject-region" in other.label_setting["COMPLYROUTE_LABELS"] != shipped.label_setting["COMPLYROUTE_LABELS"]


def serving(text: str, socket_path):
    """Answers every GET with `text` on the unix socket `socket_path`, as a point's OPA serves /metrics."""
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            body = text.encode()
            self.send_response(200)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = socketserver.ThreadingUnixStreamServer(str(socket_path), Handler)
    Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_plugin_handler_time_is_the_mean_of_its_histogram_allowed(tmp_path):
    server = serving('# HELP x\ngrpc_request_duration_seconds_bucket{handler="check",le="0.001"} 3\n'
                     'grpc_request_duration_seconds_sum{handler="check"} 0.0009\n'
                     'grpc_request_duration_seconds_count{handler="check"} 3\n', tmp_path / "opa.sock")
    try:
        assert bench.plugin_handler_ms(f"{Endpoint.unix(tmp_path / 'opa.sock').url}/metrics") == pytest.approx(0.3)
    finally:
        server.shutdown()


def test_plugin_without_performance_metrics_is_an_error_denied(tmp_path):
    server = serving("go_goroutines 12\n", tmp_path / "opa.sock")
    try:
        with pytest.raises(RuntimeError, match="enable-performance-metrics"):
            bench.plugin_handler_ms(f"{Endpoint.unix(tmp_path / 'opa.sock').url}/metrics")
    finally:
        server.shutdown()


# ---- mutual TLS and label tokens (issue 9) ---------------------------------------------


def unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def verify(token: str, jwks: dict) -> dict:
    """The claims of an ES256 token, checked as jwt_authn checks it (signature over its first two parts)."""
    header_b64, claims_b64, signature_b64 = token.split(".")
    header = json.loads(unb64(header_b64))
    key = next(k for k in jwks["keys"] if k["kid"] == header["kid"])
    public = ec.EllipticCurvePublicNumbers(int.from_bytes(unb64(key["x"]), "big"), int.from_bytes(unb64(key["y"]), "big"), ec.SECP256R1()).public_key()
    signature = unb64(signature_b64)
    assert header == {"alg": "ES256", "typ": "JWT", "kid": "entry"} and len(signature) == 64
    der = encode_dss_signature(int.from_bytes(signature[:32], "big"), int.from_bytes(signature[32:], "big"))
    public.verify(der, f"{header_b64}.{claims_b64}".encode(), ec.ECDSA(hashes.SHA256()))
    return json.loads(unb64(claims_b64))


def test_label_token_verifies_with_the_public_key_and_names_the_record_allowed():
    jwk, jwks = pki.signing_key()
    claims = verify(bench.label_token(jwk, bench.BODY, "bench-7"), jwks)
    assert claims["iss"] == "complyroute-entry" and claims["rid"] == "bench-7"
    assert (claims["region"], claims["category"], claims["consent"]) == ("EU", "personal", "analytics,billing,care")
    assert claims["digest"] == "sha256:" + hashlib.sha256(bench.BODY).hexdigest()
    assert claims["exp"] - claims["iat"] == bench_parts.TOKEN_LIFETIME
    assert claims["aud"] == [bench_parts.TOKEN_AUDIENCE]  # what the bench's token-checking listeners require


def test_label_token_of_another_key_does_not_verify_denied():
    jwk, _ = pki.signing_key()
    _, other_jwks = pki.signing_key()
    with pytest.raises(InvalidSignature):
        verify(bench.label_token(jwk, bench.BODY, "bench-1"), other_jwks)


class Counting(BaseHTTPRequestHandler):
    """Answers every POST 200 and counts them, with the headers it was sent."""

    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # kept-alive connection: no delayed ACK between header and body

    def do_POST(self):
        self.rfile.read(int(self.headers["content-length"]))
        self.server.seen.append({name.lower(): value for name, value in self.headers.items()})
        self.send_response(200)
        self.send_header("content-length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args):
        pass


def counting_server(tls: ssl.SSLContext | None = None):
    server = ThreadingHTTPServer(("127.0.0.1", 0), Counting)
    server.seen = []
    if tls:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    Thread(target=server.serve_forever, daemon=True).start()
    return server


class FakeBench:
    """What measure() asks of a bench: CPU seconds (a clock that never moves), TLS, the token key."""

    def __init__(self):
        self.token_jwk, self.token_jwks = pki.signing_key()
        self.record_headers = {"x-data-region": "EU"}

    def cpu_seconds(self, name):
        return 0.0

    def client(self, name):
        return None


def test_pairs_at_one_url_share_their_records_allowed():
    """Envoy and OPA of one point are measured over the same records: one send per url and round."""
    one, other = counting_server(), counting_server()
    url = lambda server: f"http://127.0.0.1:{server.server_port}"
    try:
        pairs = [bench_parts.Pair("envoy", "p/envoy", url(one)), bench_parts.Pair("opa", "p/opa", url(one)),
                 bench_parts.Pair("token", "q/envoy", url(other), token="shared")]
        medians = bench.measure(FakeBench(), pairs, records=5, rounds=2, out=open("/dev/null", "w"))
        assert set(medians) == {"envoy", "opa", "token"}
        assert len(one.seen) == len(other.seen) == 200 + 2 * 5
        assert "x-complyroute-labels" not in one.seen[0] and other.seen[0]["x-complyroute-labels"].count(".") == 2
    finally:
        one.shutdown()
        other.shutdown()


def test_pairs_at_one_url_sending_differently_denied():
    server = counting_server()
    url = f"http://127.0.0.1:{server.server_port}"
    try:
        with pytest.raises(ValueError, match="send differently"):
            bench.measure(FakeBench(), [bench_parts.Pair("a", "p/envoy", url), bench_parts.Pair("b", "p/opa", url, token="shared")], 1, 1)
    finally:
        server.shutdown()


def requiring_client_certificates(bench_: bench_parts.Bench) -> ssl.SSLContext:
    """A server's TLS as the bench's parts speak it: a certificate of the bench's CA, and the client's required."""
    files = bench_.tls_files(pki.spiffe_id("service", "svc-05"))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(files.cert, files.key)
    context.load_verify_locations(files.ca)
    context.verify_mode = ssl.CERT_REQUIRED
    return context


def test_bench_sends_over_mutual_tls_with_its_own_ca_allowed(tmp_path):
    bench_ = bench_parts.Bench(tmp_path / "processes", SHIPPED, tmp_path)
    server = counting_server(requiring_client_certificates(bench_))
    try:
        bench.send(f"https://127.0.0.1:{server.server_port}", 3, bench_.record_headers, bench_.client(pki.spiffe_id("service", "svc-04")))
        assert len(server.seen) == 3
        assert (tmp_path / "pki" / "ca.pem").exists() and not (tmp_path / "processes").exists()  # keys in scratch only
    finally:
        server.shutdown()


def test_bench_without_a_certificate_of_its_ca_is_refused_denied(tmp_path):
    bench_ = bench_parts.Bench(tmp_path / "processes", SHIPPED, tmp_path)
    stranger = bench_parts.Bench(tmp_path / "other", SHIPPED, tmp_path / "other")  # another CA
    server = counting_server(requiring_client_certificates(bench_))
    try:
        with pytest.raises((ssl.SSLError, ConnectionError)):
            bench.send(f"https://127.0.0.1:{server.server_port}", 1, stranger.record_headers, stranger.client(pki.spiffe_id("service", "svc-04")))
        assert server.seen == []
    finally:
        server.shutdown()


def test_entry_without_a_usable_signing_key_is_not_measured_denied(tmp_path):
    """The entry's answer is checked before `opa bench` times it: no token issued, no figure."""
    jwk, jwks = pki.signing_key()
    with pytest.raises(RuntimeError, match=r"entry's answer \(issue\)"):
        bench.entry_signing({**jwk, "d": "AAAA"}, jwks, tmp_path)


def test_per_record_tokens_name_each_record_once_allowed():
    """As a service in label-token mode takes them: an id per record, its token naming it, the digest header."""
    server = counting_server()
    fake = FakeBench()
    try:
        bench.measure(fake, [bench_parts.Pair("service", "s", f"http://127.0.0.1:{server.server_port}", token="per-record")], 3, 1,
                      out=open("/dev/null", "w"))
        ids = [seen["x-request-id"] for seen in server.seen]
        assert len(ids) == len(set(ids)) == 203
        for seen in server.seen[:3]:
            claims = verify(seen["x-complyroute-labels"], fake.token_jwks)
            assert claims["rid"] == seen["x-request-id"] and claims["digest"] == seen["x-complyroute-digest"]
    finally:
        server.shutdown()


def test_bench_listens_on_the_loopback_network_it_is_given_allowed(tmp_path, monkeypatch):
    monkeypatch.setenv("COMPLYROUTE_LOOPBACK", "127.0.9")
    endpoint = bench_parts.Bench(tmp_path, SHIPPED).endpoint()
    assert endpoint.address == "127.0.9.253" and endpoint.port == bench_parts.BASE_PORT + 1


def test_bench_without_a_loopback_network_listens_on_127_0_0_1_denied(tmp_path, monkeypatch):
    monkeypatch.delenv("COMPLYROUTE_LOOPBACK", raising=False)
    assert bench_parts.Bench(tmp_path, SHIPPED).endpoint().address == "127.0.0.1"


def test_sigterm_stops_the_bench_through_its_own_stop_allowed(monkeypatch):
    # A SIGTERM in the middle of bench.run unwinds it (its `finally` stops the parts it started)
    # and the command answers 130, as a Ctrl-C would.
    unwound = []

    def measuring(*args, **kwargs):
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler interrupts this
        finally:
            unwound.append(True)
        return []

    monkeypatch.setattr(bench, "run", measuring)
    assert bench.command(SHIPPED, None, records=1, rounds=1) == 130
    assert unwound == [True]


def test_after_the_bench_sigterm_is_what_it_was_denied(monkeypatch):
    before = signal.getsignal(signal.SIGTERM)
    monkeypatch.setattr(bench, "run", lambda *args, **kwargs: [])
    assert bench.command(SHIPPED, None, records=1, rounds=1) == 0
    assert signal.getsignal(signal.SIGTERM) is before
