"""The Prometheus scrape configuration of a local deployment (the run folder's prometheus.yml, which
`deploy` writes): every point's metrics listener (Envoy's statistics at /metrics, its OPA's at
/metrics/opa: proxy/metrics.py) and every service's GET /metrics (services/src/metrics.js).

Each target is labelled with what it is: `point` and `node` (a point's Envoy and OPA), `service`,
`step` and `node` (a service). Under mutual TLS every target admits the monitoring identity only
(pki.MONITORING), whose credential the configuration names; Prometheus checks a server's
certificate against a host name, and the parts' certificates name them by a URI only (trust/pki.py),
so it does not check theirs: the client certificate is what closes these ports to anyone else.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from complyroute.topology.plan import Endpoint, Plan
from complyroute.trust import identity, pki

SCRAPE_CONFIG = "prometheus.yml"
# How often Prometheus reads every target: Envoy's statistics of a point are a few hundred
# series; a service's a dozen.
SCRAPE_INTERVAL = "5s"


def _target(endpoint: Endpoint) -> str:
    return f"{endpoint.reach}:{endpoint.port}"


def scrape_config(plan: Plan, credentials: Path | None, interval: str = SCRAPE_INTERVAL) -> dict:
    """The configuration (as Prometheus reads it) scraping every part of `plan`; `credentials`: the
    run's pki folder under mutual TLS (identity.Credentials.write), None without."""
    security = {}
    if credentials is not None:
        files = identity.credential_files(credentials, pki.MONITORING)
        security = {"scheme": "https",
                    "tls_config": {"ca_file": files.ca, "cert_file": files.cert, "key_file": files.key, "insecure_skip_verify": True}}
    points = [point for point in plan.points if point.metrics is not None]

    def job(name: str, path: str, targets: list[tuple[Endpoint, dict]]) -> dict:
        return {"job_name": name, "metrics_path": path, **security,
                "static_configs": [{"targets": [_target(endpoint)], "labels": labels} for endpoint, labels in targets]}

    return {
        "global": {"scrape_interval": interval, "scrape_timeout": interval},
        "scrape_configs": [
            job("complyroute-envoy", "/metrics", [(p.metrics, {"point": p.name, "node": p.node}) for p in points]),
            job("complyroute-opa", "/metrics/opa", [(p.metrics, {"point": p.name, "node": p.node}) for p in points if p.deciding]),
            job("complyroute-services", "/metrics", [(s.endpoint, {"service": s.instance.id, "step": s.instance.step, "node": s.instance.node.name})
                                                     for s in plan.services]),
        ],
    }


def write(run_dir: Path, plan: Plan, credentials: Path | None) -> Path:
    """Write the deployment's scrape configuration into its run folder; its path."""
    path = run_dir / SCRAPE_CONFIG
    path.write_text(yaml.safe_dump(scrape_config(plan, credentials), sort_keys=False))
    return path
