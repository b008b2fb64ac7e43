"""Rule sets the tests make: the shipped one copied, with rules of a test's own appended; and the
one a manifest names, as the command line makes it."""

import functools
import shutil
from pathlib import Path

from complyroute.policy.policyfiles import POLICIES
from complyroute.policy.ruleset import RuleSet
from complyroute.topology.manifest import Topology


@functools.cache
def _named(policy: str) -> RuleSet:
    return RuleSet.of(policy)


def of_manifest(topology: Topology) -> RuleSet:
    """The rule set `topology`'s manifest names (its `policy`), made once a session: what a deploy
    or a render is given when the command line names none."""
    return _named(topology.policy)


def shipped_with(folder: Path, rules: str = "") -> Path:
    """policies/ copied to folder/policies, `rules` (Rego of package complyroute.compliance)
    appended to its compliance.rego, after the last exclusions rule; the copy's folder."""
    policies = folder / "policies"
    shutil.copytree(POLICIES, policies)
    compliance = policies / "complyroute" / "compliance" / "compliance.rego"
    compliance.write_text(compliance.read_text() + rules)
    return policies
