"""The two engines answer alike: every point of the decision space, and thousands of hostile labellings.

For each rule set with its example manifest (the shipped one over mixed-regions, the
classification one over classification.yaml) and every enforcing topology, each enforcement
point's real Envoy and OPA run under one engine, then under the other, with a sink Envoy
standing in for the services: on every address a point routes to, it answers 200
{"instance": <id>}. The same requests go to every listener the compiled engine compiles (the
hops out of services):

- every point of the decision space, from the rule set's label schema (precompute.choices,
  over every known value): each value of a single-valued label (and absent, unless required),
  a multiple label absent or any canonical set of its known values; with each of the rule
  set's records (classification's rules read the body: an adult's record and a minor's);
- generated hostile labellings (fixed seed) under the schema's headers: case, whitespace,
  repeated headers, commas, duplicates, unknown and empty values.

The shipped rule set's space (3,072 labellings) and each service's 600 hostile labellings are
shared out among the four topologies: each cell sends a fourth of them (a different fourth
each), so that the four together send every one once. What the engines could disagree on does not depend on
the topology: a listener's matcher tree is the rule set's answers for its sender, whichever
Envoy holds it, and the compiled engine's configure-time guard (envoy_compiled.check_routes)
walks every listener's tree of every topology over the whole space as Envoy walks it; a
fourth still reaches every destination and every denial reason through each topology's own
Envoys, clusters and OPAs. The classification rule set's space is small and reads the body;
every cell sends all of it and 250 hostile labellings per service.

A service's first replica gets all of its cell's requests; each further replica (ingest-eu-2,
analyse-eu-2) an eighth, a different slice of them for each. Replicas share their service's
region, certifications and purposes, so its rule sets answer them alike; the test checks that
too: a replica's answers are its first replica's, labelling by labelling, under both engines.
The eighth shows each replica's listener rendered and deciding. (Sent in full at every listener
of every topology, this test took a third of `make test`'s CPU; with the shares, a cell of the
shipped rule set sends a quarter of that.)

Both engines must give the same status and the same body: the instance chosen (by the entry
it is a replica of: a set's cluster balances over the EU replicas under either engine, so
which replica answers varies, and under each engine every replica answers some), or the
denial with its code, message and reasons. A rule set that reads the body has no allowed
table (precompute.py): every hop asks OPA in both engines, and the test shows that the
compiled engine's listeners hand OPA all it needs.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import shutil
import signal
import socket
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from complyroute.engines import configuration
from complyroute.engines.envoy_compiled import compiled_listeners
from complyroute.engines.precompute import choices, labellings_of
from complyroute.policy import bundles, policyfiles
from complyroute.policy.labels import Label, reference_of, schema
from complyroute.policy.ruleset import RuleSet
from complyroute.proxy.opa import BundleSource
from complyroute.runtime.local import deployment, rendering, supervision
from complyroute.topology import manifest
from complyroute.topology.plan import LOOPBACK_VARIABLE, Endpoint, LocalNetwork, place

from .helpers import ENFORCING, MIXED_REGIONS, RECORD, STARVED_MACHINE_TIMEOUTS, entry_of

# On a loopback network of its own, with no deployment: `make test` runs it beside the
# end-to-end suite's deployments, which take the same ports, and gives it a network it holds
# (COMPLYROUTE_LOOPBACK: tests/loopbacks.py); run alone, 127.0.9.
pytestmark = pytest.mark.own_network
LOOPBACK = os.environ.get(LOOPBACK_VARIABLE) or "127.0.9"

CLASSIFICATION = manifest.REPO / "topologies" / "examples" / "classification.yaml"
SINK_ADMIN, BUNDLE_SERVER = Endpoint(f"{LOOPBACK}.253", 39990), Endpoint(f"{LOOPBACK}.253", 39991)
# Requests in flight: enough to keep both cores busy with the points' Envoys and OPAs.
CLIENTS = 8

# What a further replica of a service gets of the requests its first replica gets (module docstring).
REPLICA_SHARE = 8
# The order in which the topologies' cells share out a rule set's space and each service's hostile
# labellings (module docstring).
SPACE_SEED = 26

# A request: the listener, the label headers as sent (name, value; a name may repeat), the body.
Request = tuple[Endpoint, tuple[tuple[str, str], ...], bytes]


@dataclass(frozen=True)
class RuleSetRun:
    """A rule set's example manifest (whose `policy` names the rule set), what is sent, and what
    the answers must hold for the comparison to prove much: both kinds of outcome, often."""

    services: Path
    records: tuple[dict, ...]
    hostile_per_listener: int
    shared_by_topologies: bool  # each topology's cell sends a share of the space and of the hostile labellings (module docstring)
    fewest: dict[int, int]  # status -> the fewest answers with it
    reached: frozenset[str]  # the instances the allowed answers name, together
    reasons: frozenset[str] = frozenset()  # denial reasons that must occur among the answers


RUNS = {
    # A 400 (a malformed label) comes mostly from the hostile labellings, a fourth of which a cell sends.
    "policies": RuleSetRun(MIXED_REGIONS, (RECORD,), 600, True, {200: 1000, 451: 100, 400: 250},
                           frozenset({"analyse-eu", "analyse-us", "store-eu"})),
    # Fewer hostile labellings: its two labels are single-valued (no set to reorder, repeat or
    # separate) with four and three values, so 250 per listener already send each hostile form
    # many times; and with no allowed table every answer is OPA's full evaluation, with the body.
    "classification": RuleSetRun(CLASSIFICATION, ({"subject": "ann", "subject_age": 40}, {"subject": "tim", "subject_age": 15}),
                                 250, False, {200: 300, 451: 50, 400: 300},
                                 frozenset({"analyse-eu", "analyse-us", "store-eu", "store-us"}),
                                 frozenset({"MINOR_TO_MARKETING"})),  # the rule that reads the body
}


def decision_space(labels: tuple[Label, ...], reference: dict) -> list[tuple[tuple[str, str], ...]]:
    """Every labelling the schema's labels can take in canonical form, over every known value
    (precompute.choices without `held`), as header lines: an absent label has none."""
    return [tuple((label.header, value) for label, value in zip(labels, values) if value is not None)
            for values in labellings_of([choices(label, reference) for label in labels])]


def mutations(values: list[str]) -> list[str]:
    """Hostile variants of known label values."""
    pool = []
    for value in values:
        pool += [value, value.lower(), value.upper(), value.title(), f" {value}", f"{value} ", f"{value},", f",{value}",
                 f"{value},{value}", f"{value}, {value}", f"{value}x", value[:-1]]
    pool += ["", " ", ",", ",,", "unknown", "EU;US", "*"]
    return pool


def hostile_labellings(labels: tuple[Label, ...], reference: dict, count: int, seed: int) -> list[tuple[tuple[str, str], ...]]:
    """`count` labellings as header lines, each label in 0 to 2 headers, each header mostly a
    valid value (so that the hostile one is often the only thing wrong), else a mutation; a
    multiple label's value often a set written loosely (any order, duplicates, spaces)."""
    generator = random.Random(seed)
    known = {label.name: label.known(reference) for label in labels}
    pools = {label.name: mutations(known[label.name]) for label in labels}

    def loose_set(values: list[str]) -> str:
        chosen = generator.sample(values, generator.randint(1, min(4, len(values))))
        if generator.random() < 0.5:
            chosen.append(generator.choice(chosen))  # a duplicate
        return generator.choice([",", ", ", " ,"]).join(chosen)

    labellings = []
    for _ in range(count):
        lines = []
        for label in labels:
            values = known[label.name]
            valid = [",".join(sorted(generator.sample(values, min(2, len(values)))))] if label.multiple else values
            for _ in range(generator.choice([0, 1, 1, 1, 2])):
                roll = generator.random()
                if label.multiple and roll < 0.3:
                    lines.append((label.header, loose_set(values)))
                elif roll < 0.6:
                    lines.append((label.header, generator.choice(valid)))
                else:
                    lines.append((label.header, generator.choice(pools[label.name])))
        labellings.append(tuple(lines))
    return labellings


