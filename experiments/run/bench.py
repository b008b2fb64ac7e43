"""`make bench`: the CPU each part of a hop costs, beside a floor measured in the same run.

This machine is slow and shared, so absolute figures only describe it; the ratios of a part
to its floor are what count. Every part and its floor run side by side on loopback and are
measured in turns (several rounds, medians), each as the CPU time (user + system, all
threads) its process used for a fixed number of sequential records, divided by their number:

- service hop: a service instance (services/server.js, bundled as every deployment runs it)
  that receives a record, forwards it and answers, with no configured work, against a minimal
  Fastify app doing the same with the same client (services/bench/floor.js); the configured
  work is shown apart. Both forward to the same minimal app, which is not measured. A second
  pair has the next hop answer a path of 49 entries, as at the head of a 50-service chain: a
  hop must not grow with the chain.
- Envoy traversal: a forwarding listener as enforcement points render it, against an Envoy
  with nothing but the router filter.
- decision through ext_authz (engine envoy-opa): the central entity's listener for the hop
  into its last service, at 5 services. Envoy against the bare Envoy; OPA against `opa
  bench` of the same query on the same check request. An OPA whose policy allows everything,
  behind the same ext_authz, shows what the plugin costs before any rule runs.
- compiled engine (envoy-compiled): the same listener and record; Envoy against the bare
  Envoy. Its OPA must receive no call (checked on Envoy's ext_authz counter).
- the entry (issue 39): the central entity's client listener under envoy-compiled with a
  deployment's token key: its decision and label token, OPA against the allow-all OPA; and with
  `decision_logs: file` against that.
- access log and hop counters (issue 41): every deciding point writes a JSON access log line per
  record into a file and counts and times the hop (Envoy's stats access logger), as a deployment's
  does; the envoy-opa and compiled points' Envoys are then given their listeners without them and
  with them again, alternately (bench_parts.unobserved, Bench.observe), and the difference is
  shown as a share of the hop's enforcement CPU (Envoy + OPA; under the compiled engine Envoy
  alone), target at most 5 % more (observability).
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
- paced (issue 39): the parts a record of the central entity crosses (bench_sum.recipe) under
  either engine, and those of the baseline and of the floor (the central entity's Envoys and
  mutual TLS, no rule), again, their records paced at bench_sum.PACED_RATE a second instead of back to back, every part
  sent to at once as in a deployment: at a cell's rate a process waits between records and
  wakes for each, which back-to-back records never pay (experiments/analysis/bench_sum.py
  sums both against the cells' CPU per record).

Prints a table and writes it as CSV (default runs/bench/<time>/bench.csv).

Over 400 lines: every row's measurement, judgement and printing, beside the list of what it measures.
"""

from __future__ import annotations

import csv
import hashlib
import http.client
import itertools
import json
import signal
import ssl
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from complyroute.authoring import policybench
from complyroute.files import write_folder
from complyroute.policy.ruleset import RuleSet
from complyroute.proxy.contract import DIGEST_HEADER, LABEL_TOKEN_HEADER
from complyroute.proxy.opa import write_data
from complyroute.runtime.local import labelchange, rendering
from complyroute.topology import localhttp, manifest
from complyroute.runtime.target import runs_root
from complyroute.topology.plan import Endpoint, place
from complyroute.trust import identity, pki
from complyroute.trust.identity import TOKEN_ISSUER

from experiments.analysis import bench_sum
from experiments.design.matrix import BENCH_OBSERVABILITY
from experiments.run.bench_parts import RECORD_LABELS, TOKEN_AUDIENCE, TOKEN_LIFETIME, Bench, Pair, start_parts

BODY = json.dumps({"subject": "alice", "amount": 12}).encode()
# A record's number in its request id, across every measurement of the run: a service in label-token
# mode takes each id once.
RECORD_NUMBERS = itertools.count(1)
CSV_FIELDS = ["part", "process", "value", "unit", "floor", "floor_value", "ratio", "target", "verdict"]


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


