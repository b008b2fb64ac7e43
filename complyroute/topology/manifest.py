"""Topology manifests: load, validate and expand into the model every topology is rendered from.

A manifest (topologies/*.yaml) names the enforcement topology, the nodes, the services and
their placement. Validation happens before anything starts and names the field at fault.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from complyroute.topology import fields

REPO = Path(__file__).resolve().parents[2]
REFERENCE_DATA = REPO / "policies" / "complyroute" / "reference" / "data.json"
MANIFESTS = REPO / "topologies"  # the topologies every tool lists (not its examples/)
PLACEMENT = "placement.py"  # what makes a folder a topology's: `place(topology, net) -> Plan`

ENGINES = ("envoy-opa", "envoy-compiled")  # modules in complyroute/engines/
DECISION_LOGS = ("off", "file")

# Default purposes of generated instances, cycled; the default record consents to all of them.
GENERATED_PURPOSES = ("billing", "analytics", "care")
# A service's `attributes`: names a rule set reads, besides the catalog's own fields.
ATTRIBUTE_NAME = re.compile(r"[a-z][a-z0-9_]{0,31}")
# An instance's id: a DNS label, since it names the instance's Kubernetes objects, SPIFFE
# identity and audit log, and the compliant sets the routing header names (proxy/contract.py:
# ids joined with "," and tiers with "|", which an id therefore cannot hold).
INSTANCE_ID = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")
CATALOG_FIELDS = frozenset({"id", "step", "region", "node", "certifications", "purposes"})
GENERATED_CERTIFICATIONS = ("health-data",)
# The most instances one service entry's `replicas` may make: the largest deployment the
# experiments run has 50 services, and each replica is a whole instance (a process, and in the
# sidecar topology its Envoy and OPA too), so a larger count is more likely a typo than a plan.
MAX_REPLICAS = 50


SECURITY_DEFAULTS = {"mtls": True, "label_tokens": True}


class ManifestError(ValueError):
    """A manifest that cannot be deployed; the message names the field and what is allowed."""


@dataclass(frozen=True)
class Node:
    name: str
    role: str  # "gateway" or "service"
    address: str  # the node's own loopback address, so placement shows in every address


@dataclass(frozen=True)
class Instance:
    id: str
    step: str
    region: str
    node: Node
    certifications: tuple[str, ...]
    purposes: tuple[str, ...]
    index: int  # 1-based position among the manifest's instances, replicas expanded; fixes the instance's ports
    # What else a rule set reads of the instance (the manifest's `attributes`), by name: a
    # classification rule set's clearance, for one. Sorted (name, values) pairs.
    attributes: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def catalog_entry(self) -> dict:
        return {
            **{name: list(values) for name, values in self.attributes},
            "step": self.step,
            "region": self.region,
            "node": self.node.name,
            "certifications": list(self.certifications),
            "purposes": list(self.purposes),
        }


@dataclass
class Topology:
    name: str
    kind: str  # the name of its topology folder
    source: Path
    folder: Path  # the topology folder, which holds its placement
    gateway: Node
    service_nodes: list[Node]
    gateway_region: str
    instances: list[Instance]
    steps: list[str]  # in chain order
    routers_per_node: int = 1
    engine: dict = field(default_factory=dict)  # how its points enforce (engines/, proxy/)
    workload: dict = field(default_factory=dict)  # what its services do with a record: work_iterations
    # mtls: every hop between parts is mutual TLS with the deployment's own CA; label_tokens:
    # the entry signs each record's labels and later points decide on the token (identity.py).
    security: dict = field(default_factory=lambda: dict(SECURITY_DEFAULTS))
    # The rule set its points decide with (policyfiles.rule_set): "policies", the name of one
    # in rule-sets/, or a folder. The services' attributes are what that rule set reads.
    policy: str = "policies"

    def instances_of(self, step: str) -> list[Instance]:
        return [i for i in self.instances if i.step == step]

    def next_step(self, step: str) -> str | None:
        position = self.steps.index(step)
        return self.steps[position + 1] if position + 1 < len(self.steps) else None


@dataclass(frozen=True)
class Listed:
    """A manifest in MANIFESTS as the tools list it: the names it goes by."""

    name: str  # its file name
    aliases: tuple[str, ...]  # short names (`aliases: [sa]`)
    paper_name: str | None  # what the paper, and the experiments' report, call it (`paper: {name: SA, order: 4}`)
    paper_order: int | None  # its place in the experiments: the paper's Table I, the reference last


@functools.cache
def listed() -> tuple[Listed, ...]:
    """Every manifest in MANIFESTS, by file name."""
    found = []
    for path in sorted(MANIFESTS.glob("*.yaml")):
        raw = read(path)
        aliases, paper = raw.get("aliases", []), raw.get("paper", {})
        if not isinstance(aliases, list) or not all(isinstance(a, str) and a for a in aliases):
            raise ManifestError(f"{path}: field 'aliases': must be a list of short names, such as [sa]")
        if not isinstance(paper, dict) or set(paper) - {"name", "order"} or not isinstance(paper.get("order", 0), int):
            raise ManifestError(f"{path}: field 'paper': must be {{name: <its name in the paper>, order: <a whole number>}}")
        found.append(Listed(path.stem, tuple(aliases), paper.get("name"), paper.get("order")))
    return tuple(found)


def aliases() -> dict[str, str]:
    """Every alias, and the manifest name it stands for; an alias two manifests claim is refused."""
    found: dict[str, str] = {}
    for entry in listed():
        for alias in entry.aliases:
            if found.setdefault(alias, entry.name) != entry.name:
                raise ManifestError(f"alias '{alias}' is claimed by both {found[alias]}.yaml and {entry.name}.yaml in {MANIFESTS}")
    return found


def paper_topologies() -> list[str]:
    """The manifests the experiments run, in the paper's order (`paper.order`)."""
    return [entry.name for entry in sorted((e for e in listed() if e.paper_order is not None), key=lambda e: e.paper_order)]


