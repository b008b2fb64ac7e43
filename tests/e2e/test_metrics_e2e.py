"""A real Prometheus (Debian's package, make setup installs it) scrapes a deployment with the scrape
configuration `deploy` wrote, and answers through its HTTP API: decisions per point by outcome, a
latency histogram per hop, records per service. The pool's sidecar deployment under envoy-opa,
after the suites before it sent their records: the counts asked for are at least this test's.
Its denied twins: a point's metrics listener opens to the monitoring identity only, and serves
nothing but the metrics."""

import json
import shutil
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

from complyroute.trust import pki

from .helpers import EU_PERSONAL, as_part, post, tls_context

pytestmark = pytest.mark.pool(phase=2)

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
DENIED = {**EU_PERSONAL, "consent": "care"}  # the store step's instances process for billing: PURPOSE_NOT_CONSENTED there


@pytest.fixture(params=[("sidecar", "envoy-opa")], ids="-".join)
def deployed(pooled):
    return pooled


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def prometheus(deployed, tmp_path):
    """Prometheus scraping the deployment every second (the written configuration, its interval shortened); its API's URL."""
    if not Path(PROMETHEUS).exists():
        pytest.fail("Debian's prometheus is not installed: make setup installs it (apt-get install --no-install-recommends prometheus)")
    state, _ = deployed
    config = yaml.safe_load(Path(state["scrape_config"]).read_text())
    config["global"] = {"scrape_interval": "1s", "scrape_timeout": "1s"}
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    url = f"http://127.0.0.1:{free_port()}"
    with open(tmp_path / "prometheus.log", "wb") as log:
        process = subprocess.Popen([PROMETHEUS, f"--config.file={tmp_path / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'data'}",
                                    f"--web.listen-address={url.removeprefix('http://')}"], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while not ready(url):
            assert process.poll() is None and time.monotonic() < deadline, (tmp_path / "prometheus.log").read_text()[-2000:]
            time.sleep(0.2)
        yield url
    finally:
        process.terminate()
        process.wait(10)


def ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as answer:
            return answer.status == 200
    except OSError:
        return False


def query(url: str, promql: str) -> list[dict]:
    with urllib.request.urlopen(f"{url}/api/v1/query?{urllib.parse.urlencode({'query': promql})}", timeout=10) as answer:
        body = json.load(answer)
    assert body["status"] == "success", body
    return body["data"]["result"]


def answered(url: str, promql: str, holds, timeout: float = 60) -> list[dict]:
    """The query's result once `holds(result)` (Prometheus scrapes every second; the answer is a few scrapes away)."""
    deadline = time.monotonic() + timeout
    while True:
        result = query(url, promql)
        if holds(result) or time.monotonic() > deadline:
            return result
        time.sleep(0.5)


def by(result: list[dict], *labels: str) -> dict[tuple, float]:
    return {tuple(series["metric"].get(label, "") for label in labels): float(series["value"][1]) for series in result}


def ingest_eu(result: list[dict]) -> float:
    """The sum of a per-service result over the ingest step's EU replicas (ingest-eu-1 and -2)."""
    return sum(float(s["value"][1]) for s in result if s["metric"].get("service", "").startswith("ingest-eu-"))


def test_prometheus_answers_decisions_latency_per_hop_and_records_per_service_allowed(deployed, prometheus):
    state, _ = deployed
    for labels in [EU_PERSONAL] * 3 + [DENIED] * 2:
        _, answer = post(state, labels)
        assert answer.status == (200 if labels is EU_PERSONAL else 451), answer.text
    # Every target is scraped: each point's Envoy and OPA, each service, over mutual TLS.
    targets = len(state["points"]) + sum(1 for p in state["points"] if p["senders"]) + state["services"]
    up = answered(prometheus, "up", lambda r: len(r) == targets and all(s["value"][1] == "1" for s in r))
    assert {(s["metric"]["job"], s["value"][1]) for s in up} == {("complyroute-envoy", "1"), ("complyroute-opa", "1"), ("complyroute-services", "1")}
    assert len({(s["metric"]["job"], s["metric"].get("point") or s["metric"].get("service")) for s in up}) == targets

    # Decisions per point by outcome: the entry let the EU records through to the next hop; the
    # point deciding the hop into the store step denied the others with the rules' code.
    decisions = by(answered(prometheus, "sum by (point, status, answered_by, code) (envoy_complyroute_hops)",
                            lambda r: any(s["metric"].get("code") == "PURPOSE_NOT_CONSENTED" and float(s["value"][1]) >= 2 for s in r)),
                   "point", "status", "answered_by", "code")
    assert decisions[("entry", "200", "via_upstream", "")] >= 3
    denying = {point for (point, status, by_whom, code), count in decisions.items() if code == "PURPOSE_NOT_CONSENTED" and count >= 1}
    assert denying and all(point.startswith("sidecar-analyse-eu-") for point in denying)
    assert sum(count for (point, status, _, code), count in decisions.items() if code == "PURPOSE_NOT_CONSENTED") >= 2

    # A latency histogram per hop: each listener's time at its point (Envoy's own, by connection
    # manager: the listener), every deciding listener's among them; the entry's median within its buckets.
    # Envoy's histograms reach its metrics at its stats flush (every 5 s), after the counters: the
    # query waits for this test's five records, whatever the tests before it sent.
    hops = 'envoy_http_conn_manager_prefix!~"ready|metrics|ingress|admin"'  # the record-deciding listeners' only
    buckets = by(answered(prometheus, f"sum by (point, envoy_http_conn_manager_prefix, le) (envoy_http_downstream_rq_time_bucket{{{hops}}})",
                          lambda r: any(s["metric"].get("point") == "entry" and s["metric"].get("envoy_http_conn_manager_prefix") == "entry"
                                        and s["metric"].get("le") == "+Inf" and float(s["value"][1]) >= 5 for s in r)),
                 "point", "envoy_http_conn_manager_prefix", "le")
    assert buckets[("entry", "entry", "+Inf")] >= 5
    assert {point for point, _, _ in buckets} == {p["name"] for p in state["points"] if p["senders"]}
    [median] = query(prometheus, 'histogram_quantile(0.5, sum by (le) (envoy_http_downstream_rq_time_bucket{point="entry", '
                                 'envoy_http_conn_manager_prefix="entry"}))')
    assert 0 < float(median["value"][1]) < 60_000

    # Records per service: what each instance received, sent on and refused.
    received = by(answered(prometheus, "sum by (service) (complyroute_records_received_total)",
                           lambda r: ingest_eu(r) >= 5),
                  "service")
    assert received[("ingest-eu-1",)] + received[("ingest-eu-2",)] >= 5
    assert set(received) == {(s,) for s in ("ingest-eu-1", "ingest-eu-2", "ingest-us", "analyse-eu-1", "analyse-eu-2", "analyse-us",
                                            "store-eu-1", "store-eu-2")}
    forwarded = by(answered(prometheus, "sum by (service) (complyroute_records_forwarded_total)",
                            lambda r: ingest_eu(r) >= 5),
                   "service")
    assert forwarded[("ingest-eu-1",)] + forwarded[("ingest-eu-2",)] >= 5 and forwarded[("store-eu-1",)] == forwarded[("store-eu-2",)] == 0  # the last step sends nothing on
    # The OPAs' own metrics come through their points' listeners too: each decision timed by the plugin.
    assert query(prometheus, 'sum(grpc_request_duration_seconds_count{point="entry"})')


def test_a_metrics_listener_opens_to_the_monitoring_identity_only_and_serves_nothing_else_denied(deployed):
    state, _ = deployed
    config = yaml.safe_load(Path(state["scrape_config"]).read_text())
    [entry] = [c for c in config["scrape_configs"] if c["job_name"] == "complyroute-envoy"][0]["static_configs"][:1]
    target = f"https://{entry['targets'][0]}"
    monitoring = as_part(state, pki.MONITORING)
    with urllib.request.urlopen(f"{target}/metrics", timeout=10, context=monitoring) as answer:
        assert answer.status == 200 and b"envoy_complyroute_hops" in answer.read()
    # The admin interface's other pages and any other method are not there.
    for path, method in (("/config_dump", "GET"), ("/quitquitquit", "POST"), ("/metrics", "POST"), ("/stats", "GET")):
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(urllib.request.Request(f"{target}{path}", method=method), timeout=10, context=monitoring)
        assert refused.value.code == 404 and json.load(refused.value)["code"] == "NOT_FOUND", path
    # Another part's certificate, or none: the handshake fails.
    for context in (as_part(state, pki.CONTROL), as_part(state, pki.spiffe_id("service", "ingest-eu-1")), tls_context()):
        with pytest.raises((ssl.SSLError, ConnectionError, urllib.error.URLError)):
            urllib.request.urlopen(f"{target}/metrics", timeout=10, context=context).read()
