"""The allowed table: the rule set's own answers, asked ahead of time, for both engines.

Most hops are allowed, and a point should not evaluate the whole rule set for each. So at
deploy and at reload the control plane asks the rule set, once, what each deciding listener
would answer for every labelling of its decision space (allowed_space.rego `allowed`: the
Envoy adapter's full path, which is the compliance entrypoint,
data.complyroute.compliance.decision, whatever rules it holds):

- every label of the rule set's label schema (complyroute/policy/labels.py), in its header: a
  single-valued label every known value (and absent, unless the schema says it is required);
  a multiple label absent, or any canonical value (sorted, each once, joined with ",") made of
  its known values, those some instance of the deployment holds under the schema's
  `subsets_of` attribute where it names one (the shipped consent: the purposes instances
  process for). Every such labelling is asked; nothing here assumes which of them a rule set
  can tell apart; a record labelled otherwise is OPA's to decide in full;
- the listener's sender and step, which the listener pins (a listener that takes its step
  from a header has no space: its records always ask OPA).

The labellings the rule set allows without rewriting a label become
- data.complyroute_quick_path.table, which every deciding point's OPA loads and the adapter's quick path
  looks up (envoy.rego `quick_answer`);
- under envoy-compiled, Envoy routes too (envoy_compiled.listener_matcher).
Nothing here restates a rule: an author's new rule is in the answers the next deploy or reload asks.

A labelling is tabled only when OPA finds its answer independent of what the space does not
hold (independence.py: its dependency analysis and planner for the whole decision, else its
partial evaluation labelling by labelling): the record beyond its being a JSON object (the
quick path checks that much of the body), the request id, the clock or another
non-deterministic built-in, the point's table or token key. Any other labelling is OPA's to
decide in full, with the body.

The guard: before a point takes its table, `check_quick_path` has OPA evaluate the quick
path with it over the table's space, and refuses (EngineError, naming the point and the first
labelling) unless it answers exactly the allowed labellings, as the full path does. The
compiled engine checks its routes the same way (envoy_compiled.check_routes). Beyond the
space, differential.py asks the full decision a seeded sample of the answers with records,
clock times and request ids the space holds constant, and refuses the table on any difference.

Over 400 lines: the space, the answers asked over it (and cached), the table made of them and the
guard that checks the table against them read each other's shapes; apart, each would restate them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import gzip
import hashlib
import itertools
import json
import os
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from complyroute.engines import differential, independence
from complyroute.files import write_whole
from complyroute.engines.contract import EngineError
from complyroute.policy import labels as label_schema, policydata
from complyroute.policy.labels import Label
from complyroute.policy.policyfiles import OPA
from complyroute.proxy.contract import is_instance
from complyroute.topology.manifest import REPO
from complyroute.topology.plan import EnforcementPoint

DECISION_SPACE = Path(__file__).with_name("decision_space.rego")
ALLOWED_SPACE = Path(__file__).with_name("allowed_space.rego")
QUICK_PATH = Path(__file__).with_name("quick_path.rego")
ALLOWED = "data.complyroute_engines.allowed_space.allowed"
QUICK = "data.complyroute_engines.quick_path.quick"
# A multiple label is enumerated over every combination of its values: 2^n.
MAX_SET_VALUES = 10
MODULES = (DECISION_SPACE, ALLOWED_SPACE, QUICK_PATH, independence.OBJECT_RECORD, differential.MODULE)
# What the cache keeps beside the queries' answers: the allowed labellings OPA's partial
# evaluation left a residual for (independence.dependent).
DEPENDENT = "dependent labellings"
# What each query loads beside the rule set (policy-diff asks `decisions` of older rule sets too).
MODULES_OF = {ALLOWED: (ALLOWED_SPACE,), QUICK: (DECISION_SPACE, QUICK_PATH)}
# Answers asked, by the hash of all they depend on (build/ is not committed), least recently used out
# first. make test asks over 100 (topologies, engines, rule sets), a few kB each: 512 keep a few runs'.
CACHE = REPO / "build" / "decision-space"
CACHE_ENTRIES = 512

# Labelling: (point, listener, (the value of each label in the schema's order, None = absent)).
Labelling = tuple[str, str, tuple[str | None, ...]]
# The table's key for an absent label (envoy.rego absent_label): no header value can be NUL.
ABSENT = "\u0000"
# Where a point's OPA holds its allowed table ("table") and what names it ("digest"): a document
# of its own beside data.complyroute, not in it. On every bundle it activates, OPA checks each
# rule against the data at its package's path (ast.CheckPathConflicts), and each check copies
# the whole of data.complyroute: with the table in it, a few hundred copies of a table of
# 450 kB at the central entity of 50 services, 2 s of CPU per activation (was most of a
# reload's propagation).
QUICK_PATH_DOCUMENT = "complyroute_quick_path"


@dataclass(frozen=True)
class Precomputed:
    """The rule set's allowed answers over the deployment's decision space."""

    outcomes: dict[Labelling, tuple[str, str]]  # labelling -> (destination, revision): the table's
    space: dict  # decision_space.rego's input (without the points' tables)
    policies: Path  # the rule set asked
    skipped: str = ""  # why some or all allowed answers are not tabled (OPA decides them in full), else ""
    # Every allowed answer the rule set gave over the space, tabled or not (None: the outcomes): the
    # compliant sets a point's Envoy needs a cluster for, so that it balances and fails over inside a
    # set whether the quick path or OPA in full named it.
    answers: dict[Labelling, tuple[str, str]] | None = None

    @classmethod
    def nothing(cls, policies: Path) -> Precomputed:
        """No answers asked ahead of time: every hop is decided in full."""
        return cls({}, {"labels": [], "labellings": [], "points": {}}, policies, skipped="not asked ahead of time")

    def tables(self) -> dict[str, dict]:
        """data.complyroute_quick_path.table of every point, in one pass over the answers: point -> sender ->
        step -> the value of each label in the schema's order (ABSENT for none), a level each ->
        {"destination"}."""
        tables: dict[str, dict] = {}
        for (point, listener, values), (destination, _) in self.outcomes.items():
            pinned = self.space["points"][point]["listeners"][listener]
            slot = tables.setdefault(point, {}).setdefault(pinned["sender"], {}).setdefault(pinned["step"], {})
            for value in values[:-1]:
                slot = slot.setdefault(ABSENT if value is None else value, {})
            slot[ABSENT if values[-1] is None else values[-1]] = {"destination": destination}
        return tables

    def table_keys(self) -> dict:
        """How every table is keyed (data.complyroute_quick_path.keys): its levels' label headers, in
        the order tables() writes them, and the key of an absent label. The adapter's quick path
        reads them from data rather than deriving them from the label schema on every decision
        (envoy.rego table_keys, which took about 30 of the 72 µs of an allowed hop's decision
        under opa bench); the guard takes a point's table only with keys equal to table_keys."""
        return {"headers": [header for _, header in self.space["labels"]], "absent": ABSENT}

    def set_clusters(self) -> dict[str, tuple[str, ...]]:
        """By point: the compliant sets of several instances its answers route to (their names,
        proxy/contract.py set_tiers), each of which gets a cluster of its own in the point's Envoy
        (proxy/envoy.py). Sets of one instance are that instance's own cluster."""
        found: dict[str, set[str]] = defaultdict(set)
        for (point, _, _), (destination, _) in (self.outcomes if self.answers is None else self.answers).items():
            if not is_instance(destination):
                found[point].add(destination)
        return {point: tuple(sorted(names)) for point, names in found.items()}

    @cached_property
    def guard_space(self) -> dict:
        """The space with every canonical value of every multiple label: where check_routes walks
        the compiled trees, so that a route answering a labelling the table does not hold is caught
        too. (The quick path is checked over the table's own space: it looks a labelling up by its
        exact labels, and the policy tests check that it answers nothing else.)"""
        if not self.space["labels"]:
            return self.space
        labels = label_schema.schema(self.policies)
        known = reference(self.policies)
        return {**self.space, "labellings": labellings_of([choices(label, known) for label in labels])}


