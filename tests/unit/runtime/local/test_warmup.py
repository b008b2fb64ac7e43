"""Ready means deciding (runtime/local/warmup.py): each deciding listener is asked an unlabelled
record as its sender would send it, until it answers OPA's denial under the deployment's
revision; one that does not within the deadline fails the wait, and with it the deploy. The
listeners here are small HTTP servers answering as a point would; tests/e2e deploys every
topology with the real ones."""

import base64
import json
import os
import shutil
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from complyroute.policy.ruleset import RuleSet
from complyroute.runtime.deployed import Deployed
from complyroute.runtime.local import deployment, rendering, warmup
from complyroute.topology import manifest
from complyroute.topology.plan import LocalNetwork, place
from complyroute.trust import identity, pki

MIXED_REGIONS = str(manifest.REPO / "topologies" / "examples" / "mixed-regions.yaml")
REVISION = "r-new"
DECIDED = (400, {"code": "LABEL_MISSING", "message": "labels missing", "request_id": "r-1", "revision": REVISION,
                 "reasons": [{"code": "LABEL_MISSING", "message": "region"}]})
UNAVAILABLE = (503, {"code": "DECISION_UNAVAILABLE", "message": "no policy decision could be obtained", "request_id": "r-1"})


def plan_and_trust(tmp_path, **security):
    overrides = {"security": security} if security else None
    plan = place(manifest.load("sidecar", services=MIXED_REGIONS, overrides=overrides), LocalNetwork(tmp_path))
    trust = identity.Trust.of(plan)
    point_trust = {p.name: trust.point(p, identity.credential_files(tmp_path / rendering.PKI, identity.point_identity(p)), {"keys": []})
                   for p in plan.points} if trust else {}
    return plan, point_trust


def test_listeners_are_asked_as_their_senders_send_allowed(tmp_path):
    plan, point_trust = plan_and_trust(tmp_path)
    found = {(listener.point, listener.name): listener for listener in warmup.listeners(plan, point_trust, tmp_path)}
    assert set(found) == {(p.name, listener.name) for p in plan.points for listener in p.deciding}
    entry = found[("entry", "entry")]
    assert (entry.tls, entry.audience) == (None, None)  # a client's: plain HTTP, no token
    sidecar = found[("sidecar-ingest-eu-1", "egress")]
    # ingest-eu-1's own certificate (the listener admits no other) and the audience its jwt_authn requires.
    assert sidecar.tls == identity.credential_files(tmp_path / rendering.PKI, pki.spiffe_id("service", "ingest-eu-1"))
    assert sidecar.audience == point_trust["sidecar-ingest-eu-1"].token_audiences["egress"]


def test_listeners_without_mutual_tls_take_plain_http_and_no_token_denied(tmp_path):
    plan, point_trust = plan_and_trust(tmp_path, mtls=False, label_tokens=False)
    assert point_trust == {}
    assert {(listener.tls, listener.audience) for listener in warmup.listeners(plan, point_trust, tmp_path)} == {(None, None)}


class Point:
    """A listener on loopback answering each record with the next of `answers` (the last one again
    once they run out), and what it was sent."""

    def __init__(self, answers):
        self.answers, self.asked = list(answers), []
        point = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                point.asked.append((self.path, dict(self.headers), self.rfile.read(int(self.headers["content-length"]))))
                status, body = point.answers.pop(0) if len(point.answers) > 1 else point.answers[0]
                text = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("content-length", str(len(text)))
                self.end_headers()
                self.wfile.write(text)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def listener(self, name: str, audience: str | None = None) -> warmup.Listener:
        return warmup.Listener(name, "egress", "127.0.0.1", self.server.server_address[1], None, audience)

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def points():
    started = []
    yield lambda answers: started.append(Point(answers)) or started[-1]
    for point in started:
        point.close()


def claims(token: str) -> dict:
    payload = token.split(".")[1]
    return json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))


