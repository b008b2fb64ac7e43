"""What a rule-set change would decide differently: `make policy-diff base=<git ref>`.

Before a reload, an author asks both rule sets, the one at `base` and the one in policies/ now
(uncommitted edits included), for every decision each enforcement point of a topology can be
asked: every deciding listener (its sender and step; the entry's too, with labels as a client
sends canonical ones), and every label either rule set's schema declares (complyroute/policy/labels.py):
a single-valued one absent or any value either rule set knows, a multiple one (the shipped
consent) absent or any canonical value of the values either knows. OPA answers each rule set in one `opa eval`
(decision_space.rego `decisions`, each point with its index as that rule set derives it);
nothing here decides anything. Every labelling whose answer differs is listed: which point,
sender and step, which labels, and what it moves from and to. A policy that routes as well as
allows needs this: a dry run of the plugin says whether an answer would change, not where
records would go instead.

Every consent value is asked, not only those made of purposes some instance processes for, as
the allowed table asks: a diff must not assume of a new rule set what it is meant to find out.
The report groups labellings afterwards, by their answers, and names each group exactly.
"""

from __future__ import annotations

import itertools
import json
import math
import subprocess
import sys
import tempfile
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from complyroute.engines import EngineError, envoy_opa, precompute
from complyroute.policy import labels as label_schema, policydata, policyfiles
from complyroute.topology import manifest
from complyroute.topology.manifest import REPO
from complyroute.topology.plan import place

WALKTHROUGH = "topologies/examples/mixed-regions.yaml"  # what `make demo` deploys
QUERY = "data.complyroute_engines.decision_space.decisions"
# The revision every rule set is asked under. An outcome names none (decision_space.rego), so the
# answers are those of the rules' content alone, and so is the key they are kept under
# (precompute.cached): a copy of the checkout's rule set, or the checkout's after a commit, is
# asked once, not again under its other revision (a commit, a content digest: bundles.revision).
ASKED_REVISION = "policy-diff"


class PolicyDiffError(RuntimeError):
    """A ref or rule set that cannot be compared; the message says what to do."""


# ---- the two rule sets ---------------------------------------------------------------------


def git(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, **kwargs)


def rule_set_at(ref: str, folder: Path, source: str = "policies") -> Path:
    """The rule set in `source` (a folder of the repository: policies, rule-sets/<name>) as of
    git `ref`, written under `folder`, with the platform's parts a rule set of rule-sets/ runs
    with (policyfiles.rule_set)."""
    if not ref or ref.startswith("-"):  # git would read it as an option
        raise PolicyDiffError(f"base {ref!r} is not a git ref: name a commit, branch or tag (base=HEAD, base=main)")
    resolved = git("rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}", text=True)
    if resolved.returncode != 0:
        raise PolicyDiffError(f"base {ref!r} names no commit of this repository: name a commit, branch or tag (base=HEAD, base=main)")
    commit = resolved.stdout.strip()
    if git("cat-file", "-e", f"{commit}:{source}").returncode != 0:
        raise PolicyDiffError(f"base {ref!r} ({commit[:7]}) has no {source}/ folder: there is no rule set to compare with")
    archive = git("archive", "--format=tar", commit, source)
    if archive.returncode != 0:
        raise PolicyDiffError(f"git archive of {source}/ at {ref!r} failed: {archive.stderr.decode().strip()}")
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive.stdout, check=True)
    try:
        return policyfiles.rule_set(folder / source)
    except policyfiles.RuleSetError as error:
        raise PolicyDiffError(f"{source}/ at {ref!r}: {error}") from None


def reference_of(policies: Path, name: str) -> dict:
    try:
        return precompute.reference(policies)
    except (OSError, label_schema.LabelSchemaError) as error:
        raise PolicyDiffError(f"the rule set {name} has no readable reference data (complyroute/reference/data.json): {error}") from None


# ---- asking both -------------------------------------------------------------------------


