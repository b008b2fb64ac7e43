"""What one policy decision costs at each topology's enforcement points: `opa bench`, this rule
set against the one of commit d2d81e4 (before the lean OPA path), in the same run.

For every topology at 5 and at 50 services, the enforcement point that decides the hop into
the last service evaluates the query its OPA answers for Envoy (data.complyroute.envoy.response)
with exactly the catalog slice that point holds: a sidecar knows the next step's instances, a
router its node's services and their next steps, the central entity everything. Each point
gets an allowed record and its denied twin (the same record without consent to the last
service's purpose), labelled as that point receives them: canonical, the way every point that
allowed a hop before rewrote them (one value each, consent sorted).

Each rule set is timed as its enforcement points run it: today's with its catalog indexed
(complyroute/policy/policydata.py), its allowed table (complyroute/engines/precompute.py: an allowed
record takes the quick path) and OPA's store optimised for reads; d2d81e4's with the catalog
itself at data.complyroute.catalog, and OPA's default store; both with a point's Go runtime
(policyfiles.GO_RUNTIME: one thread running Go), on the same CPU. Both decisions are checked before
anything is timed: each must be the one the case expects, and both must agree (a benchmark of
the wrong path measures nothing). Old and new are timed one after the other for each case, so
that a noisy machine weighs on both alike.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from complyroute.engines import envoy_opa, precompute
from complyroute.policy import labels, policyfiles
from complyroute.policy.policyfiles import OPA
from complyroute.proxy.opa import POLICY_QUERY, write_data
from complyroute.topology import manifest
from complyroute.topology.manifest import GENERATED_PURPOSES, REPO
from complyroute.topology.plan import EnforcementPoint, place
QUERY = "data." + POLICY_QUERY.replace("/", ".")
SIZES = [5, 50]
BASELINE_COMMIT = "d2d81e4"  # the rule set before the lean OPA path


def deciding_topologies() -> list[str]:
    """The experiments' topologies (manifest.paper_topologies) whose points decide hops."""
    return [name for name in manifest.paper_topologies() if place(manifest.load(name)).enforces]


def record_labels(consent: list[str]) -> dict[str, str]:
    """The bench's record, labelled by name: EU personal data with `consent`, canonical."""
    return {"region": "EU", "category": "personal", "consent": ",".join(sorted(consent))}


def envoy_input(sender: str, step: str, labelled: dict[str, str]) -> dict:
    """An ext_authz check request as Envoy sends it for a hop, with its route's context; the
    labels (by name) in the headers the shipped rule set's label schema names."""
    schema = labels.schema(policyfiles.POLICIES)
    return {"attributes": {
        "request": {"http": {
            "method": "POST",
            "path": "/process",
            "headers": {
                "content-type": "application/json",
                **{label.header: labelled[label.name] for label in schema if label.name in labelled},
                "x-request-id": "bench-1",
            },
            "body": json.dumps({"subject": "alice", "amount": 12}),
        }},
        "contextExtensions": {"sender": sender, "step": step},
    }}


def cases(topology_name: str, services: int):
    """(enforcement point, allowed input, denied input) for the hop into the last service."""
    topology = manifest.load(topology_name, services=services)
    last = topology.instances_of(topology.steps[-1])[0]
    sender = topology.instances_of(topology.steps[-2])[0].id
    for point in place(topology).points:
        for listener in point.deciding:
            if listener.sender == sender:
                allowed = envoy_input(sender, listener.step, record_labels(sorted(GENERATED_PURPOSES)))
                denied = envoy_input(sender, listener.step, record_labels(sorted(p for p in GENERATED_PURPOSES if p not in last.purposes)))
                return point, allowed, denied
    raise RuntimeError(f"{topology_name}: no enforcement point decides the hop from {sender}")


@dataclass(frozen=True)
class BenchedRuleSet:
    """A rule set as its enforcement points run it, to be benched: its policies, the data it
    reads, OPA's flags. Not a RuleSet (policy/ruleset.py): d2d81e4's reads its catalog whole and
    has no label schema or platform to assemble."""

    name: str
    policies: Path
    data_keys: tuple[str, ...]  # the documents of a point's data it reads, as paths under data
    # ({case: point}, {case: the points of its deployment} or None) -> {case: what its OPA loads}
    data: Callable[..., dict[str, dict]]
    flags: list[str] = field(default_factory=list)


class BaselineUnavailable(RuntimeError):
    """The rule set of BASELINE_COMMIT cannot be had (a shallow clone, an export without .git)."""


def current() -> BenchedRuleSet:
    return BenchedRuleSet("current", policyfiles.POLICIES, ("complyroute.index", f"{precompute.QUICK_PATH_DOCUMENT}.table"), point_documents, list(policyfiles.RUN_FLAGS))