def requests_of(listeners, labels: tuple[Label, ...], reference: dict, run: RuleSetRun, share: tuple[int, int]) -> list[Request]:
    """The cell's points of the space (cell_share, `share` its topology's) with every record,
    then its hostile labellings (each with one of the records), at the listener of each
    service's first replica; a slice of them (every REPLICA_SHARE-th) at a further replica's;
    the listeners' requests interleaved, so that the points' processes (one core each) work
    side by side."""
    bodies = [json.dumps(record).encode() for record in run.records]
    space = cell_share(decision_space(labels, reference), run, share)
    firsts, by_listener = first_replicas(listeners), []
    for number, listener in enumerate(listeners):
        replica = firsts[entry_of(listener.sender)] != listener.sender
        # Seeded by the service, so that a replica's slice holds requests its first replica gets.
        pick = random.Random(entry_of(listener.sender))
        hostile = cell_share(hostile_labellings(labels, reference, run.hostile_per_listener, seed=entry_of(listener.sender)), run, share)
        requests = ([(listener.endpoint, lines, body) for lines in space for body in bodies]
                    + [(listener.endpoint, lines, pick.choice(bodies)) for lines in hostile])
        by_listener.append(requests[number % REPLICA_SHARE::REPLICA_SHARE] if replica else requests)
    return [request for turn in itertools.zip_longest(*by_listener) for request in turn if request is not None]


