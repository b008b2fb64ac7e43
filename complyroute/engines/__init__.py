"""How enforcement points decide: one module per engine, behind one small interface.

A topology manifest names its engine (`engine.kind`). An engine turns the enforcement points
a placement produced into the configuration of each point's processes:

    configure(points, settings, rule_set, trust) -> {point name: PointConfig}

`trust`: each point's mutual TLS and label-token settings (identity.PointTrust), or None.

- envoy-opa (envoy_opa.py): Envoy asks OPA over ext_authz before every hop.
- envoy-compiled (envoy_compiled.py): OPA evaluates, ahead of time, each point's finite
  decision space; the allowed outcomes become Envoy routes, so an allowed hop needs no call
  out of Envoy. Everything else asks OPA as in envoy-opa.

Both load the same rule set; neither re-implements it. What a deployment's points run is made
from these by one generator (configuration.py), which every runtime calls.
"""

from __future__ import annotations

from complyroute.engines.contract import EngineError, PointConfig
from complyroute.policy import names
from complyroute.policy.ruleset import RuleSet
from complyroute.topology.manifest import ENGINES
from complyroute.topology.plan import EnforcementPoint

__all__ = ["EngineError", "PointConfig", "configure"]  # the interface (contract.py), and the engine chosen by kind


def configure(kind: str, points: list[EnforcementPoint], settings: dict, rule_set: RuleSet, trust: dict | None = None,
              ahead: bool = True, set_clusters: dict[str, tuple[str, ...]] | None = None) -> dict[str, PointConfig]:
    """The configuration of every point, by the engine `kind` (a manifest's engine.kind).

    `trust`: by point name, its identity.PointTrust; None: plain HTTP between parts.
    `ahead`: False gives the points the rule set without its precomputed answers (an empty
    allowed table, no compiled routes): every hop is decided in full, and nothing needs the
    decision space evaluated first (a reload's first step, reload.py).
    `set_clusters`: by point, the compliant sets its running Envoy has a cluster for (a reload:
    Envoy's clusters stay those of the deploy); None: a cluster for every set the rule set's
    answers over the decision space give (a deploy)."""
    from complyroute.engines import envoy_compiled, envoy_opa

    try:
        names.check(rule_set.folder)
    except names.UnknownName as error:
        raise EngineError(str(error)) from None
    modules = {"envoy-opa": envoy_opa, "envoy-compiled": envoy_compiled}
    assert set(modules) == set(ENGINES), "every engine a manifest may name has a module here"
    return modules[kind].configure(points, settings, rule_set, trust or {}, ahead, set_clusters)
