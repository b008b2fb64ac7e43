"""What a rule-set change would decide differently: `make policy-diff base=<git ref>`.

Before a reload, an author asks both rule sets, the one at `base` and the one in policies/ now
(uncommitted edits included), for every decision each enforcement point of a topology can be
asked: every deciding listener (its sender and step; the entry's too, with labels as a client
sends canonical ones), every region and category either rule set knows, consent absent or any
canonical value of the purposes either knows. OPA answers each rule set in one `opa eval`
(decision_space.rego `decisions`, each point with its index as that rule set derives it);
nothing here decides anything. Every labelling whose answer differs is listed: which point,
sender and step, which labels, and what it moves from and to. A policy that routes as well as
allows needs this: a dry run of the plugin says whether an answer would change, not where
records would go instead.

Every consent value is asked, not one per group as the compiled engine asks: its groups
(values that differ only in purposes no instance there processes for) hold for the rule set
it compiles, and a diff must not assume of a new rule set what it is meant to find out. The
report groups labellings afterwards, by their answers, and names each group exactly.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from . import manifest, policydata, policyfiles
from .engines import EngineError, envoy_opa, precompute
from .manifest import REPO
from .plan import place

WALKTHROUGH = "topologies/examples/mixed-regions.yaml"  # what `make demo` deploys
QUERY = "data.complyroute_engines.decision_space.decisions"


class PolicyDiffError(RuntimeError):
    """A ref or rule set that cannot be compared; the message says what to do."""


# ---- the two rule sets ---------------------------------------------------------------------


def git(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, **kwargs)


def rule_set_at(ref: str, folder: Path) -> Path:
    """policies/ as of git `ref`, written under `folder`."""
    if not ref or ref.startswith("-"):  # git would read it as an option
        raise PolicyDiffError(f"base {ref!r} is not a git ref: name a commit, branch or tag (base=HEAD, base=main)")
    resolved = git("rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}", text=True)
    if resolved.returncode != 0:
        raise PolicyDiffError(f"base {ref!r} names no commit of this repository: name a commit, branch or tag (base=HEAD, base=main)")
    commit = resolved.stdout.strip()
    if git("cat-file", "-e", f"{commit}:policies").returncode != 0:
        raise PolicyDiffError(f"base {ref!r} ({commit[:7]}) has no policies/ folder: there is no rule set to compare with")
    archive = git("archive", "--format=tar", commit, "policies")
    if archive.returncode != 0:
        raise PolicyDiffError(f"git archive of policies/ at {ref!r} failed: {archive.stderr.decode().strip()}")
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive.stdout, check=True)
    return folder / "policies"


def reference_of(policies: Path, name: str) -> dict:
    try:
        return precompute.reference(policies)
    except (OSError, json.JSONDecodeError) as error:
        raise PolicyDiffError(f"the rule set {name} has no readable reference data (complyroute/reference/data.json): {error}") from None


# ---- asking both -------------------------------------------------------------------------


def decisions(points, policies: Path, name: str, space: dict) -> dict[tuple, dict]:
    """{(point, listener, region, category, consent): outcome} under the rule set `policies`
    (`name` says which in errors).

    `space`: the regions, categories and consent values to try at every deciding listener.
    """
    try:
        data = envoy_opa.opa_data(points, policies)  # the index as this rule set derives it
    except policydata.PolicyDataError as error:
        raise PolicyDiffError(f"the rule set {name}: {one_line(error)}") from None
    document = {
        "regions": space["regions"],
        "categories": space["categories"],
        "points": {
            point.name: {
                "data": data[point.name],
                "listeners": {
                    listener.name: {"sender": listener.sender, "step": listener.step, "consents": space["consents"]}
                    for listener in point.deciding
                },
            }
            for point in points
        },
    }
    try:
        answers = precompute.evaluate_split(QUERY, document, policies)
    except EngineError as error:
        raise PolicyDiffError(f"OPA could not ask the rule set {name} what its points decide (a rule set older than this "
                              f"checkout's complyroute/engines/decision_space.rego may lack what it asks): {one_line(error)}") from None
    return {tuple(answer[:5]): answer[5] for answer in answers or []}


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
    references = [reference_of(rules, name) for rules, name in zip((old, new), names)]
    # Labels either rule set knows: a code one of them adds or drops is part of the change.
    known = {key: sorted(set().union(*(r.get(key, {}) for r in references))) for key in ("regions", "categories", "purposes")}
    try:
        consents = [None, *precompute.canonical_consents(known["purposes"])]
    except EngineError as error:
        raise PolicyDiffError(f"policy-diff asks every consent value: {error}") from None
    space = {"regions": known["regions"], "categories": known["categories"], "consents": consents}
    # Two `opa eval`s, one per rule set, side by side.
    with ThreadPoolExecutor(max_workers=2) as pool:
        before, after = pool.map(lambda rules, name: decisions(points, rules, name, space), (old, new), names)
    listeners = [(point.name, listener) for point in points for listener in point.deciding]
    changed = {}
    for point, listener in listeners:
        for region in known["regions"]:
            for category in known["categories"]:
                for consent in consents:
                    key = (point, listener.name, region, category, consent)
                    if before.get(key) != after.get(key):  # no answer (None) is an answer too
                        changed[key] = (before.get(key), after.get(key))
    compared = len(listeners) * len(known["regions"]) * len(known["categories"]) * len(consents)
    return {"compared": compared, "listeners": len(listeners), "changed": len(changed),
            "changes": grouped(changed, {(p, l.name): l for p, l in listeners}, consents)}


# ---- grouping what changed -----------------------------------------------------------------


def grouped(changed: dict[tuple, tuple], listeners: dict, consents: list) -> list[dict]:
    """The changed labellings as groups, each every region of a list times every consent value
    of a set, all with the same listener, category and change; none left out, none added."""
    by_change: dict[tuple, dict[str, set]] = defaultdict(lambda: defaultdict(set))
    moves = {}
    for (point, listener, region, category, consent), answers in changed.items():
        change = json.dumps(answers, sort_keys=True)
        moves[change] = answers
        by_change[(point, listener, category, change)][region].add(consent)
    groups = []
    for (point, listener, category, change), by_region in by_change.items():
        regions_by_values: dict[frozenset, list[str]] = defaultdict(list)
        for region, values in by_region.items():
            regions_by_values[frozenset(values)].append(region)
        for values, regions in regions_by_values.items():
            for description, members in consent_parts(set(values), consents):
                groups.append({
                    "point": point, "listener": listener,
                    "sender": listeners[(point, listener)].sender, "step": listeners[(point, listener)].step,
                    "category": category, "regions": sorted(regions), "consent": description, "consents": members,
                    "labellings": len(regions) * len(members), "before": moves[change][0], "after": moves[change][1],
                })
    return sorted(groups, key=lambda g: (g["point"], g["listener"], g["category"], json.dumps([g["before"], g["after"]], sort_keys=True), g["regions"], g["consent"]))


def consent_parts(chosen: set, every: list) -> list[tuple[str, list]]:
    """`chosen` consent values (None: absent) as parts, each named by what its values hold.

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