def cell_share(labellings: list, run: RuleSetRun, share: tuple[int, int]) -> list:
    """The labellings (of the space, or a service's hostile ones) a topology's cell sends: all of
    them, or where the topologies share them out, the share[0]-th of share[1] shares, taken in a
    fixed random order (in the space's own order, a stride could hold one label's value fixed)."""
    if not run.shared_by_topologies:
        return labellings
    return random.Random(SPACE_SEED).sample(labellings, len(labellings))[share[0]::share[1]]


def first_replicas(listeners) -> dict[str, str]:
    """{entry: the sender of its first listener}: each service's first replica (ingest-eu-1)."""
    firsts: dict[str, str] = {}
    for listener in listeners:
        firsts.setdefault(entry_of(listener.sender), listener.sender)
    return firsts


def unlike_their_first_replica(requests: list[Request], answered: list[tuple[int, object]], listeners) -> list[tuple]:
    """Each request to a further replica's listener whose answer (by entry, its request id left
    out) is not the one its service's first replica gave the same labelling and body: (sender,
    headers, both answers)."""
    sender_at, firsts = {listener.endpoint: listener.sender for listener in listeners}, first_replicas(listeners)
    answered = [(status, {k: v for k, v in body.items() if k != "request_id"} if isinstance(body, dict) else body)
                for status, body in answered]
    first_answers = {(sender_at[endpoint], lines, body): answer for (endpoint, lines, body), answer in zip(requests, answered)
                     if sender_at[endpoint] in firsts.values()}
    unlike = []
    for (endpoint, lines, body), answer in zip(requests, answered):
        sender = sender_at[endpoint]
        if sender not in firsts.values() and (first := first_answers[(firsts[entry_of(sender)], lines, body)]) != answer:
            unlike.append((sender, lines, answer, first))
    return unlike


def sink_envoy(destinations: dict[str, Endpoint], admin: Endpoint) -> dict:
    """An Envoy answering 200 {"instance": id} on every address a point routes to."""
    address = lambda e: {"socket_address": {"address": e.address, "port_value": e.port}}
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
        listeners.append({"name": instance, "address": address(endpoint),
                          "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": manager}]}]})
    return {"admin": {"address": address(admin)}, "static_resources": {"listeners": listeners}}


class Running:
    """Processes started together (each in its own process group), killed together."""

    def __init__(self):
        self.pids: list[int] = []

    def start(self, parts: list[rendering.Part], timeout: float = 30.0) -> None:
        """Start the parts side by side and wait until each is healthy (RuntimeError, with its log, if one is not)."""
        started = [(part, rendering.start(part)) for part in parts]
        self.pids += [pid for _, pid in started]
        deadline = time.monotonic() + timeout
        for part, pid in started:
            while not supervision.healthy(part.health_url, timeout=0.5):
                if not supervision.alive(pid) or time.monotonic() > deadline:
                    raise RuntimeError(f"{part.name} did not start: {deployment.tail(part.log)}")
                time.sleep(0.05)

    def stop(self) -> None:
        for pid in self.pids:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.pids = []


