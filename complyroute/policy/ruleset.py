"""A rule set as the control plane deploys it: one value, made once where a rule set is chosen
(a deploy, a render, a reload, the bench) and handed down, instead of a folder every reader
completes, dates and reads the labels of again.

RuleSet.of completes the chosen folder with the platform's parts (policyfiles.rule_set), dates
it (bundles.revision: git runs once) and reads its label schema (labels.schema); a rule set
whose schema is unusable is refused there, before anything is configured.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from complyroute.policy import bundles, labels, policyfiles


@dataclass(frozen=True)
class RuleSet:
    chosen: str  # as chosen: "policies", a name of rule-sets/ or a folder; what a reload applies again unless told
    folder: Path  # complete: the platform's parts added (policyfiles.rule_set)
    revision: str  # what every bundle and decision names (bundles.revision)
    schema: tuple[labels.Label, ...]  # its labels, which services, listeners and the decision space follow

    @classmethod
    def of(cls, chosen: str | Path) -> RuleSet:
        """The rule set `chosen` names; policyfiles.RuleSetError when it names no rule set,
        labels.LabelSchemaError when its labels are unusable."""
        folder = policyfiles.rule_set(chosen)
        return cls(str(chosen), folder, bundles.revision(folder, source=policyfiles.source_of(chosen)), labels.schema(folder))

    @property
    def service_setting(self) -> str:
        """Its labels as every service instance is told them (labels.service_setting)."""
        return labels.service_setting(self.schema)