def send(url: str, records: int, labels: dict[str, str], context: ssl.SSLContext | None = None, headers: dict | Callable[[], dict] | None = None,
         rate: float | None = None) -> None:
    """`records` sequential POSTs over one keep-alive connection; each must be answered 200.

    An https `url` is reached over TLS with `context` (the bench's certificate as a part); `labels`: the
    record's (Bench.record_headers); `headers` are sent with them: a dict, or a function giving each record's.
    `rate`: records a second, each sent at its time (None: each as soon as the last is answered)."""
    scheme, address = url.split("://", 1)
    host, port = address.split(":")
    if scheme == "https":
        connection = http.client.HTTPSConnection(host, int(port), timeout=30, context=context)
    else:
        connection = http.client.HTTPConnection(host, int(port), timeout=30)
    common = {"content-type": "application/json", **labels}
    fixed = {**common, **(headers or {})} if not callable(headers) else None
    start = time.monotonic()
    try:
        for number in range(records):
            if rate and (wait := start + number / rate - time.monotonic()) > 0:
                time.sleep(wait)
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


def measure(bench: Bench, pairs: list[Pair], records: int, rounds: int, out=sys.stdout) -> dict[str, float]:
    """Median ms of CPU per record of every pair's process, over `rounds` turns of `records` each.

    Pairs with the same url (Envoy and OPA of one point) are measured over the same records.
    """
    samples: dict[str, list[float]] = {pair.part: [] for pair in pairs}
    by_url, sending = senders(bench, pairs)
    for url in by_url:
        send(url, 200, **sending[url])  # warm every path up: connections, JIT, caches
    for round_number in range(1, rounds + 1):
        for url, group in by_url.items():
            before = {pair.part: bench.cpu_seconds(pair.process) for pair in group}
            send(url, records, **sending[url])
            for pair in group:
                samples[pair.part].append((bench.cpu_seconds(pair.process) - before[pair.part]) * 1000 / records)
        print(f"bench: round {round_number}/{rounds} measured", file=out, flush=True)
    return {part: statistics.median(values) for part, values in samples.items()}


def measure_paced(bench: Bench, pairs: list[Pair], records: int, rounds: int, out=sys.stdout) -> list[Row]:
    """The pairs whose process a record of a case bench_sum prices crosses (bench_sum.recipe), their
    records paced at bench_sum.PACED_RATE a second, every url sent to at once (a thread each);
    median ms of CPU per record over `rounds`, as rows of their own unit (bench_sum.PACED_UNIT)."""
    pairs = [pair for pair in pairs if pair.process in bench_sum.processes()]
    samples: dict[str, list[float]] = {pair.part: [] for pair in pairs}
    by_url, sending = senders(bench, pairs)
    with ThreadPoolExecutor(max_workers=len(by_url)) as pool:
        for round_number in range(1, rounds + 1):
            before = {pair.part: bench.cpu_seconds(pair.process) for pair in pairs}
            list(pool.map(lambda url: send(url, records, **sending[url], rate=bench_sum.PACED_RATE), by_url))
            for pair in pairs:
                samples[pair.part].append((bench.cpu_seconds(pair.process) - before[pair.part]) * 1000 / records)
            print(f"bench: paced round {round_number}/{rounds} measured", file=out, flush=True)
    return [Row(f"{pair.part}, paced at {bench_sum.PACED_RATE} records/s", pair.process, statistics.median(samples[pair.part]),
                unit=bench_sum.PACED_UNIT) for pair in pairs]


