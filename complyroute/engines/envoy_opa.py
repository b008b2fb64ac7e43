"""envoy-opa: Envoy asks OPA (opa-envoy-plugin, ext_authz) before every hop."""

from __future__ import annotations

from pathlib import Path

from .. import enforcement
from ..enforcement import EnforcementPoint
from . import PointConfig


def opa_data(point: EnforcementPoint) -> dict:
    """What a point's OPA loads beside the rule set: its slice of the catalog."""
    return {"complyroute": {"catalog": point.catalog}}


def point_config(point: EnforcementPoint, settings: dict, matchers: dict[str, dict] | None = None) -> PointConfig:
    if not point.deciding:  # a point that only forwards (baseline, a last step's sidecar) needs no OPA
        return PointConfig(enforcement.envoy_config(point, settings), None, None)
    return PointConfig(enforcement.envoy_config(point, settings, matchers), enforcement.opa_config(point), opa_data(point))


def configure(points: list[EnforcementPoint], settings: dict, policies: Path) -> dict[str, PointConfig]:
    return {point.name: point_config(point, settings) for point in points}
