"""What every engine module shares: a point's configuration, and the error an engine raises.

Apart from the package (engines/__init__.py, which picks an engine module), so that the engine
modules import it without importing the package that imports them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PointConfig:
    envoy: dict  # Envoy's bootstrap
    opa: dict | None  # OPA's configuration; None: the point only forwards and runs no OPA
    data: dict | None  # the document OPA loads beside the rule set (data.complyroute.index, see policydata)
    # What the runtimes read of that document, as fields, so none reads it by name: the
    # compliant sets its Envoy has a cluster for, and the digest of its allowed table (what its
    # OPA reports once it holds it); () and None at a point without OPA.
    set_clusters: tuple[str, ...] = ()
    table_digest: str | None = None


class EngineError(RuntimeError):
    """An engine could not configure a point; the message says why and what to do."""