def decisions(points, policies: Path, name: str, space: dict) -> dict[tuple, dict]:
    """{(point, listener, labels' values): outcome} under the rule set `policies` (`name` says
    which in errors).

    `space`: the labels ([name, header]) and the labellings to try at every deciding listener.
    """
    try:
        data = envoy_opa.opa_data(points, policies, ASKED_REVISION)  # the index as this rule set derives it
    except policydata.PolicyDataError as error:
        raise PolicyDiffError(f"the rule set {name}: {one_line(error)}") from None
    document = {
        **space,
        "points": {
            point.name: {
                "data": data[point.name],
                "listeners": {listener.name: {"sender": listener.sender, "step": listener.step} for listener in point.deciding},
            }
            for point in points
        },
    }
    try:
        answers = precompute.evaluate_split(QUERY, document, policies)
    except EngineError as error:
        raise PolicyDiffError(f"OPA could not ask the rule set {name} what its points decide (a rule set older than this "
                              f"checkout's complyroute/engines/decision_space.rego may lack what it asks): {one_line(error)}") from None
    return {precompute.key_of(answer): answer[3] for answer in answers or []}


def one_line(error: Exception) -> str:
    """OPA's errors (JSON with --format json) as one line: each message and where."""
    text = str(error)
    start = text.find("{")
    try:
        errors = json.loads(text[start:])["errors"]
        return "; ".join(
            f"{e['message']} ({Path(e['location']['file']).name}:{e['location']['row']})" if e.get("location") else e["message"]
            for e in errors
        )
    except (ValueError, KeyError, TypeError):
        return " ".join(text.split())


def compare(topology: manifest.Topology, old: Path, new: Path, base: str = "base") -> dict:
    """Both rule sets' decisions over the topology's decision space, and those that differ, grouped
    (`base`: what `old` is, for errors)."""
    points = [point for point in place(topology).points if point.deciding]
    names = (f"at {base}", f"in {new}")
    labels, choices = label_space([reference_of(rules, name) for rules, name in zip((old, new), names)])
    space = {"labels": [[label.name, label.header] for label in labels], "labellings": precompute.labellings_of(choices)}
    # Two `opa eval`s, one per rule set, side by side.
    with ThreadPoolExecutor(max_workers=2) as pool:
        before, after = pool.map(lambda rules, name: decisions(points, rules, name, space), (old, new), names)
    listeners = [(point.name, listener) for point in points for listener in point.deciding]
    changed = {}
    for point, listener in listeners:
        for values in space["labellings"]:
            key = (point, listener.name, tuple(values))
            if before.get(key) != after.get(key):  # no answer (None) is an answer too
                changed[key] = (before.get(key), after.get(key))
    compared = len(listeners) * len(space["labellings"])
    return {"compared": compared, "listeners": len(listeners), "changed": len(changed),
            "changes": grouped(changed, {(p, l.name): l for p, l in listeners}, labels, choices)}


def label_space(references: list[dict]) -> tuple[list[label_schema.Label], list[list]]:
    """The labels either rule set declares (the newer one's header where both do), each with the
    values to try: every value either knows (a code one of them adds or drops is part of the
    change), and absent unless both require the label; a multiple label's every canonical value,
    and absent."""
    try:
        schemas = [{label.name: label for label in label_schema.schema_of(reference)} for reference in references]
    except label_schema.LabelSchemaError as error:
        raise PolicyDiffError(f"policy-diff: {error}") from None
    labels = [({**schemas[0], **schemas[1]})[name] for name in sorted(schemas[0].keys() | schemas[1].keys())]
    choices = []
    for label in labels:
        values = sorted(set().union(*(reference.get(label.values, {}) for reference in references)))
        if label.multiple:
            try:
                choices.append([None, *precompute.canonical_sets(label, values)])
            except EngineError as error:
                raise PolicyDiffError(f"policy-diff asks every value of a multiple label: {error}") from None
        elif all(schema.get(label.name, label).required for schema in schemas):
            choices.append(values)  # absent is LABEL_MISSING under both
        else:
            choices.append([None, *values])
    return labels, choices


