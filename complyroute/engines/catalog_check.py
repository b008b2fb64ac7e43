"""The deploy-time guards over a catalog on its own: what `make policy-test` checks of each
example catalog (precompute.py's table and envoy_compiled.py's routes against the rule set)."""

from __future__ import annotations

from pathlib import Path

from complyroute.engines import envoy_compiled, envoy_opa
from complyroute.topology.plan import DecidingListener, Endpoint, EnforcementPoint


def catalog_point(catalog: dict) -> EnforcementPoint:
    """One enforcement point deciding, with `catalog`, every hop the catalog can name: from each
    gateway and instance into each step. Its addresses are never used: nothing runs."""
    nowhere = Endpoint("127.0.0.1", 0)
    senders = sorted({*catalog.get("gateways", {}), *catalog.get("instances", {})})
    steps = sorted({instance["step"] for instance in catalog.get("instances", {}).values()})
    listeners = [DecidingListener(f"{sender}-{step}", nowhere, sender=sender, step=step) for sender in senders for step in steps]
    return EnforcementPoint("catalog", "none", nowhere, nowhere, nowhere, nowhere, nowhere, role="central", deciding=listeners,
                            catalog=catalog)


def check_catalog(catalog: dict, policies: Path) -> int:
    """Builds the allowed table and the compiled routes of a point holding `catalog` through the
    guards: the number of allowed labellings (EngineError when a fast path disagrees)."""
    point = catalog_point(catalog)
    _, precomputed = envoy_opa.decided_data([point], policies)
    if not precomputed.outcomes:
        return 0
    outcomes = envoy_compiled.outcomes_by_listener(precomputed)
    headers = [header for _, header in precomputed.space["labels"]]
    matchers = {listener.name: envoy_compiled.listener_matcher(outcomes.get((point.name, listener.name), {}), "1s", headers)
                for listener in envoy_compiled.compiled_listeners(point)}
    envoy_compiled.check_routes(point, matchers, precomputed)
    return len(precomputed.outcomes)
