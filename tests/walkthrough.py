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


def rule_set_with_rule(folder: Path) -> Path:
    """policies/ copied under `folder`, the walkthrough's rule put where it says: appended to compliance.rego, after its last exclusions rule."""
    policies = folder / "policies"
    shutil.copytree(POLICIES, policies)
    compliance = policies / "complyroute" / "compliance" / "compliance.rego"
    text = compliance.read_text()
    last = text.rfind("\nexclusions contains ")
    assert last >= 0 and "\n# ---" not in text[last:], "compliance.rego does not end with its exclusions, after which the walkthrough puts its rule"
    compliance.write_text(text.rstrip("\n") + "\n\n" + block("rule"))
    return policies