# ---- grouping what changed -----------------------------------------------------------------


def grouped(changed: dict[tuple, tuple], listeners: dict, labels: list, choices: list[list]) -> list[dict]:
    """The changed labellings as groups, all with the same listener and change, each a box of
    labellings: every value of a set for each label (single-valued labels merged first, from
    the last; a multiple label's set named by consent_parts); none left out, none added."""
    by_change: dict[tuple, list] = defaultdict(list)
    moves = {}
    for (point, listener, values), answers in changed.items():
        change = json.dumps(answers, sort_keys=True)
        moves[change] = answers
        by_change[(point, listener, change)].append(values)
    single = [index for index, label in enumerate(labels) if not label.multiple]
    order = [index for index, label in enumerate(labels) if label.multiple] + single[::-1]
    groups = []
    for (point, listener, change), labellings in by_change.items():
        for box in precompute.boxes(labellings, order=order):
            parts = [[(label_values(values, every), sorted(values, key=lambda v: (v is not None, v or "")))] if not label.multiple
                     else consent_parts(set(values), every)
                     for label, values, every in zip(labels, box, choices)]
            for chosen in itertools.product(*parts):
                groups.append({
                    "point": point, "listener": listener,
                    "sender": listeners[(point, listener)].sender, "step": listeners[(point, listener)].step,
                    "labels": {label.name: description for label, (description, _) in zip(labels, chosen)},
                    "values": {label.name: members for label, (_, members) in zip(labels, chosen)},
                    "labellings": math.prod(len(members) for _, members in chosen),
                    "before": moves[change][0], "after": moves[change][1],
                })
    return sorted(groups, key=lambda g: (g["point"], g["listener"], json.dumps([g["before"], g["after"]], sort_keys=True),
                                         json.dumps(g["labels"], sort_keys=True)))


def label_values(chosen: frozenset, every: list) -> str:
    """A single-valued label's values as a person reads them: "any or absent", "any", or the list."""
    if chosen == set(every):
        return "any or absent"
    if chosen == set(every) - {None}:
        return "any"
    return ",".join(["absent"] * (None in chosen) + sorted(value for value in chosen if value is not None))


def consent_parts(chosen: set, every: list) -> list[tuple[str, list]]:
    """`chosen` values of a multiple label (the shipped consent; None: absent) as parts, each
    named by what its values hold.

    A part is named by the purposes membership turns on, those whose adding or removing moves
    some value in or out of `chosen`: "with care" (every value holding care), "with billing,
    without care", "without care" (present, holding none of them). The names are exact: two
    values alike in those purposes are both in or both out, as one turns into the other by
    adding, then removing, the others one at a time, never passing the empty set.
    """
    present = sorted(v for v in chosen if v is not None)
    every_present = [v for v in every if v is not None]
    if chosen == set(every):
        return [("any or absent", list(every))]
    parts = [("absent", [None])] if None in chosen else []
    if not present:
        return parts
    if len(present) == len(every_present):
        return parts + [("any", present)]
    holds = {value: frozenset(value.split(",")) for value in every_present}
    value_of = {purposes: value for value, purposes in holds.items()}
    inside = set(present)
    turning = sorted({
        purpose
        for value, purposes in holds.items()
        for purpose in set().union(*holds.values())
        if (purposes ^ {purpose}) in value_of and (value in inside) != (value_of[purposes ^ {purpose}] in inside)
    })
    patterns: dict[frozenset, list[str]] = defaultdict(list)
    for value in every_present:
        patterns[holds[value] & frozenset(turning)].append(value)
    for pattern, values in sorted(patterns.items(), key=lambda item: (-len(item[0]), sorted(item[0]))):
        if inside.issuperset(values):
            held, missing = sorted(pattern), sorted(set(turning) - pattern)
            name = ", ".join(([f"with {','.join(held)}"] if held else []) + ([f"without {','.join(missing)}"] if missing else []))
            parts.append((name, values))
    return parts