# ---- the decision space and its answers ----------------------------------------------------


def reference(policies: Path) -> dict:
    return label_schema.reference_of(policies)


class SpaceTooLarge(EngineError):
    """The decision space cannot be enumerated: a multiple label with too many values."""


def canonical_sets(label: Label, values: list[str]) -> list[str]:
    """Every canonical value of a multiple label over `values`: a non-empty set, sorted, joined with ","."""
    if len(values) > MAX_SET_VALUES:
        raise SpaceTooLarge(
            f"the decision space holds every combination of the values of label {label.name}; there are "
            f"{len(values)} (2^{len(values)} combinations, at most {MAX_SET_VALUES} values)"
        )
    ordered = sorted(values)
    return [",".join(chosen) for size in range(1, len(ordered) + 1) for chosen in itertools.combinations(ordered, size)]


def instance_values(catalog: dict, attribute: str) -> set[str]:
    """Every value some instance of a catalog holds under `attribute` (a list or comma-separated)."""
    found = set()
    for instance in catalog.get("instances", {}).values():
        value = instance.get(attribute, [])
        items = value.split(",") if isinstance(value, str) else value
        found |= {item.strip() for item in items if isinstance(item, str) and item.strip()}
    return found


def choices(label: Label, known: dict, held: set[str] | None = None) -> list[str | None]:
    """The values of `label` the space tries, None for absent. `held`: for a multiple label with
    `subsets_of`, the values instances of the deployment hold (None: every known value)."""
    values = label.known(known)
    if label.multiple:
        return [None, *canonical_sets(label, sorted(set(values) & held if held is not None else values))]
    return values if label.required else [None, *values]