def paper_names() -> dict[str, str]:
    """What the paper calls each manifest that names it (CE, DR_3, ...)."""
    return {entry.name: entry.paper_name for entry in listed() if entry.paper_name}


def resolve(name_or_path: str) -> Path:
    """Find a manifest by path, by name in topologies/, or by alias."""
    candidate = Path(name_or_path)
    if candidate.suffix in (".yaml", ".yml") and candidate.exists():
        return candidate
    known_aliases = aliases()
    name = known_aliases.get(name_or_path, name_or_path)
    path = MANIFESTS / f"{name}.yaml"
    if not path.exists():
        known = [entry.name for entry in listed()]
        raise ManifestError(f"topology '{name_or_path}' is unknown: use one of {known}, an alias {sorted(known_aliases)}, or a path to a manifest")
    return path


def topology_folders() -> list[str]:
    """The topology folders of this repository: those at its root that hold a placement."""
    return sorted(path.parent.name for path in REPO.glob(f"*/{PLACEMENT}"))


def known_regions() -> set[str]:
    return set(json.loads(REFERENCE_DATA.read_text())["regions"])


def read(path: Path) -> dict:
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as error:
        raise ManifestError(f"{path}: not valid YAML: {error}") from error
    if not isinstance(raw, dict):
        raise ManifestError(f"{path}: a manifest is a mapping of fields, got {type(raw).__name__}")
    return raw


def check_fields(raw: dict, source: Path) -> None:
    """Refuses (ManifestError) a manifest its JSON Schema refuses (fields.py)."""
    if problem := fields.refusal(raw):
        raise ManifestError(f"{source}: {problem}")


def load(name_or_path: str, services: int | str | list | None = None, overrides: dict | None = None, engine: str | None = None) -> Topology:
    """Load a manifest; `services`, `overrides` and `engine` replace its fields.

    `services` is a count, a list of instances, or the path of another manifest whose
    services (and gateway region) to deploy in this manifest's topology. `engine` replaces
    engine.kind and keeps the manifest's other engine settings.
    """
    path = resolve(name_or_path)
    raw = {**read(path), **(overrides or {})}
    if engine:
        raw["engine"] = {**(raw.get("engine") or {}), "kind": engine}
    if isinstance(services, str) and not services.isdigit():
        source = Path(services)
        if not source.exists():
            raise ManifestError(f"services='{services}' is neither a count nor a manifest file")
        borrowed = read(source)
        check_fields(borrowed, source)
        if "services" not in borrowed:
            raise ManifestError(f"{source}: field 'services': missing; it is where the services are taken from")
        raw["name"] = f"{raw.get('name', path.stem)}-{source.stem}"
        raw.update({k: borrowed[k] for k in ("services", "steps", "gateway_region", "policy") if k in borrowed})
        services = None
    elif isinstance(services, str):
        services = int(services)
    return expand(raw, path, services)


