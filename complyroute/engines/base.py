"""What every engine gives and may raise: each point's configuration (PointConfig), and the
error that says why a point could not be configured (EngineError). Beneath the engines, so that
each takes them from here and the package's configure (engines/__init__.py) picks among them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PointConfig:
    envoy: dict  # Envoy's bootstrap
    opa: dict | None  # OPA's configuration; None: the point only forwards and runs no OPA
    data: dict | None  # the document OPA loads beside the rule set (data.complyroute.index, see policydata)


class EngineError(RuntimeError):
    """An engine could not configure a point; the message says why and what to do."""