def labellings_of(label_choices: list[list[str | None]]) -> list[list[str | None]]:
    return [list(values) for values in itertools.product(*label_choices)]


def decision_space(points: list[EnforcementPoint], policies: Path, data: dict[str, dict]) -> dict:
    """decision_space.rego's input: every deciding listener that pins its step, every labelling
    the table covers. `data`: each deciding point's OPA data document (envoy_opa.opa_data).

    A multiple label with `subsets_of` (the shipped consent, over the purposes instances process
    for): absent, or any canonical value made of values some instance of the deployment holds.
    That is a choice of which questions to ask ahead of time, not a claim about the answers: a
    record whose consent names another purpose is not in the table, and OPA decides it in full,
    at the full path's cost. Asking every combination of every known purpose instead (64 values
    for 6) would make the table 8 to 16 times as costly to build for the shipped examples, for
    records no instance asked for."""
    labels = label_schema.schema(policies)
    known = reference(policies)
    held = {label.name: set().union(*(instance_values(point.catalog, label.subsets_of) for point in points))
            for label in labels if label.subsets_of}
    return {
        "labels": [[label.name, label.header] for label in labels],
        "labellings": labellings_of([choices(label, known, held.get(label.name)) for label in labels]),
        "points": {
            point.name: {
                "data": data[point.name],
                "listeners": {
                    listener.name: {"sender": listener.sender, "step": listener.step}
                    for listener in point.deciding if listener.step
                },
            }
            for point in points if any(listener.step for listener in point.deciding)
        },
    }


def labellings(space: dict):
    """Every labelling of the space, in order: point, listener, labels."""
    for point, entry in sorted(space["points"].items()):
        for listener in sorted(entry["listeners"]):
            for values in space["labellings"]:
                yield (point, listener, tuple(values))


def shown(space: dict, values: tuple) -> str:
    """A labelling's labels as a person reads them: "category=personal consent=absent region=EU"."""
    return " ".join(f"{name}={'absent' if value is None else value}" for (name, _), value in zip(space["labels"], values))


def boxes(labellings: list[tuple[str | None, ...]], split_absent: bool = False, order: list[int] | None = None) -> list[tuple[frozenset, ...]]:
    """Labellings (a value per label, None for absent) as few boxes, a set of values per label,
    covering exactly them: boxes that differ in one label only are merged, label by label (in
    `order`, default the labels' own). `split_absent`: a box whose set holds both None and values
    is split in two (for Envoy's matcher, absent is a predicate of its own)."""
    merged = [tuple(frozenset([value]) for value in values) for values in labellings]
    for label in order if order is not None else range(len(merged[0]) if merged else 0):
        by_rest: dict[tuple, set] = defaultdict(set)
        for box in merged:
            by_rest[box[:label] + box[label + 1:]] |= box[label]
        merged = [rest[:label] + (frozenset(values),) + rest[label:] for rest, values in by_rest.items()]
    if split_absent:
        split = []
        for box in merged:
            parts = [box]
            for label, values in enumerate(box):
                if None in values and len(values) > 1:
                    parts = [part[:label] + (half,) + part[label + 1:] for part in parts
                             for half in (frozenset([None]), values - {None})]
            split += parts
        merged = split
    return sorted(merged, key=lambda box: [sorted(value or "" for value in values) for values in box])


def key_of(answer: list) -> Labelling:
    """The labelling an answer of decision_space.rego (or quick_path.rego) is for."""
    return (answer[0], answer[1], tuple(answer[2]))


def _cache_key(query: str, document: dict, policies: Path) -> str:
    digest = hashlib.sha256()
    opa = OPA.stat()
    digest.update(f"{query}\n{OPA}:{opa.st_size}:{opa.st_mtime_ns}\n".encode())
    for path in [*MODULES, *sorted(p for p in policies.rglob("*") if p.is_file())]:
        digest.update(f"{path.name}\n".encode() + path.read_bytes())
    digest.update(json.dumps(document, sort_keys=True).encode())
    return digest.hexdigest()


