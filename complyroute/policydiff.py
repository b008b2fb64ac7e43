"""What a rule-set change would decide differently: `make policy-diff base=<git ref>`.

Before a reload, an author asks both rule sets, the one at `base` and the one in policies/ now,
for every decision each enforcement point of a topology can be asked: every deciding
listener (its sender and step), every known region and category, consent absent or any
canonical value (grouped as the compiled engine groups them: values that differ only in
purposes no instance of the point processes for are one). OPA answers each rule set in one
`opa eval` (decision_space.rego `decisions`, with each rule set's own index of each point's
catalog); nothing here decides anything. Every labelling whose answer differs is listed:
which point, sender and step, which labels, and what it moves from and to. A policy that
routes as well as allows needs this: a dry run of the plugin says whether an answer would
change, not where records would go instead.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

from . import manifest, policydata
from .engines import envoy_compiled, envoy_opa
from .manifest import REPO
from .plan import place

WALKTHROUGH = "topologies/examples/mixed-regions.yaml"  # what `make demo` deploys
QUERY = "data.complyroute_engines.decision_space.decisions"


class PolicyDiffError(RuntimeError):
    """A ref or rule set that cannot be compared; the message says what to do."""


def rule_set_at(ref: str, folder: Path) -> Path:
    """policies/ as of git `ref`, written under `folder`."""
    archive = subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", ref, "policies"], capture_output=True)
    if archive.returncode != 0:
        raise PolicyDiffError(f"no rule set at {ref!r}: {archive.stderr.decode().strip() or 'git archive failed'}")
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive.stdout, check=True)
    return folder / "policies"


def describe(outcome: dict) -> str:
    return f"allowed to {outcome['destination']}" if outcome["allowed"] else f"{outcome['status']} {outcome['code']}"


def decisions(points, policies: Path, known: dict) -> dict[tuple, dict]:
    """{(point, listener, region, category, consent): outcome} under the rule set `policies`."""
    data = envoy_opa.opa_data(points, policies)
    space = {
        "regions": known["regions"],
        "categories": known["categories"],
        "points": {
            point.name: {
                "data": data[point.name],
                "listeners": {
                    listener.name: {"sender": listener.sender, "step": listener.step,
                                    "consents": list(envoy_compiled.consent_classes(known["purposes"], envoy_compiled.processed_purposes(point.catalog)))}
                    for listener in point.deciding
                },
            }
            for point in points
        },
    }
    try:
        answers = policydata.evaluate(QUERY, space, policies, modules=(envoy_compiled.DECISION_SPACE,))
    except policydata.PolicyDataError as error:
        raise PolicyDiffError(f"OPA could not evaluate the rule set in {policies}: {error}") from None
    return {tuple(answer[:5]): answer[5] for answer in answers or []}


def compare(topology: manifest.Topology, old: Path, new: Path) -> dict:
    """Both rule sets' decisions over the topology's decision space, and those that differ."""
    points = [point for point in place(topology).points if point.deciding]
    references = [envoy_compiled.reference(rules) for rules in (old, new)]
    # Labels either rule set knows: a code one of them adds or drops is part of the change.
    known = {key: sorted(set().union(*(set(r[key]) for r in references))) for key in ("regions", "categories", "purposes")}
    before, after = decisions(points, old, known), decisions(points, new, known)
    listeners = {(p.name, l.name): l for p in points for l in p.deciding}
    classes = {p.name: envoy_compiled.consent_classes(known["purposes"], envoy_compiled.processed_purposes(p.catalog)) for p in points}
    changed = []
    for key in sorted(set(before) | set(after), key=lambda k: tuple("" if v is None else str(v) for v in k)):
        if before.get(key) != after.get(key):
            point, listener, region, category, consent = key
            changed.append({
                "point": point, "listener": listener, "sender": listeners[(point, listener)].sender,
                "step": listeners[(point, listener)].step, "region": region, "category": category, "consent": consent,
                # The consent values that answer alike at this point (the value shown stands for them).
                "consent_values": len(classes[point][consent]),
                "before": before.get(key), "after": after.get(key),
            })
    return {"compared": len(set(before) | set(after)), "listeners": len(listeners), "changed": changed}


def report(result: dict, base: str, out=sys.stdout) -> None:
    changed = result["changed"]
    print(f"policy-diff: {result['compared']} decisions at {result['listeners']} deciding listeners compared "
          f"({base} -> policies/): {len(changed)} would change", file=out)
    # One line per listener, labels but region, and change; the regions it holds for listed.
    grouped: dict[tuple, list[str]] = defaultdict(list)
    for change in changed:
        alike = f" (+{change['consent_values'] - 1} alike)" if change["consent_values"] > 1 else ""
        labels = f"{change['category']}, consent {change['consent'] if change['consent'] is not None else '(none)'}{alike}"
        move = f"{describe(change['before']) if change['before'] else '(none)'} -> {describe(change['after']) if change['after'] else '(none)'}"
        grouped[(change["point"], change["sender"], change["step"], labels, move)].append(change["region"])
    for (point, sender, step, labels, move), regions in grouped.items():
        print(f"  {point}: {sender} -> {step}, {labels}, region {','.join(sorted(regions))}: {move}", file=out)


def main(base: str, topology_name: str = WALKTHROUGH, services: str | None = None, policies: Path = policydata.POLICIES,
         as_json: bool = False, out=None) -> int:
    out = out or sys.stdout
    topology = manifest.load(topology_name, services)
    with tempfile.TemporaryDirectory(prefix="complyroute-policy-diff-") as scratch:
        result = compare(topology, rule_set_at(base, Path(scratch)), policies)
    if as_json:
        print(json.dumps(result, indent=1), file=out)
    else:
        report(result, base, out)
    return 0