def senders(bench: Bench, pairs: list[Pair]) -> tuple[dict[str, list[Pair]], dict[str, dict]]:
    """The pairs by the url their records go to (an Envoy and its OPA share one), and how each
    url is sent to (send's arguments beyond the url and the number of records)."""
    by_url: dict[str, list[Pair]] = {}
    for pair in pairs:
        by_url.setdefault(pair.url, []).append(pair)
    shared = {LABEL_TOKEN_HEADER: label_token(bench.token_jwk, BODY, "bench-1")}
    digest = "sha256:" + hashlib.sha256(BODY).hexdigest()

    def per_record() -> dict:
        request_id = f"bench-record-{next(RECORD_NUMBERS)}"
        return {"x-request-id": request_id, LABEL_TOKEN_HEADER: label_token(bench.token_jwk, BODY, request_id), DIGEST_HEADER: digest}

    sending = {}
    for url, group in by_url.items():
        if len({(pair.client, pair.token) for pair in group}) > 1:
            raise ValueError(f"bench: the pairs measured at {url} send differently")
        token = {"": None, "shared": shared, "per-record": per_record}[group[0].token]
        sending[url] = {"labels": bench.record_headers, "context": bench.client(group[0].client), "headers": token}
    return by_url, sending


def policy_evaluation(context: dict, scratch: Path) -> float:
    """ms per evaluation of the query Envoy asks, by `opa bench`, on the bench's check request."""
    request = policybench.envoy_input(context["sender"], context["step"], context["labels"])
    decision, figures = policybench.bench_query(context["point"], request, scratch)
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
    return {name: policybench.bench(rule_set, data_dir, request, scratch)["median_us"] / 1000
            for name, request in requests.items()}


def unobserved(listeners_file: str) -> str:
    """A deciding point's listeners file without the access log and hop counters of its listeners
    (proxy/accesslog.py, proxy/metrics.py hop_stats), under a version of its own: their floor."""
    response = json.loads(listeners_file)
    for chain in (chain for listener in response["resources"] for chain in listener["filter_chains"]):
        for network_filter in chain["filters"]:
            network_filter["typed_config"].pop("access_log", None)
    return json.dumps({**response, "version_info": f"{response['version_info']}-unobserved"}, separators=(",", ":"))


def observe(bench: Bench, name: str, observed: bool, timeout: float = 30) -> None:
    """Give point `name`'s Envoy its listeners with their access log and hop counters (as deployed)
    or without (unobserved) through its listeners file, and wait until it serves them."""
    point, generated = bench.points[name]
    [(file_name, content)] = generated.listeners.items()
    content = content if observed else unobserved(content)
    write_folder(Path(rendering.layout(bench.folder).listeners(name)), {file_name: content})
    version = json.loads(content)["version_info"]
    deadline = time.monotonic() + timeout
    while labelchange.envoy_listeners_version(point) != version:
        if time.monotonic() > deadline:
            raise RuntimeError(f"bench: {name}'s Envoy did not take its listeners {'with' if observed else 'without'} access log "
                               f"and hop counters within {timeout:.0f} s")
        time.sleep(0.05)


