"""Changeability: what a rule-set change costs a running deployment (`python -m experiments reload`):
the change made, the records sent across it, and what is measured of each cell.

The paper argues that a central entity is easier to change than dynamic routers or sidecars
(sections I, II and VII) but measures nothing about change. Here each topology, under each
engine, at 5 and 50 services, is deployed and sent records at a steady rate (open loop: each
record is sent at its scheduled time, whether or not earlier ones were answered); after a
few seconds the rule set changes (complyroute.runtime.local.reload: the US joins the EU adequacy list),
records keep coming, then stop. Per cell:

- propagation: from the reload's start until every enforcement point decides with the new
  revision (reload_policy's own measure), and how much of it was the control plane computing
  and writing the new configuration;
- precomputed: until every point holds the new revision's precomputed answers again (the
  reload's second step: between the two, every hop is decided in full);
- lost: records without an answer, or with any status but 200 (every record sent is one the
  rules allow before and after the change);
- mixed: records whose hops name more than one revision in their path entries (decided
  partly before and partly after the change), counted and plotted over time.

Raw: raw/reload/<cell>.json (every record: send time, status, revisions per hop; the reload's
result), written by run/changeability_run.py. Derived (report/changeability_report.py):
report/tables/changeability.csv, report/figures/changeability.png, and the "Changeability"
section of the run's report.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from complyroute.policy import policyfiles

from experiments.design.matrix import ENFORCING

TOPOLOGIES = ENFORCING  # the baseline has no rule set to change
ENGINES = ("envoy-opa", "envoy-compiled")
LABELS = {"region": "EU", "category": "personal", "consent": "analytics,billing,care"}
# Hops per second the records bring, whatever the chain's length: well under this machine's
# capacity, so what is measured is the change, not overload.
HOPS_PER_SECOND = 200
BEFORE_S, AFTER_S = 3.0, 3.0


def changed_rule_set(folder: Path) -> Path:
    """policies/ with the US added to the EU adequacy list (a change of the reference data)."""
    policies = folder / "policies"
    shutil.copytree(policyfiles.POLICIES, policies)
    add_us_to_adequacy(policies)
    return policies


def add_us_to_adequacy(policies: Path) -> None:
    """The change itself, made in place in the rule set at `policies` (one write of its reference
    data: a watcher of the folder sees one save)."""
    reference = policies / "complyroute" / "reference" / "data.json"
    data = json.loads(reference.read_text())
    data["adequacy"].append("US")
    reference.write_text(json.dumps(data))
