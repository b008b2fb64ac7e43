"""`complyroute new-rule-set NAME [DIR]`: a rule set of one's own, from the template beside this
module, that passes `make policy-test` as written (tests/integration/authoring/test_new_rule_set.py).

It holds only what a rule set supplies: its label schema and reference data, its index fields and
its exclusions, each with tests beside it, and examples. The platform's parts (policyfiles.PLATFORM)
are added by the control plane wherever the rule set is loaded."""

from __future__ import annotations

import re
from pathlib import Path

from complyroute.policy.policyfiles import RULE_SETS

TEMPLATE = Path(__file__).with_name("rule_set_template")
PLACEHOLDER = "NAME"
VALID_NAME = re.compile(r"[a-z][a-z0-9-]{0,39}")


class NewRuleSetError(ValueError):
    """A name or folder a rule set cannot be made with; the message says why."""


def scaffold(name: str, parent: Path | None = None) -> Path:
    """The rule set `name` written under `parent` (default rule-sets/), from TEMPLATE; its folder."""
    if not VALID_NAME.fullmatch(name):
        raise NewRuleSetError(f"rule set name {name!r}: use lowercase letters, digits and '-', starting with a letter (at most 40)")
    folder = (parent if parent is not None else RULE_SETS) / name
    if folder.exists() and any(folder.iterdir()):
        raise NewRuleSetError(f"{folder} exists and is not empty: name a new folder")
    for source in sorted(TEMPLATE.rglob("*")):
        if source.is_file():
            target = folder / source.relative_to(TEMPLATE)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(source.read_text().replace(PLACEHOLDER, name))
    return folder