def sink_part(plan, folder: Path) -> rendering.Part:
    """The sink, for every address the deciding points route to: the same under both engines."""
    destinations = {i: e for point in plan.points if point.deciding for i, e in point.destinations.items()}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sink.json").write_text(json.dumps(sink_envoy(destinations, SINK_ADMIN)))
    return rendering.Part("sink", "envoy", "test", [rendering.envoy_binary(), "-c", str(folder / "sink.json"), "--disable-hot-restart", "--log-level", "warn"],
                          {}, f"{SINK_ADMIN.url}/ready", str(folder / "sink.log"))


def engine_parts(plan, kind: str, policies: Path, folder: Path) -> tuple[rendering.Part, list[rendering.Part]]:
    """One engine's deciding points of a plan: (their bundle server, their OPAs and Envoys)."""
    logs = folder / "logs"
    logs.mkdir(parents=True)
    # Only the deciding side of each point: a sidecar's ingress would take the sink's
    # addresses (its service's, which the sink stands in for).
    points = [replace(point, forwarding=[]) for point in plan.points if point.deciding]
    signing_key = bundles.new_signing_key()
    # What the engines answer is compared here, not how fast (STARVED_MACHINE_TIMEOUTS).
    settings = {**plan.topology.engine, "kind": kind, **STARVED_MACHINE_TIMEOUTS}
    generated = configuration.generate(points, settings, RuleSet.of(policies), None, rendering.layout(folder),
                                       signing_key)
    # Their OPAs' bundles, signed and served in plain HTTP on loopback as a deployment without mTLS does.
    bundles.write(folder / rendering.BUNDLES, generated.bundles, generated.revision)
    server = rendering.bundle_server_part(folder / rendering.BUNDLES, BUNDLE_SERVER, "test", logs, None, None)
    parts = []
    for point in points:
        parts += rendering.point_parts(point, generated.points[point.name], folder / point.name, logs,
                                        BundleSource(BUNDLE_SERVER.url, bundles.verification_key(signing_key)), {})
    # Most answers here are OPA's full evaluation, thousands a minute: collecting garbage less
    # often (a larger heap, for processes that live a minute) spent a tenth less of OPA's time.
    return server, [replace(part, env={**part.env, "GOGC": "400"}) if part.kind == "opa" else part for part in parts]


def exchange(stream, request: bytes) -> tuple[int, bytes, bool]:
    """One request over a kept-alive HTTP/1.1 connection (a buffered socket file): (status, body,
    whether the listener closes the connection). Lean on purpose: http.client, which parses
    every answer's headers into a Message, took a tenth of the two cores' time."""
    stream.write(request)
    stream.flush()
    status_line = stream.readline()
    if not status_line:
        raise ConnectionError("the listener closed the connection without an answer")
    length, chunked, close = None, False, False
    while (line := stream.readline()) not in (b"\r\n", b"\n", b""):
        name, _, value = line.partition(b":")
        name, value = name.strip().lower(), value.strip().lower()
        if name == b"content-length":
            length = int(value)
        elif name == b"transfer-encoding":
            chunked = value == b"chunked"
        elif name == b"connection":
            close = value == b"close"
    if chunked:
        body = b""
        while size := int(stream.readline().split(b";")[0], 16):
            body += stream.read(size + 2)[:-2]
        while stream.readline() not in (b"\r\n", b"\n", b""):  # trailers
            pass
    elif length is not None:
        body = stream.read(length)
    else:
        body, close = stream.read(), True
    return int(status_line.split(b" ", 2)[1]), body, close