def evaluate_split(query: str, space: dict, policies: Path) -> list:
    """`query` over the space (_evaluate_halves), cached."""
    return cached(query, space, policies, lambda: _evaluate_halves(query, space, policies))


def cached(query: str, document: dict, policies: Path, compute) -> list:
    """compute()'s answers (JSON) for `query` over `document`, kept by the hash of all they depend
    on: a deployment of the same topology and rule set asks nothing again. Processes asking for
    the same answers at once (make check's workers) ask once: the others wait on the entry's lock."""
    key = _cache_key(query, document, policies)
    cached = CACHE / f"{key}.json.gz"
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file is closed
        if cached.exists():
            with contextlib.suppress(FileNotFoundError):  # evicted meanwhile by another process: read as a miss below
                answers = json.loads(gzip.decompress(cached.read_bytes()))
                os.utime(cached)  # a hit is a use: eviction goes by last use, not by age
                return answers
        answers = compute()
        write_whole(cached, gzip.compress(json.dumps(answers).encode(), compresslevel=1))
    # The least recently used go, with their locks (one waiting on an evicted lock asks again, no worse).
    for old in sorted(CACHE.glob("*.json.gz"), key=last_use)[:-CACHE_ENTRIES]:
        old.unlink(missing_ok=True)
        old.with_name(old.name.removesuffix(".json.gz") + ".lock").unlink(missing_ok=True)
    return answers


def last_use(entry: Path) -> float:
    """When a cache entry was last used; one another process evicted since it was listed counts as
    the oldest (two workers evicting at once: make check's, seen as FileNotFoundError)."""
    try:
        return entry.stat().st_mtime
    except FileNotFoundError:
        return 0.0


def _evaluate_halves(query: str, space: dict, policies: Path) -> list:
    """`query` in two `opa eval`s side by side (two cores here), each half the points' listeners,
    at a lower CPU priority (a reload runs them beside the deployment's decisions)."""
    names = sorted(space["points"], key=lambda name: -len(space["points"][name]["listeners"]))
    halves = [dict(space, points={}), dict(space, points={})]
    for name in names:  # the larger points first, each to the half with fewer listeners so far
        lighter = min(halves, key=lambda half: sum(len(p["listeners"]) for p in half["points"].values()))
        lighter["points"][name] = space["points"][name]
    if len(names) == 1:  # one point (a central entity): split its listeners
        (name,) = names
        listeners = sorted(space["points"][name]["listeners"].items())
        halves = [dict(space, points={name: dict(space["points"][name], listeners=dict(part))})
                  for part in (listeners[::2], listeners[1::2]) if part]
    halves = [half for half in halves if half["points"]]

    def run(half: dict) -> list:
        try:
            return policydata.evaluate(query, half, policies, modules=MODULES_OF.get(query, (DECISION_SPACE,)), yielding=True) or []
        except policydata.PolicyDataError as error:
            raise EngineError(str(error)) from None

    with ThreadPoolExecutor(max_workers=2) as pool:
        return [answer for part in pool.map(run, halves) for answer in part]


def precompute(points: list[EnforcementPoint], policies: Path, data: dict[str, dict]) -> Precomputed:
    """The rule set's allowed answers over the deciding points' decision space (none, and why,
    when the rule set reads what the space does not enumerate)."""
    try:
        space = decision_space(points, policies, data)
    except SpaceTooLarge as error:
        return dataclasses.replace(Precomputed.nothing(policies), skipped=str(error))
    try:
        answers = evaluate_split(ALLOWED, space, policies)
    except EngineError as error:
        raise EngineError(f"OPA could not ask the rule set for the allowed table: {error}") from None
    outcomes = {key_of(answer): (answer[3], answer[4]) for answer in answers}
    asked = sorted(outcomes, key=independence.order)
    try:
        left = cached(DEPENDENT, {"space": space, "asked": asked}, policies,
                      lambda: [list(labelling) for labelling in independence.dependent(space, asked, policies)])
    except independence.RecordShapeChanged as error:
        return Precomputed({}, space, policies, skipped=str(error), answers=outcomes)
    dependent = {key_of(labelling) for labelling in left}
    if not dependent:
        return Precomputed(outcomes, space, policies)
    return Precomputed({labelling: outcome for labelling, outcome in outcomes.items() if labelling not in dependent}, space, policies,
                       skipped=decided_in_full(space, dependent, len(outcomes)), answers=outcomes)


