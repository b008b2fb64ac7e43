"""The parts' identities: SPIFFE-style URIs, the only name in every certificate (pki.py).

Standard library only, like the bundle server that checks them (bundleserver.py): on
Kubernetes the bundle server runs from the official Python image with its module and this one
mounted from a ConfigMap, without the rest of complyroute or its packages.
"""

TRUST_DOMAIN = "complyroute"


def spiffe_id(kind: str, name: str) -> str:
    """The identity of a part: kind is "service", "point" or "control"."""
    return f"spiffe://{TRUST_DOMAIN}/{kind}" + (f"/{name}" if name else "")


CONTROL = spiffe_id("control", "")
# The bundle server (complyroute/policy/bundleserver.py), which serves the points' OPAs their rule set.
BUNDLE_SERVER = spiffe_id("control", "bundles")
# What scrapes the parts' metrics (Prometheus, with the scrape configuration a deploy writes): it
# reads GET /metrics of every point's metrics listener and every service, and nothing else.
MONITORING = spiffe_id("monitoring", "")