def answers(requests: list[Request]) -> list[tuple[int, dict | str]]:
    """Send every request as POST /process; (status, JSON body or text) each."""
    local, opened = threading.local(), []

    def one(index_request):
        index, (endpoint, lines, body) = index_request
        streams = local.__dict__.setdefault("streams", {})
        if endpoint not in streams:
            streams[endpoint] = socket.create_connection((endpoint.address, endpoint.port), timeout=30).makefile("rwb")
            opened.append(streams[endpoint])
        request = (f"POST /process HTTP/1.1\r\nhost: {endpoint.address}:{endpoint.port}\r\ncontent-type: application/json\r\n"
                   f"content-length: {len(body)}\r\nx-request-id: differential-{index}\r\n"
                   + "".join(f"{header}: {value}\r\n" for header, value in lines) + "\r\n").encode() + body
        status, text, close = exchange(streams[endpoint], request)
        if close:
            streams.pop(endpoint).close()
        try:
            return status, json.loads(text)
        except json.JSONDecodeError:
            return status, text.decode()

    try:
        with ThreadPoolExecutor(max_workers=CLIENTS) as pool:
            return list(pool.map(one, enumerate(requests)))
    finally:
        for stream in opened:
            stream.close()


def by_entry(answer: tuple[int, object]) -> tuple[int, object]:
    """An answer with the instance that took it named by its entry (ingest-eu for ingest-eu-2)."""
    status, body = answer
    if status == 200 and isinstance(body, dict) and "instance" in body:
        return status, {**body, "instance": entry_of(body["instance"])}
    return answer


def unbalanced(answered: list[tuple[int, object]], instances: list[str]) -> dict[str, set[str]]:
    """Per entry whose replicas took records, those of its `instances` that took none: a set's
    cluster balances over all of them, so an engine pinning a set to one instance shows here
    (the comparison by entry, above, cannot see it)."""
    took = {body["instance"] for status, body in answered if status == 200 and isinstance(body, dict) and "instance" in body}
    idle = {entry_of(instance): set() for instance in took}
    for instance in instances:
        if entry_of(instance) in idle and instance not in took:
            idle[entry_of(instance)].add(instance)
    return {entry: missing for entry, missing in idle.items() if missing}


def differences(requests: list[Request], seen: dict[str, list]) -> list[tuple]:
    """Each request the engines answered differently: (listener port, headers, body, each engine's answer)."""
    (first, one), (second, other) = seen.items()
    return [(endpoint.port, lines, body.decode(), {first: one[i], second: other[i]})
            for i, (endpoint, lines, body) in enumerate(requests) if one[i] != other[i]]


def test_differences_flag_a_status_an_instance_or_a_reason_that_differ():
    # The comparison the e2e test rests on: a status, an instance, a reason that differ are each flagged.
    requests = [(Endpoint("127.0.0.1", port), (("x-data-region", "EU"),), b"{}") for port in (1, 2, 3, 4)]
    denial = {"code": "NO_COMPLIANT_INSTANCE", "message": "m", "reasons": [{"code": "REGION_NOT_ALLOWED", "message": "r"}]}
    opa = [(200, {"instance": "a"}), (200, {"instance": "a"}), (451, denial), (400, "text")]
    compiled = [(200, {"instance": "a"}), (200, {"instance": "b"}), (451, {**denial, "reasons": []}), (451, "text")]
    assert [port for port, *_ in differences(requests, {"envoy-opa": opa, "envoy-compiled": compiled})] == [2, 3, 4]


def test_an_engine_pinning_a_set_to_one_replica_is_flagged_denied():
    instances = ["analyse-eu-1", "analyse-eu-2", "analyse-us"]
    balanced = [(200, {"instance": "analyse-eu-1"}), (200, {"instance": "analyse-eu-2"}), (200, {"instance": "analyse-us"})]
    assert unbalanced(balanced, instances) == {}
    pinned = [(200, {"instance": "analyse-eu-1"}), (200, {"instance": "analyse-eu-1"}), (451, {"code": "X"})]
    assert unbalanced(pinned, instances) == {"analyse-eu": {"analyse-eu-2"}}


@pytest.mark.parametrize("rule_set", RUNS)
def test_the_topologies_cells_send_every_point_of_the_space_once_or_each_all_of_it(rule_set):
    run = RUNS[rule_set]
    policies = policyfiles.rule_set(rule_set)
    space = decision_space(schema(policies), reference_of(policies))
    cells = [cell_share(space, run, (index, len(ENFORCING))) for index in range(len(ENFORCING))]
    if not run.shared_by_topologies:  # classification's: all of it in every cell
        assert all(cell == space for cell in cells)
        return
    # The shipped rule set's: every point once, in one of the cells, and in each cell every value of every label.
    assert sorted(point for cell in cells for point in cell) == sorted(space)
    assert all({line for point in cell for line in point} == {line for point in space for line in point} for cell in cells)