def warm_up(url: str, labels: dict[str, str], timeout: float = 10) -> None:
    """Records until one is answered 200: a listener Envoy has just replaced opens its gRPC
    connection to OPA on its first record, which a busy machine may answer 503 (as after a deploy,
    docs/architecture.md "Ready means deciding")."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            send(url, 1, labels)
            return
        except (RuntimeError, OSError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


# What the access log and the hop counters may cost a hop: a twentieth of its enforcement CPU.
OBSERVABILITY_TARGET = 1.05


def observability(bench: Bench, points: dict[str, str], records: int, rounds: int, out=sys.stdout) -> list[Row]:
    """What a deciding point's access log and hop counters cost a hop, as a share of the hop's
    enforcement CPU: the same point's Envoy given its listeners without them and with them
    (observe), alternately, `rounds` times each, measured over `records` records; its
    OPA's CPU (which Envoy's logging does not reach) counted on both sides as its median over
    every round. Two Envoys of one configuration differ by more than this cost (0.02 to 0.05 ms
    of CPU a record here), so it is measured in one. `points`: point name -> what it is (a row's
    name); a point whose OPA answers no allowed hop (the compiled engine) is Envoy alone."""
    samples = {name: {"with": [], "without": [], "opa": []} for name in points}
    for round_number in range(1, rounds + 1):
        for name in points:
            for observed in (False, True):
                observe(bench, name, observed)
                warm_up(bench.urls[name], bench.record_headers)
                before = {process: bench.cpu_seconds(f"{name}/{process}") for process in ("envoy", "opa")}
                send(bench.urls[name], records, bench.record_headers)
                spent = {process: (bench.cpu_seconds(f"{name}/{process}") - before[process]) * 1000 / records for process in before}
                samples[name]["with" if observed else "without"].append(spent["envoy"])
                samples[name]["opa"].append(spent["opa"])
        print(f"bench: observability round {round_number}/{rounds} measured", file=out, flush=True)
    rows = []
    for name, what in points.items():
        opa = statistics.median(samples[name]["opa"])
        asks_opa = opa >= 0.01  # the compiled engine's OPA answers none of these records
        opa = opa if asks_opa else 0.0
        without, with_ = statistics.median(samples[name]["without"]), statistics.median(samples[name]["with"])
        rows.append(Row(f"{what}: Envoy without its access log and hop counters", f"{name}/envoy", without))
        rows.append(Row(f"{BENCH_OBSERVABILITY} ({what}): the hop's enforcement CPU, Envoy{' + OPA' if asks_opa else ''}",
                        f"{name}/envoy" + (f" + {name}/opa" if asks_opa else ""), with_ + opa,
                        "the same, its Envoy alternately without them", without + opa, OBSERVABILITY_TARGET))
    return rows


def run(rule_set: RuleSet, out_file: Path | None = None, records: int = 1500, rounds: int = 3, out=sys.stdout,
        policy_sizes: Sequence[int] = policybench.SIZES, policy_topologies: Sequence[str] | None = None,
        engine_settings: dict | None = None) -> list[Row]:
    """Measure everything once, the points configured by `rule_set`; print the table, write the CSV, return the rows. `policy_sizes`,
    `policy_topologies`: the deployments' numbers of services and the topologies (None: every
    deciding one) the policy's rows are measured at (policybench.compare). `engine_settings`: taken
    by every point over the central entity manifest's (its timeouts, for a run on a starved machine)."""
    out_file = out_file or runs_root() / "bench" / time.strftime("%Y%m%d-%H%M%S") / "bench.csv"
    out_file.parent.mkdir(parents=True, exist_ok=True)
    print(f"bench: {rounds} rounds of {records} sequential records per part; CSV: {out_file}", file=out, flush=True)
    with tempfile.TemporaryDirectory() as scratch_name:
        scratch = Path(scratch_name)
        bench = Bench(out_file.parent / "processes", rule_set, scratch)
        bench.folder.mkdir(parents=True, exist_ok=True)
        try:
            pairs, context = start_parts(bench, scratch, engine_settings or {})
            bench.wait_until_listening()
            medians = measure(bench, pairs, records, rounds, out)
            paced = measure_paced(bench, pairs, records, rounds, out)
            observed = observability(bench, context["observed"], records, rounds, out)
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
    rows += paced + observed
    print("bench: the policy, this rule set against commit d2d81e4 (opa bench, medians)", file=out, flush=True)
    for case in policybench.compare(out=out, sizes=policy_sizes, benched=policy_topologies):
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


def interrupted(signum, frame):
    raise KeyboardInterrupt


def command(rule_set: RuleSet, out_file: Path | None, records: int, rounds: int) -> int:
    """`make bench`: run() with SIGTERM (a job stopped, a session ending) stopping it as Ctrl-C
    does, through run()'s own stop of the parts it started: Python's default ends the process at
    once, and left its Envoys, OPAs and Node apps running, holding the bench's ports. 0 when
    every target is met, 1 when one is not, 130 when interrupted."""
    previous = signal.signal(signal.SIGTERM, interrupted)
    try:
        rows = run(rule_set, out_file, records=records, rounds=rounds)
    except KeyboardInterrupt:
        print("bench: interrupted; the parts it started are stopped", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    return 0 if all(row.verdict != "NOT MET" for row in rows) else 1


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
