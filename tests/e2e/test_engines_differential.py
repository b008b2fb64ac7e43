"""The two engines answer alike: every point of the decision space, and thousands of hostile labellings.

For every enforcing topology with the mixed-regions services, each enforcement point's real
Envoy and OPA run under one engine, then under the other, with a sink Envoy standing in for
the services: on every address a point routes to, it answers 200 {"instance": <id>}. The
same requests go to every listener the compiled engine compiles (the hops out of services):

- every point of the decision space: each known region and category, consent absent or
  any canonical value (known purposes, sorted, each once);
- a few thousand generated hostile labellings (fixed seed): case, whitespace, repeated
  headers, commas, duplicates, unknown and empty values.

Both engines must give the same status and the same body: the instance chosen, or the
denial with its code, message and reasons.
"""

from __future__ import annotations

import http.client
import itertools
import json
import os
import random
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import pytest

from complyroute import engines
from complyroute.engines.envoy_compiled import compiled_listeners
from complyroute.engines.precompute import canonical_sets
from complyroute.policy import bundles, policyfiles
from complyroute.policy.labels import schema
from complyroute.proxy.opa import BundleSource
from complyroute.runtime.local import deployment, rendering, supervision
from complyroute.topology import manifest
from complyroute.topology.plan import Endpoint, place

from .helpers import ENFORCING, MIXED_REGIONS, REFERENCE

pytestmark = pytest.mark.e2e

HOSTILE_PER_LISTENER = 600
RECORD = json.dumps({"subject": "alice", "reading": 42})
LABEL_HEADERS = {"region": "x-data-region", "category": "x-data-category", "consent": "x-data-consent"}


def decision_space() -> list[dict]:
    """Every canonical labelling: {label: [header values]} (an absent label has no values)."""
    consent = next(label for label in schema(policyfiles.POLICIES) if label.name == "consent")
    consents = [[]] + [[value] for value in canonical_sets(consent, list(REFERENCE["purposes"]))]
    return [
        {"region": [region], "category": [category], "consent": consent}
        for region, category, consent in itertools.product(sorted(REFERENCE["regions"]), sorted(REFERENCE["categories"]), consents)
    ]


def mutations(values: list[str]) -> list[str]:
    """Hostile variants of known label values."""
    pool = []
    for value in values:
        pool += [value, value.lower(), value.upper(), value.title(), f" {value}", f"{value} ", f"{value},", f",{value}",
                 f"{value},{value}", f"{value}, {value}", f"{value}x", value[:-1]]
    pool += ["", " ", ",", ",,", "unknown", "EU;US", "*"]
    return pool


def hostile_labellings(count: int, seed: int) -> list[dict]:
    generator = random.Random(seed)
    regions, categories, purposes = sorted(REFERENCE["regions"]), sorted(REFERENCE["categories"]), sorted(REFERENCE["purposes"])
    pools = {"region": mutations(regions), "category": mutations(categories), "consent": mutations(purposes)}

    def consent_value() -> str:
        chosen = generator.sample(purposes, generator.randint(1, 4))
        if generator.random() < 0.5:
            chosen.append(generator.choice(chosen))  # a duplicate
        return generator.choice([",", ", ", " ,"]).join(chosen)

    labellings = []
    for _ in range(count):
        labelling = {}
        for label, pool in pools.items():
            # Mostly valid values, so the hostile one is often the only thing wrong.
            valid = {"region": regions, "category": categories, "consent": [",".join(sorted(generator.sample(purposes, 2)))]}[label]
            headers = generator.choices([0, 1, 1, 1, 2], k=1)[0]
            values = []
            for _ in range(headers):
                roll = generator.random()
                if label == "consent" and roll < 0.3:
                    values.append(consent_value())
                elif roll < 0.6:
                    values.append(generator.choice(valid))
                else:
                    values.append(generator.choice(pool))
            labelling[label] = values
        labellings.append(labelling)
    return labellings


def sink_envoy(destinations: dict[str, Endpoint], admin: Endpoint) -> dict:
    """An Envoy answering 200 {"instance": id} on every address a point routes to."""
    socket = lambda e: {"socket_address": {"address": e.address, "port_value": e.port}}
    listeners = []
    for instance, endpoint in sorted(destinations.items()):
        manager = {
            "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
            "stat_prefix": instance,
            "route_config": {"virtual_hosts": [{"name": instance, "domains": ["*"], "routes": [{
                "match": {"prefix": "/"},
                "direct_response": {"status": 200, "body": {"inline_string": json.dumps({"instance": instance})}},
            }]}]},
            "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}],
        }
        listeners.append({"name": instance, "address": socket(endpoint),
                          "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": manager}]}]})
    return {"admin": {"address": socket(admin)}, "static_resources": {"listeners": listeners}}