def decided_in_full(space: dict, dependent: set[Labelling], allowed: int) -> str:
    """Which points decide which share of their allowed answers in full, and the first such answer."""
    by_point: dict[str, int] = defaultdict(int)
    for point, _, _ in dependent:
        by_point[point] += 1
    point, listener, values = min(dependent, key=independence.order)
    points = ", ".join(f"{name} {count}" for name, count in sorted(by_point.items()))
    return (f"OPA's partial evaluation finds {len(dependent)} of {allowed} allowed answers depend on what no table holds (the "
            f"record's content, the request id, the clock or another non-deterministic built-in), so OPA decides them in full "
            f"(by point: {points}); the first at point {point}, listener {listener}, labels {shown(space, values)}")


# ---- the guard ---------------------------------------------------------------------------------


def first_difference(point: str, expected: dict[Labelling, tuple], got: dict[Labelling, tuple], space: dict, what: str) -> str | None:
    """The first labelling of `point` at which `got` differs from `expected`, described; None if none."""
    for labelling in labellings({**space, "points": {point: space["points"][point]}}):
        if expected.get(labelling) != got.get(labelling):
            _, listener, values = labelling
            sender = space["points"][point]["listeners"][listener]
            return (f"point {point}: {what} differs from the rule set's answer at listener {listener} (sender "
                    f"{sender['sender']}, step {sender['step']}), labels {shown(space, values)}: the rule set answers "
                    f"{describe(expected.get(labelling))}, {what} {describe(got.get(labelling))}")
    return None


def describe(outcome: tuple | None) -> str:
    if outcome is None:
        return "nothing ahead of time (OPA decides)"
    destination, revision = outcome
    return f"allowed to {destination} (revision {revision})" if destination is not None else "something other than an allowed hop"


def with_tables(data: dict[str, dict], precomputed: Precomputed, set_clusters: dict[str, tuple[str, ...]] | None = None) -> dict[str, dict]:
    """Each point's OPA data document with its table, once the guard let it through, and the
    compliant sets its Envoy has a cluster for (the adapter routes any other set to its first
    instance: envoy.rego `routed`). `set_clusters`: those of a running deployment (a reload
    cannot add clusters; precomputed was asked with them); None: the sets of the answers."""
    built = precomputed.tables()
    tables = {point: built.get(point, {}) for point in data}
    check_quick_path(precomputed, tables)
    clusters = precomputed.set_clusters() if set_clusters is None else set_clusters
    placed = {point: {**document, QUICK_PATH_DOCUMENT: {"table": tables[point], "keys": precomputed.table_keys(),
                                                        "digest": table_digest(tables[point]), "set_clusters": list(clusters.get(point, ()))}}
              for point, document in data.items()}
    differential.check(precomputed.outcomes, precomputed.space, placed, precomputed.policies, cached)
    return placed


def table_digest(table: dict) -> str:
    """What names a point's table in its OPA data (data.complyroute_quick_path.digest), so that a
    reload can see when a point holds it: a digest of its content, "" for an empty table. The
    rules never read it."""
    if not table:
        return ""
    return hashlib.sha256(json.dumps(table, sort_keys=True).encode()).hexdigest()[:16]


def check_quick_path(precomputed: Precomputed, tables: dict[str, dict]) -> None:
    """Refuses (EngineError) unless, at every point, the quick path with its table answers
    exactly the labellings the rule set allows, as the rule set does."""
    space = precomputed.space
    if not any(tables.values()):
        return
    with_tables = dict(space, points={
        name: {**entry, "data": {**entry["data"], QUICK_PATH_DOCUMENT: {"table": tables.get(name, {}), "keys": precomputed.table_keys()}}}
        for name, entry in space["points"].items()
    })
    got = {key_of(answer): (answer[3], answer[4]) for answer in evaluate_split(QUICK, with_tables, precomputed.policies)}
    by_point: dict[str, tuple[dict, dict]] = defaultdict(lambda: ({}, {}))
    for labelling, outcome in precomputed.outcomes.items():
        by_point[labelling[0]][0][labelling] = outcome
    for labelling, outcome in got.items():
        by_point[labelling[0]][1][labelling] = outcome
    for point in sorted(by_point):
        expected, answered = by_point[point]
        if expected != answered:
            raise EngineError("the quick path would not answer as the rule set does, so nothing was changed: "
                              + first_difference(point, expected, answered, space, "the quick path"))