def report(result: dict, base: str, policies: str = "policies/", out=sys.stdout) -> None:
    print(f"policy-diff {base} -> {policies}: {result['compared']} decisions compared at {result['listeners']} "
          f"deciding listeners, {result['changed']} would change", file=out)
    shown = None
    for change in result["changes"]:
        listener = (change["point"], change["listener"], change["sender"], change["step"])
        if listener != shown:
            print(f"  {change['point']}, listener {change['listener']} ({change['sender']} -> {change['step']}):", file=out)
            shown = listener
        count = change["labellings"]
        print(f"    {change['category']}, region {','.join(change['regions'])}, consent {change['consent']} "
              f"({count} labelling{'s' * (count != 1)}): {move(change['before'], change['after'])}", file=out)


def main(base: str, topology_name: str = WALKTHROUGH, services: str | None = None, policies: Path = policyfiles.POLICIES,
         as_json: bool = False, out=None) -> int:
    out = out or sys.stdout
    if not (policies / "complyroute").is_dir():
        raise PolicyDiffError(f"{policies} is not a rule set (no complyroute/ folder in it): name the folder with --policies")
    topology = manifest.load(topology_name, services)
    with tempfile.TemporaryDirectory(prefix="complyroute-policy-diff-") as scratch:
        result = compare(topology, rule_set_at(base, Path(scratch)), policies, repr(base))
    if as_json:
        print(json.dumps({"base": base, "policies": str(policies), "topology": topology.name, **result}, indent=1), file=out)
    else:
        shown = "policies/" if policies.resolve() == policyfiles.POLICIES.resolve() else str(policies)
        report(result, base, shown, out)
    return 0