def test_a_replica_answering_unlike_its_first_replica_is_flagged_denied():
    @dataclass(frozen=True)
    class Listener:
        sender: str
        endpoint: Endpoint

    first, second = Listener("ingest-eu-1", Endpoint("127.0.0.1", 1)), Listener("ingest-eu-2", Endpoint("127.0.0.1", 2))
    eu, us = (("x-data-region", "EU"),), (("x-data-region", "US"),)
    requests = [(first.endpoint, eu, b"{}"), (first.endpoint, us, b"{}"), (second.endpoint, eu, b"{}"), (second.endpoint, us, b"{}")]
    alike = [(200, {"instance": "analyse-eu", "request_id": "1"}), (451, {"code": "X", "request_id": "2"}),
             (200, {"instance": "analyse-eu", "request_id": "3"}), (451, {"code": "X", "request_id": "4"})]
    assert unlike_their_first_replica(requests, alike, [first, second]) == []
    unlike = [*alike[:3], (200, {"instance": "analyse-us", "request_id": "4"})]
    assert unlike_their_first_replica(requests, unlike, [first, second]) == [("ingest-eu-2", us, (200, {"instance": "analyse-us"}), (451, {"code": "X"}))]


@pytest.fixture
def network():
    """Addresses on this test's loopback network, the points' sockets in a private folder of its own (a short path)."""
    private = Path(tempfile.mkdtemp(prefix="complyroute-"))
    yield LocalNetwork(private, loopback=LOOPBACK)
    shutil.rmtree(private, ignore_errors=True)


@pytest.mark.parametrize(("rule_set", "topology"), list(itertools.product(RUNS, ENFORCING)))
def test_engines_agree_on_every_point_of_the_decision_space_and_on_hostile_labels(rule_set, topology, network, tmp_path):
    run = RUNS[rule_set]
    plan = place(manifest.load(topology, services=str(run.services)), network)
    assert plan.topology.policy == rule_set  # the manifest names its rule set
    policies = policyfiles.rule_set(plan.topology.policy)
    labels, reference = schema(policies), reference_of(policies)
    listeners = [listener for point in plan.points for listener in compiled_listeners(point)]
    senders = plan.topology.instances_of("ingest") + plan.topology.instances_of("analyse")
    assert len(listeners) == len(senders), "a listener for the hops out of each ingest and analyse instance"
    requests = requests_of(listeners, labels, reference, run, share=(ENFORCING.index(topology), len(ENFORCING)))

    seen = {}
    sink = Running()
    try:
        sink.start([sink_part(plan, tmp_path)])
        for kind in manifest.ENGINES:
            server, parts = engine_parts(plan, kind, policies, tmp_path / kind)
            points = Running()
            try:
                points.start([server])  # before the OPAs, which load their bundles from it as they start
                points.start(parts)
                answered = answers(requests)
                idle = unbalanced(answered, [instance.id for instance in plan.topology.instances])
                assert not idle, f"{kind}: replicas that took no record while their sets took records: {idle}"
                seen[kind] = [by_entry(answer) for answer in answered]
            finally:
                points.stop()
    finally:
        sink.stop()
    differing = differences(requests, seen)
    assert not differing, f"{len(differing)} of {len(requests)} answers differ, for example: {differing[:3]}"
    for kind, answered in seen.items():
        unlike = unlike_their_first_replica(requests, answered, listeners)
        assert not unlike, f"{kind}: {len(unlike)} answers of replicas differ from their first replica's, for example: {unlike[:3]}"

    answered = seen[manifest.ENGINES[0]]
    statuses = {status: sum(1 for s, _ in answered if s == status) for status in {s for s, _ in answered}}
    # Both kinds of outcome occur, often, or the comparison would prove little.
    assert all(statuses.get(status, 0) > fewest for status, fewest in run.fewest.items()), (statuses, answered[:3])
    assert {body["instance"] for status, body in answered if status == 200} == run.reached
    reasons = {reason["code"] for status, body in answered if status == 451 for reason in body["reasons"]}
    assert run.reasons <= reasons, reasons
