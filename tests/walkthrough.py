"""The "Write your own rule set" walkthrough of policies/README.md, block by block: the tests
that run it take its rule, test and input from there, so the page and the tests cannot part."""

import re
import shutil
from pathlib import Path

from complyroute.policy.policyfiles import POLICIES

README = POLICIES / "README.md"


def block(name: str) -> str:
    """The fenced block after `<!-- walkthrough: name -->`, unindented."""
    match = re.search(rf"<!-- walkthrough: {name} -->\n(\s*)```\w*\n(.*?)\n\s*```", README.read_text(), re.S)
    if not match:
        raise LookupError(f"{README} has no walkthrough block {name!r}")
    indent = match.group(1).strip("\n")
    return "\n".join(line.removeprefix(indent) for line in match.group(2).splitlines()) + "\n"


# Where the walkthrough puts its rule: after the last `exclusions` rule, before this line.
BEFORE = "# --- destinations"


def rule_set_with_rule(folder: Path) -> Path:
    """policies/ copied under `folder`, the walkthrough's rule put where it says, in compliance.rego."""
    policies = folder / "policies"
    shutil.copytree(POLICIES, policies)
    compliance = policies / "complyroute" / "compliance" / "compliance.rego"
    text = compliance.read_text()
    assert text.count(BEFORE) == 1, f"compliance.rego has no single {BEFORE!r} line, where the walkthrough puts its rule"
    compliance.write_text(text.replace(BEFORE, block("rule") + "\n" + BEFORE))
    return policies