# ---- the report ----------------------------------------------------------------------------


def describe(outcome: dict | None, detailed: bool = False) -> str:
    """An answer in a few words: allowed to where, or the denial's status and code, with each
    instance's reasons when the code alone does not say them (or `detailed`)."""
    if outcome is None:
        return "no answer"
    if outcome["allowed"]:
        return f"allowed to {outcome['destination']}"
    summary = f"{outcome['status']} {outcome['code']}"
    reasons = outcome.get("reasons", [])
    if not detailed and {code for _, code in reasons} <= {outcome["code"]}:
        return summary
    by_instance: dict[str, list[str]] = defaultdict(list)
    for instance, code in reasons:  # instance None: a reason about the record, not an instance
        by_instance[f"{instance}: " if instance else ""].append(code)
    return f"{summary} ({'; '.join(instance + ', '.join(codes) for instance, codes in sorted(by_instance.items()))})"


def move(before: dict | None, after: dict | None) -> str:
    # Two denials the short form cannot tell apart differ in their reasons: show them.
    detailed = describe(before) == describe(after)
    return f"{describe(before, detailed)} -> {describe(after, detailed)}"


# What the comparison cannot see, said with every report: each decision is asked with an empty
# record (decision_space.rego), so a rule reading the record's content changes nothing here.
RECORD_NOT_COMPARED = ("each asked with an empty record: what a rule reading the record's content would decide "
                       "differently is not compared here (`make decide` asks one record)")


def report(result: dict, base: str, policies: str = "policies/", out=sys.stdout) -> None:
    print(f"policy-diff {base} -> {policies}: {result['compared']} decisions compared at {result['listeners']} "
          f"deciding listeners, {result['changed']} would change", file=out)
    print(f"  {RECORD_NOT_COMPARED}", file=out)
    shown = None
    for change in result["changes"]:
        listener = (change["point"], change["listener"], change["sender"], change["step"])
        if listener != shown:
            print(f"  {change['point']}, listener {change['listener']} ({change['sender']} -> {change['step']}):", file=out)
            shown = listener
        count = change["labellings"]
        labels = ", ".join(f"{name} {description}" for name, description in change["labels"].items())
        print(f"    {labels} ({count} labelling{'s' * (count != 1)}): {move(change['before'], change['after'])}", file=out)


def main(base: str, topology_name: str = WALKTHROUGH, services: str | None = None, policies: str | Path = "policies",
         as_json: bool = False, out=None) -> int:
    """`policies`: the rule set as chosen (policyfiles.source_of); it is compared with the same
    folder at `base`, or with policies/ at `base` when it lies outside the repository (an
    author's copy of the shipped rules)."""
    out = out or sys.stdout
    try:
        source = policyfiles.source_of(policies)
        current = policyfiles.rule_set(policies)
    except policyfiles.RuleSetError as error:
        raise PolicyDiffError(f"{error}: name the rule set with --policies") from None
    inside = source.resolve().is_relative_to(REPO.resolve())
    at_base = source.resolve().relative_to(REPO.resolve()).as_posix() if inside else "policies"
    topology = manifest.load(topology_name, services)
    with tempfile.TemporaryDirectory(prefix="complyroute-policy-diff-") as scratch:
        result = compare(topology, rule_set_at(base, Path(scratch), at_base), current, repr(base))
    if as_json:
        print(json.dumps({"base": base, "policies": str(source), "topology": topology.name, **result}, indent=1), file=out)
    else:
        shown = "policies/" if source.resolve() == policyfiles.POLICIES.resolve() else str(source)
        report(result, base, shown, out)
    return 0
