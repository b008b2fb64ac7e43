"""The one generator of what a deployment's enforcement points run: every runtime (a local deploy
and reload, a Kubernetes render and reload, the bench) calls `generate` and only places what it
returns, as files in a run folder or as ConfigMaps.

`generate` takes the points, the engine's settings, the rule set (RuleSet), each point's trust
and, at a reload, the compliant sets the running Envoys have clusters for. It returns one
Configuration: per point its Envoy bootstrap with what a new rule set changes split out of it
into files (the route files, and the listeners file where the Layout says: envoy.split_listeners),
its OPA's configuration and bundle (bundles.py), and the versions it runs once it has taken them;
and, as typed fields, the rule set's revision and labels and the compliant sets each point's
Envoy has a cluster for. No runtime reads an engine's data document: what one needs of it is a
field here.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from complyroute import engines
from complyroute.engines.precompute import QUICK_PATH_DOCUMENT
from complyroute.policy import bundles, labels
from complyroute.policy.ruleset import RuleSet
from complyroute.proxy.envoy import split_listeners
from complyroute.proxy.routes import rule_set_routes, split_routes
from complyroute.topology.plan import EnforcementPoint
from complyroute.trust import identity

# Where a point's OPA reports the digest of the allowed table it holds, under /v1/data/.
TABLE_DIGEST_PATH = f"{QUICK_PATH_DOCUMENT}/digest"
BOOTSTRAP_KEY = "envoy.json"  # the bootstrap's name where a budget counts it (a ConfigMap's key)


@dataclass(frozen=True)
class Layout:
    """Where a point's Envoy reads the files split out of its bootstrap, by point name."""

    routes: Callable[[str], str]  # the folder of its route files
    listeners: Callable[[str], str] | None = None  # the folder of its listeners file; None: listeners stay in the bootstrap
    # Bytes a bootstrap may take as compact JSON, BOOTSTRAP_KEY counted, with only the rule set's
    # routes split out; over them every route configuration goes to files (a ConfigMap's budget).
    bootstrap_budget: int | None = None


@dataclass(frozen=True)
class Versions:
    """What a point runs once it has taken its configuration: its OPA's revision and table digest
    (None: no OPA), its Envoy's route files' version (None: no route files)."""

    revision: str | None
    table_digest: str | None
    routes: str | None


@dataclass(frozen=True)
class PointConfiguration:
    envoy: dict  # the bootstrap, naming the files below instead of holding them
    routes: dict[str, str]  # route files by name (routes.split_routes)
    listeners: dict[str, str]  # the listeners file by name ({}: the listeners are in the bootstrap)
    listeners_version: str | None
    opa: dict | None  # OPA's configuration; None: the point only forwards
    bundle: bytes | None  # what its OPA decides with: rule set, index, revision, allowed table
    set_clusters: tuple[str, ...]  # the compliant sets its Envoy has a cluster for
    versions: Versions


@dataclass(frozen=True)
class Configuration:
    rule_set: RuleSet
    points: dict[str, PointConfiguration]

    @property
    def revision(self) -> str:
        return self.rule_set.revision

    @property
    def schema(self) -> tuple[labels.Label, ...]:
        return self.rule_set.schema

    @property
    def set_clusters(self) -> dict[str, tuple[str, ...]]:
        """By deciding point, the compliant sets its Envoy has a cluster for: what a reload keeps."""
        return {name: point.set_clusters for name, point in self.points.items() if point.opa is not None}

    @property
    def bundles(self) -> dict[str, bytes]:
        """Every deciding point's bundle, by point name."""
        return {name: point.bundle for name, point in self.points.items() if point.bundle is not None}

    @property
    def versions(self) -> dict[str, Versions]:
        return {name: point.versions for name, point in self.points.items()}


def compact(document: dict) -> str:
    return json.dumps(document, separators=(",", ":"))


def split(point: EnforcementPoint, envoy: dict, layout: Layout, version: str) -> tuple[dict, dict[str, str], dict[str, str], str | None]:
    """The point's bootstrap, its route files (those of the rule set's routes: rule_set_routes;
    every route over the layout's budget) and its listeners file with its version."""
    folder = layout.routes(point.name)
    bootstrap, routes = split_routes(envoy, folder, version, rule_set_routes(envoy))
    if layout.bootstrap_budget is not None and len(BOOTSTRAP_KEY) + len(compact(bootstrap).encode()) > layout.bootstrap_budget:
        bootstrap, routes = split_routes(envoy, folder, version)
    if layout.listeners is None or not point.deciding:
        return bootstrap, routes, {}, None
    bootstrap, listeners, listeners_version = split_listeners(bootstrap, layout.listeners(point.name))
    return bootstrap, routes, listeners, listeners_version


def generate(points: list[EnforcementPoint], engine: dict, rule_set: RuleSet, trust: dict[str, identity.PointTrust] | None,
             layout: Layout, signing_key: bytes, set_clusters: dict[str, tuple[str, ...]] | None = None, ahead: bool = True,
             routes_version: str | None = None, bundled: Path | None = None) -> Configuration:
    """What every point runs (engines.configure by the engine `engine["kind"]`), split and bundled.

    `signing_key`: the deployment's bundle signing key (bundles.new_signing_key), which every
    bundle is signed with. `set_clusters`: at a reload, by point, the compliant sets its running
    Envoy has a cluster for (None: a deploy, a cluster for every set the answers give). `ahead`
    False: the rule set without its precomputed answers (engines.configure). `routes_version`: the
    route files' version (None: the revision). `bundled`: the folder of other rules for the bundles
    to carry, under their own revision, the points configured by `rule_set` all the same (the
    bench's allow-all floor, configured as the point it is the floor of)."""
    configs = engines.configure(engine["kind"], points, engine, rule_set, trust, ahead, set_clusters)
    files = bundles.rule_set_files(bundled or rule_set.folder)
    revision = bundles.revision(bundled) if bundled is not None else rule_set.revision
    version = routes_version or revision
    built = bundles.build(files, {point.name: configs[point.name].data for point in points if configs[point.name].opa is not None},
                          revision, signing_key)
    generated = {}
    for point in points:
        config = configs[point.name]
        bootstrap, routes, listeners, listeners_version = split(point, config.envoy, layout, version)
        deciding = config.opa is not None
        generated[point.name] = PointConfiguration(
            bootstrap, routes, listeners, listeners_version, config.opa, built.get(point.name), config.set_clusters,
            Versions(revision if deciding else None, config.table_digest, version if routes else None))
    return Configuration(rule_set, generated)


def bundle_versions(bundle: bytes) -> tuple[str, str | None]:
    """(revision, table digest) of a point's bundle: what its OPA reports once it holds it."""
    document = bundles.data_of(bundle)
    return document["complyroute"]["revision"], document.get(QUICK_PATH_DOCUMENT, {}).get("digest")