def test_a_listener_decides_once_its_opa_answers_with_the_revision_allowed(points):
    """503s first (its OPA not deciding yet), then OPA's denial: warm, after three asks; a token
    naming the listener's audience and no label."""
    point = points([UNAVAILABLE, UNAVAILABLE, DECIDED])
    key, _ = pki.signing_key()
    token_key = {"issuer": identity.TOKEN_ISSUER, "kid": key["kid"], "jwk": key}
    result = warmup.wait([point.listener("sidecar-ingest-eu-1", audience="spiffe://complyroute/service/ingest-eu-1")], token_key,
                         REVISION, 10, {})
    assert result["decided"] == {"sidecar-ingest-eu-1/egress": "r-1"}
    assert 0 < result["seconds"] < 10
    assert len(point.asked) == 3
    path, headers, body = point.asked[-1]
    assert (path, body) == ("/process", warmup.RECORD)
    assert not any(name.lower().startswith("x-data-") for name in headers)  # unlabelled
    token = claims(headers["x-complyroute-labels"])
    assert token["aud"] == ["spiffe://complyroute/service/ingest-eu-1"] and token["rid"] == headers["x-request-id"]
    assert set(token) == {"iss", "iat", "exp", "rid", "digest", "aud"}  # no label claim


@pytest.mark.parametrize("answer", [
    (401, {"code": "LABEL_TOKEN_MISSING", "message": "Envoy's own refusal", "request_id": "r-1"}),  # OPA not asked
    (400, {**DECIDED[1], "revision": "r-old"}),  # a reload not taken yet
    UNAVAILABLE,
], ids=["envoys-own-refusal", "old-revision", "decision-unavailable"])
def test_a_listener_that_never_decides_fails_the_wait_naming_its_point_and_logs_denied(points, answer):
    warm, cold = points([DECIDED]), points([answer])
    logs = {"sidecar-analyse-us": ["logs/sidecar-analyse-us.opa.log", "logs/sidecar-analyse-us.envoy.log"]}
    with pytest.raises(warmup.WarmUpError) as raised:
        warmup.wait([warm.listener("sidecar-ingest-eu-1"), cold.listener("sidecar-analyse-us")], None, REVISION, 0.5, logs)
    message = str(raised.value)
    assert message.startswith("1 of 2 deciding listeners did not decide a warm-up record")
    assert "sidecar-ingest-eu-1" not in message
    assert f"sidecar-analyse-us (listener egress, 127.0.0.1:{cold.server.server_address[1]}) last answered {answer[0]}" in message
    assert "its logs: logs/sidecar-analyse-us.opa.log, logs/sidecar-analyse-us.envoy.log" in message
    assert len(warm.asked) == 1  # a listener that decided is not asked again


def test_a_deploy_whose_point_never_decides_fails_and_stops_denied(tmp_path, monkeypatch):
    """deploy: every part healthy (none here), one listener answering 503 until the deadline: the
    deploy stops what it started and fails naming that listener."""
    monkeypatch.setenv("COMPLYROUTE_RUNS", str(tmp_path / "runs"))

    def render(plan, run_dir, rule_set):
        return [], Deployed(plan, plan.points, {}, "policies", REVISION, (), {})

    stopped = []
    monkeypatch.setattr(deployment, "render", render)
    monkeypatch.setattr(deployment, "start_supervisor", lambda run_dir, parts, restart: {"pid": os.getpid(), "programs": {}})
    monkeypatch.setattr(deployment, "stop", lambda out=None: stopped.append(True))
    monkeypatch.setattr(warmup, "ask", lambda listener, key: warmup.Answer(*UNAVAILABLE, detail="503 DECISION_UNAVAILABLE"))
    loaded = manifest.load("sidecar", services=MIXED_REGIONS, overrides={"security": {"mtls": False, "label_tokens": False}})
    with pytest.raises(deployment.DeploymentError, match=r"deploy: 7 of 7 deciding listeners did not decide a warm-up record .* "
                                                         r"entry \(listener entry, 127\.0\.0\.1:8080\) last answered 503"):
        deployment.deploy(loaded, RuleSet.of(loaded.policy), health_timeout=0.3, out=open(os.devnull, "w"))
    assert stopped == [True]
    state = json.loads(Path(deployment.current_link(), "state.json").read_text())
    shutil.rmtree(state["private"])  # the points' socket folder, which the real stop removes
    assert "warm_up" not in state