def point_documents(points: dict[str, EnforcementPoint], deployments: dict[str, list[EnforcementPoint]] | None = None) -> dict[str, dict]:
    """{case: what the point's OPA loads under this rule set}: its index and its allowed table,
    built as its deployment builds it (`deployments`: the points of each case's deployment,
    whose instances' purposes the table covers; without, the point alone)."""
    return {case: envoy_opa.decided_data((deployments or {}).get(case, [point]), policyfiles.POLICIES)[0][point.name]
            for case, point in points.items()}


def baseline(scratch: Path) -> BenchedRuleSet:
    """The rule set of BASELINE_COMMIT, extracted into scratch, with its catalog as it read it."""
    archive = subprocess.run(["git", "-C", str(REPO), "archive", BASELINE_COMMIT, "policies"], capture_output=True)
    if archive.returncode != 0:
        raise BaselineUnavailable(f"commit {BASELINE_COMMIT} is not available: {archive.stderr.decode().strip()}")
    scratch.mkdir(parents=True, exist_ok=True)
    subprocess.run(["tar", "-x", "-C", str(scratch)], input=archive.stdout, check=True)
    as_catalogs = lambda points, deployments=None: {case: {"complyroute": {"catalog": point.catalog}} for case, point in points.items()}
    return BenchedRuleSet(BASELINE_COMMIT, scratch / "policies", ("complyroute.catalog",), as_catalogs)


def opa(*args: str, env: dict | None = None, cpus: set[int] | None = None) -> str:
    pin = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
    result = subprocess.run([str(OPA), *args], capture_output=True, text=True, env=env, preexec_fn=pin)
    if result.returncode != 0:
        raise RuntimeError(f"opa {args[0]} failed: {(result.stderr or result.stdout).strip()}")
    return result.stdout


def loading(rule_set: BenchedRuleSet, data_dir: Path) -> list[str]:
    return ["--data", str(rule_set.policies), *policyfiles.ignore_flags(), "--data", str(data_dir)]


def decisions(rule_set: BenchedRuleSet, asked: dict[str, tuple[dict, dict]], scratch: Path) -> dict[str, dict]:
    """{name: the rule set's answer} for every {name: (a point's data document, request)}, in one OPA run."""
    data_dir = scratch / f"{rule_set.name}-decisions"
    write_data(data_dir, {"bench": {name: {"data": document, "request": request} for name, (document, request) in asked.items()}})
    query = f"some name, asked in data.bench; answer := {QUERY} with input as asked.request " + " ".join(
        f"with data.{key} as asked.data.{key}" for key in rule_set.data_keys)
    results = json.loads(opa("eval", "--format", "json", *loading(rule_set, data_dir), query)).get("result", [])
    return {result["bindings"]["name"]: result["bindings"]["answer"] for result in results}


def bench(rule_set: BenchedRuleSet, data_dir: Path, request: dict, scratch: Path) -> dict:
    """`opa bench`'s figures for one request: median and p99 in µs, allocations per evaluation.

    OPA evaluates with a point's Go runtime (policyfiles.GO_RUNTIME, one thread running Go), on
    as many CPUs: always the same ones (the last of this process's), since the cores of a shared
    machine need not run alike.
    """
    input_file = scratch / "input.json"  # not under --data
    input_file.write_text(json.dumps(request))
    env = {**os.environ, **policyfiles.GO_RUNTIME}
    cpus = set(sorted(os.sched_getaffinity(0))[-policyfiles.OPA_THREADS:])
    figures = json.loads(opa("bench", "--format", "json", *rule_set.flags, *loading(rule_set, data_dir), "--input", str(input_file),
                             QUERY, env=env, cpus=cpus))
    return {
        "median_us": figures["Extra"]["histogram_timer_rego_query_eval_ns_median"] / 1000,
        "p99_us": figures["Extra"]["histogram_timer_rego_query_eval_ns_99%"] / 1000,
        "allocs": figures["MemAllocs"] / figures["N"],
    }


def bench_query(point: EnforcementPoint, request: dict, scratch: Path) -> tuple[dict, dict]:
    """This rule set's answer to one request at `point`, and `opa bench`'s figures."""
    rule_set = current()
    document = rule_set.data({"point": point})["point"]
    data_dir = scratch / "bench-query"
    write_data(data_dir, document)
    answer = decisions(rule_set, {"query": (document, request)}, scratch)["query"]
    return answer, bench(rule_set, data_dir, request, scratch)


def outcome(decision: dict) -> str:
    """What an answer says, in the terms both rule sets share."""
    if decision.get("allowed"):
        return f"allowed -> {decision.get('headers', {}).get('x-complyroute-destination')}"
    return f"denied {decision.get('http_status')} {json.loads(decision.get('body', '{}')).get('code')}"