class Engine:
    """One engine's enforcement points of a plan, and the sink, running."""

    def __init__(self, plan, kind: str, folder):
        self.plan, self.kind, self.folder = plan, kind, folder
        self.pids: list[int] = []

    def __enter__(self):
        logs = self.folder / "logs"
        logs.mkdir(parents=True)
        # Only the deciding side of each point: a sidecar's ingress would take the sink's
        # addresses (its service's, which the sink stands in for).
        points = [replace(point, forwarding=[]) for point in self.plan.points if point.deciding]
        configs = engines.configure(self.kind, points, self.plan.topology.engine, policyfiles.POLICIES)
        # Their OPAs' bundles, served in plain HTTP on loopback as a deployment without mTLS does.
        revision = bundles.write(self.folder / rendering.BUNDLES, {p.name: configs[p.name].data for p in points})
        bundle_server = Endpoint("127.0.0.1", 39991)
        parts = [rendering.bundle_server_part(self.folder / rendering.BUNDLES, bundle_server, "test", logs, None, None)]
        for point in points:
            parts += rendering.point_parts(point, configs[point.name], self.folder / point.name, logs, revision,
                                            BundleSource(bundle_server.url), {})
        destinations = {i: e for point in points for i, e in point.destinations.items()}
        sink_admin = Endpoint("127.0.0.1", 39990)
        (self.folder / "sink.json").write_text(json.dumps(sink_envoy(destinations, sink_admin)))
        parts.append(rendering.Part("sink", "envoy", "test", [rendering.envoy_binary(), "-c", str(self.folder / "sink.json"), "--disable-hot-restart", "--log-level", "warn"],
                                     {}, f"{sink_admin.url}/ready", str(logs / "sink.log")))
        for part in parts:
            self.pids.append(rendering.start(part))
            if not wait_healthy(part, self.pids[-1]):
                self.__exit__()
                raise RuntimeError(f"{part.name} did not start: {deployment.tail(part.log)}")
        return self

    def __exit__(self, *exc):
        for pid in self.pids:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def wait_healthy(part, pid, timeout=30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not supervision.alive(pid):
            return False
        if supervision.healthy(part.health_url, timeout=0.5):
            return True
        time.sleep(0.1)
    return False


def answers(requests: list[tuple[Endpoint, dict]]) -> list[tuple[int, dict | str]]:
    """Send every (listener, labelling) as POST /process; (status, JSON body or text) each."""
    local = threading.local()

    def one(index_request):
        index, (endpoint, labelling) = index_request
        connections = local.__dict__.setdefault("connections", {})
        connection = connections.get(endpoint)
        if connection is None:
            connection = connections[endpoint] = http.client.HTTPConnection(endpoint.address, endpoint.port, timeout=30)
        connection.putrequest("POST", "/process", skip_accept_encoding=True)
        connection.putheader("content-type", "application/json")
        connection.putheader("content-length", str(len(RECORD)))
        connection.putheader("x-request-id", f"differential-{index}")
        for label, values in labelling.items():
            for value in values:
                connection.putheader(LABEL_HEADERS[label], value)
        connection.endheaders(RECORD.encode())
        answer = connection.getresponse()
        text = answer.read().decode()
        try:
            return answer.status, json.loads(text)
        except json.JSONDecodeError:
            return answer.status, text

    with ThreadPoolExecutor(max_workers=6) as pool:
        return list(pool.map(one, enumerate(requests)))


@pytest.mark.parametrize("topology", ENFORCING)
def test_engines_agree_on_every_point_of_the_decision_space_and_on_hostile_labels(topology, tmp_path):
    if deployment.read_state():
        deployment.stop()
    plan = place(manifest.load(topology, services=str(MIXED_REGIONS)))
    listeners = [listener for point in plan.points for listener in compiled_listeners(point)]
    assert len(listeners) == 4, "the hops out of ingest-eu, ingest-us, analyse-eu and analyse-us"
    space = decision_space()
    requests = [(listener.endpoint, labelling) for listener in listeners for labelling in space]
    for number, listener in enumerate(listeners):
        requests += [(listener.endpoint, labelling) for labelling in hostile_labellings(HOSTILE_PER_LISTENER, seed=number)]

    seen = {}
    for kind in manifest.ENGINES:
        with Engine(plan, kind, tmp_path / kind):
            seen[kind] = answers(requests)
    opa, compiled = seen["envoy-opa"], seen["envoy-compiled"]
    differing = [(requests[i][0].port, requests[i][1], opa[i], compiled[i]) for i in range(len(requests)) if opa[i] != compiled[i]]
    assert not differing, f"{len(differing)} of {len(requests)} answers differ, for example: {differing[:3]}"

    statuses = [status for status, _ in opa]
    # Both kinds of outcome occur, or the comparison would prove little.
    assert statuses.count(200) > 1000 and statuses.count(451) > 100 and statuses.count(400) > 1000, {s: statuses.count(s) for s in set(statuses)}
    assert {body["instance"] for status, body in opa if status == 200} == {"analyse-eu", "analyse-us", "store-eu"}
