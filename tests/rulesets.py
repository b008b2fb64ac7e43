"""Rule sets the tests make: the shipped one copied, with rules of a test's own appended."""

import shutil
from pathlib import Path

from complyroute.policy.policyfiles import POLICIES


def shipped_with(folder: Path, rules: str = "") -> Path:
    """policies/ copied to folder/policies, `rules` (Rego of package complyroute.compliance)
    appended to its compliance.rego, after the last exclusions rule; the copy's folder."""
    policies = folder / "policies"
    shutil.copytree(POLICIES, policies)
    compliance = policies / "complyroute" / "compliance" / "compliance.rego"
    compliance.write_text(compliance.read_text() + rules)
    return policies