def compare(rule_sets: list[BenchedRuleSet] | None = None, out=None, sizes: Sequence[int] = SIZES,
            benched: Sequence[str] | None = None) -> list[dict]:
    """One row per case and record: {case, topology, services, point, instances,
    record, decision, old_us, new_us (medians), old_p99_us, new_p99_us, old_allocs, new_allocs,
    ratio (new_us / old_us)}.

    Without `rule_sets`: this rule set (new) against BASELINE_COMMIT's (old); BaselineUnavailable
    when that commit cannot be had. `out`: a file to print each row to as it is measured.
    `sizes`: the deployments' numbers of services, each a case per topology. `benched`: the
    topologies whose cases are measured (None: every deciding one); every case's answers are
    checked all the same.
    """
    with tempfile.TemporaryDirectory() as scratch_name:
        scratch = Path(scratch_name)
        if rule_sets is None:
            rule_sets = [baseline(scratch), current()]
        every_case = {f"{t}-{n}": (t, n, *cases(t, n)) for t in deciding_topologies() for n in sizes}
        points = {case: point for case, (_, _, point, _, _) in every_case.items()}
        requests = {f"{case} {record}": request for case, (*_, allowed, denied) in every_case.items()
                    for record, request in (("allowed", allowed), ("denied", denied))}
        deployments = {case: place(manifest.load(t, services=n)).points for case, (t, n, *_) in every_case.items()}
        documents = {rule_set.name: rule_set.data(points, deployments) for rule_set in rule_sets}
        answers = {
            rule_set.name: decisions(rule_set, {name: (documents[rule_set.name][name.rsplit(" ", 1)[0]], request)
                                                for name, request in requests.items()}, scratch)
            for rule_set in rule_sets
        }
        for name, request in requests.items():
            said = {rule_set.name: outcome(answers[rule_set.name][name]) for rule_set in rule_sets}
            record = name.rsplit(" ", 1)[1]
            if any(answer.startswith("allowed") != (record == "allowed") for answer in said.values()) or len(set(said.values())) > 1:
                raise RuntimeError(f"{name}: expected {record}, got {said}")
        rows = []
        for case, (topology_name, services, point, _, _) in every_case.items():
            if benched is not None and topology_name not in benched:
                continue
            data_dirs = {}
            for rule_set in rule_sets:
                data_dirs[rule_set.name] = scratch / rule_set.name / case
                write_data(data_dirs[rule_set.name], documents[rule_set.name][case])
            for record in ("allowed", "denied"):
                name = f"{case} {record}"
                row = {"case": name, "topology": topology_name, "services": services, "point": point.name,
                       "instances": len(point.catalog["instances"]), "record": record,
                       "decision": outcome(answers[rule_sets[-1].name][name])}
                for label, rule_set in zip(("old", "new"), rule_sets):
                    figures = bench(rule_set, data_dirs[rule_set.name], requests[name], scratch)
                    row.update({f"{label}_us": figures["median_us"], f"{label}_p99_us": figures["p99_us"],
                                f"{label}_allocs": figures["allocs"]})
                row["ratio"] = row["new_us"] / row["old_us"]
                rows.append(row)
                if out:
                    print(format_row(row), file=out, flush=True)
        return rows


HEADER = (f"{'topology':<18}{'services':>8}  {'decides at':<20}{'catalog':>8}  {'record':<8}{'decision':<34}"
          f"{'old':>9}{'new':>9}{'new/old':>9}{'allocs old/new':>17}")


def format_row(row: dict) -> str:
    return (f"{row['topology']:<18}{row['services']:>8}  {row['point']:<20}{row['instances']:>8}  {row['record']:<8}"
            f"{row['decision']:<34}{row['old_us']:>7.0f}µs{row['new_us']:>7.0f}µs{row['ratio']:>9.3f}"
            f"{row['old_allocs']:>9.0f}/{row['new_allocs']:<7.0f}")


def run() -> int:
    print(f"policy-bench: `opa bench` of {QUERY}, the hop into the last service; medians of one run, "
          f"this rule set (new) against commit {BASELINE_COMMIT}'s (old)")
    print(HEADER)
    try:
        rows = compare(out=sys.stdout)
    except BaselineUnavailable as error:
        print(f"policy-bench: {error}; this rule set alone, no comparison")
        with tempfile.TemporaryDirectory() as scratch_name:
            for topology_name in deciding_topologies():
                for services in SIZES:
                    point, allowed, denied = cases(topology_name, services)
                    for record, request in (("allowed", allowed), ("denied", denied)):
                        answer, figures = bench_query(point, request, Path(scratch_name))
                        print(f"{topology_name:<18}{services:>8}  {point.name:<20}{len(point.catalog['instances']):>8}  {record:<8}"
                              f"{outcome(answer):<34}{figures['median_us']:>16.0f}µs{figures['allocs']:>26.0f}", flush=True)
        return 0
    allowed = [row["ratio"] for row in rows if row["record"] == "allowed"]
    denied = [row["ratio"] for row in rows if row["record"] == "denied"]
    print(f"\nnew / old median: allowed {min(allowed):.3f} to {max(allowed):.3f}, denied {min(denied):.3f} to {max(denied):.3f}")
    return 0
