"""envoy-opa: Envoy asks OPA (opa-envoy-plugin, ext_authz) before every hop.

OPA answers most allowed hops by a lookup in the point's allowed table, the rule set's own
answers precomputed at deploy and reload (precompute.py), and evaluates the rule set for the
rest."""

from __future__ import annotations

import sys
from pathlib import Path

from complyroute.engines import precompute
from complyroute.engines.contract import PointConfig
from complyroute.policy import bundles, labels, policydata
from complyroute.policy.ruleset import RuleSet
from complyroute.proxy.envoy import envoy_config
from complyroute.proxy.opa import opa_config
from complyroute.topology.plan import EnforcementPoint


def opa_data(points: list[EnforcementPoint], policies: Path, revision: str | None = None) -> dict[str, dict]:
    """What each deciding point's OPA loads beside the rule set: its catalog, indexed by the rule
    set, and the rule set's revision (None: bundles.revision's), which its decisions name."""
    revision = revision or bundles.revision(policies)
    documents = policydata.opa_data({point.name: point.catalog for point in points if point.deciding}, policies)
    return {point: {**data, "complyroute": {**data.get("complyroute", {}), "revision": revision}} for point, data in documents.items()}


def decided_data(points: list[EnforcementPoint], policies: Path, ahead: bool = True,
                 set_clusters: dict[str, tuple[str, ...]] | None = None,
                 revision: str | None = None) -> tuple[dict[str, dict], precompute.Precomputed]:
    """opa_data with each point's allowed table (precompute.py), checked against the rule set,
    and the answers the tables hold. `ahead` False: empty tables, nothing asked ahead of time.
    `set_clusters`: the compliant sets a running deployment's Envoys have clusters for (a
    reload's), which the answers route to; None (a deploy): those the answers give."""
    data = opa_data(points, policies, revision)
    if set_clusters is not None:  # the answers are asked as the points will route them
        data = {point: {**document, precompute.QUICK_PATH_DOCUMENT: {"set_clusters": list(set_clusters.get(point, ()))}}
                for point, document in data.items()}
    precomputed = precompute.precompute(points, policies, data) if ahead else precompute.Precomputed.nothing(policies)
    if ahead and precomputed.skipped:
        which = "some hops" if precomputed.outcomes else "every hop"
        print(f"complyroute: {which} ask OPA in full, with the body: {precomputed.skipped}", file=sys.stderr)
    return precompute.with_tables(data, precomputed, set_clusters), precomputed


def point_config(point: EnforcementPoint, settings: dict, data: dict | None, label_schema: tuple[labels.Label, ...],
                 matchers: dict[str, dict] | None = None, trust=None) -> PointConfig:
    if not point.deciding:  # a point that only forwards (baseline, a last step's sidecar) needs no OPA
        return PointConfig(envoy_config(point, settings, trust=trust), None, None)
    opa = opa_config(point, decision_logs=settings.get("decision_logs", "off"))
    quick_path = data[precompute.QUICK_PATH_DOCUMENT] if data else {}
    set_clusters = tuple(quick_path.get("set_clusters", ()))
    return PointConfig(envoy_config(point, settings, matchers, trust, label_schema, set_clusters), opa, data, set_clusters,
                       quick_path.get("digest"))


def configure(points: list[EnforcementPoint], settings: dict, rule_set: RuleSet, trust: dict, ahead: bool = True,
              set_clusters: dict[str, tuple[str, ...]] | None = None) -> dict[str, PointConfig]:
    data, _ = decided_data(points, rule_set.folder, ahead, set_clusters, rule_set.revision)
    return {point.name: point_config(point, settings, data.get(point.name), rule_set.schema, trust=trust.get(point.name)) for point in points}