def replica_ids(entry_id: str, replicas: int) -> list[str]:
    """The ids of the instances a service entry makes: its own id alone, or with `replicas: N`
    (N > 1) `<id>-1` ... `<id>-N`.

    Why this scheme: an instance's id is its name everywhere (its SPIFFE identity, its audit
    log `audit/<id>.jsonl`, its Kubernetes Deployment and Service, the `path` of an answer), so
    a replica's name should say whose replica it is and which one at a glance: `store-eu-2` is
    store-eu's second, numbered from 1 as the nodes (`node-1`) and router slots (`router-1`)
    are. It stays a DNS label (letters, digits, hyphens), which Kubernetes names need, and an
    entry that says `replicas: 1` keeps its id, so adding the field changes nothing deployed.
    A suffix can meet another entry's id (`store-eu-1` beside `store-eu` with 2 replicas):
    `expand` refuses that clash, naming both.
    """
    return [entry_id] if replicas == 1 else [f"{entry_id}-{n}" for n in range(1, replicas + 1)]


def expand(raw: dict, source: Path, services: int | list | None = None) -> Topology:
    def fail(field_name: str, problem: str) -> ManifestError:
        return ManifestError(f"{source}: field '{field_name}': {problem}")

    check_fields(raw, source)

    policy = raw.get("policy", "policies")
    if not isinstance(policy, str) or not policy:
        raise fail("policy", "must name a rule set: policies, one of rule-sets/, or a folder")

    # A topology folder of this repository by name, or any folder by its path from the manifest.
    kind = raw.get("topology")
    if not isinstance(kind, str) or not kind:
        raise fail("topology", f"is required: one of {topology_folders()}, or the path of a topology folder")
    folder = (source.parent / kind).resolve() if "/" in kind else REPO / kind
    if not (folder / PLACEMENT).is_file():
        raise fail("topology", f"'{kind}' is not one of {topology_folders()}, nor the path of a folder with a {PLACEMENT}")

    # Types and ranges of the fields are the schema's (fields.py, checked by load): what follows
    # checks what a schema cannot say (a folder, a region the reference data knows, ids).
    service_node_count = raw.get("nodes", {}).get("service", 3)
    gateway = Node("gateway", "gateway", "127.0.1.1")
    service_nodes = [Node(f"node-{n}", "service", f"127.0.1.{1 + n}") for n in range(1, service_node_count + 1)]

    routers_per_node = raw.get("routers_per_node", 1)

    engine = dict(raw.get("engine") or {})
    engine.setdefault("kind", "envoy-opa")
    # OPA's decision logs: off, or one JSON line per decision in the point's OPA log (masked:
    # no record body, no label token), which `python -m complyroute trace` reads.
    engine.setdefault("decision_logs", "off")
    workload = dict(raw.get("workload") or {})
    security = {**SECURITY_DEFAULTS, **(raw.get("security") or {})}
    if security["label_tokens"] and not security["mtls"]:
        raise fail("security.label_tokens", "needs security.mtls: a token proves labels only between authenticated parts")

    regions = known_regions()
    gateway_region = raw.get("gateway_region", "EU")
    if gateway_region not in regions:
        raise fail("gateway_region", f"'{gateway_region}' is not a known region {sorted(regions)}")

    spec = raw.get("services", 5) if services is None else services
    if isinstance(spec, bool) or not isinstance(spec, (int, list)):
        raise fail("services", "must be a count or a list of {id, step, region, certifications, purposes}")
    if isinstance(spec, int):
        if spec < 1:
            raise fail("services", f"must be at least 1, got {spec}")
        spec = [
            {
                "id": f"svc-{n:02d}",
                "step": f"step-{n:02d}",
                "region": gateway_region,
                "certifications": list(GENERATED_CERTIFICATIONS),
                "purposes": [GENERATED_PURPOSES[(n - 1) % len(GENERATED_PURPOSES)]],
            }
            for n in range(1, spec + 1)
        ]
    if not spec:
        raise fail("services", "the list is empty: a topology needs at least one service")

    instances: list[Instance] = []
    named_by: dict[str, str] = {}  # instance id -> the entry (and replica) that made it, for a clash's message
    steps: list[str] = []
    for position, entry in enumerate(spec):
        where = f"services[{position}]"
        if not isinstance(entry, dict):
            raise fail(where, "must be a mapping with id, step, region")
        for required in ("id", "step", "region"):
            if not isinstance(entry.get(required), str) or not entry[required]:
                raise fail(f"{where}.{required}", "is required and must be a non-empty string")
        if entry["region"] not in regions:
            raise fail(f"{where}.region", f"'{entry['region']}' is not a known region {sorted(regions)}")
        replicas = entry.get("replicas", 1)
        if isinstance(replicas, bool) or not isinstance(replicas, int) or not 1 <= replicas <= MAX_REPLICAS:
            raise fail(f"{where}.replicas", f"must be a whole number from 1 to {MAX_REPLICAS}, got {replicas!r}")
        node_name = entry.get("node")
        pinned = None
        if node_name is not None:
            matches = [n for n in service_nodes if n.name == node_name]
            if not matches:
                raise fail(f"{where}.node", f"'{node_name}' is not one of {[n.name for n in service_nodes]}")
            if replicas > 1:
                raise fail(f"{where}.node", f"pins one instance to a node, and replicas: {replicas} are spread over "
                                            f"the service nodes: drop node, or write the replicas as entries of their own")
            pinned = matches[0]
        for list_field in ("certifications", "purposes"):
            value = entry.get(list_field, [])
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise fail(f"{where}.{list_field}", "must be a list of strings")
        attributes = entry.get("attributes", {})
        if not isinstance(attributes, dict):
            raise fail(f"{where}.attributes", "must be a mapping of attribute name to a list of strings")
        for name, value in attributes.items():
            if not isinstance(name, str) or not ATTRIBUTE_NAME.fullmatch(name) or name in CATALOG_FIELDS:
                raise fail(f"{where}.attributes", f"{name!r} is not an attribute name (lowercase letters, digits, _; "
                                                  f"none of {', '.join(sorted(CATALOG_FIELDS))})")
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise fail(f"{where}.attributes.{name}", "must be a list of strings")
        for replica, instance_id in enumerate(replica_ids(entry["id"], replicas), start=1):
            if not INSTANCE_ID.fullmatch(instance_id):
                raise fail(f"{where}.id", f"'{instance_id}' is not an instance id: lowercase letters, digits and '-' (a DNS label, "
                                          "at most 63 characters, replicas' '-N' included), starting and ending with a letter or digit")
            if instance_id in named_by:
                field_name = "id" if replicas == 1 else "replicas"
                raise fail(f"{where}.{field_name}", f"'{instance_id}' is used twice: {named_by[instance_id]} is '{instance_id}' too")
            named_by[instance_id] = where if replicas == 1 else f"replica {replica} of {where} ({entry['id']}, replicas: {replicas})"
            instances.append(
                Instance(
                    id=instance_id,
                    step=entry["step"],
                    region=entry["region"],
                    # The k-th instance (replicas expanded, pinned ones counted) is on node k mod n: without
                    # pins the instances spread evenly, at most one apart, and one entry's replicas, one after
                    # the other, are on as many nodes as there are (two share one only when they outnumber them).
                    node=pinned or service_nodes[len(instances) % len(service_nodes)],
                    certifications=tuple(entry.get("certifications", [])),
                    purposes=tuple(entry.get("purposes", [])),
                    index=len(instances) + 1,
                    attributes=tuple(sorted((name, tuple(value)) for name, value in attributes.items())),
                )
            )
        if entry["step"] not in steps:
            steps.append(entry["step"])

    # An explicit `steps` list fixes the chain's order; otherwise it is the order of first use.
    if "steps" in raw:
        order = raw["steps"]
        if not isinstance(order, list) or not order or not all(isinstance(s, str) for s in order):
            raise fail("steps", "must be a non-empty list of step names")
        for step in order:
            if step not in steps:
                raise fail("steps", f"step '{step}' has no instance: add a service with step: {step}")
        for step in steps:
            if step not in order:
                raise fail("steps", f"step '{step}' of a service is not in the list {order}")
        steps = list(order)

    return Topology(
        name=raw.get("name", source.stem),
        kind=folder.name,
        source=source,
        folder=folder,
        gateway=gateway,
        service_nodes=service_nodes,
        gateway_region=gateway_region,
        instances=instances,
        steps=steps,
        routers_per_node=routers_per_node,
        engine=engine,
        workload=workload,
        security=security,
        policy=policy,
    )
