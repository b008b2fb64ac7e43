"""Start, inspect and stop a topology as processes on this machine.

This module holds a deployment's life: its run folder and state.json, deploy, status, undeploy.
What each part runs is rendering.py's; how supervisord runs them, supervision.py's.

Everything one deployment writes goes to one run folder, runs/<name>-<time>/: the rendered
configurations, every part's log, the instances' audit logs, and state.json, which lists the
processes started so that `status` and `undeploy` find them. runs/current points at the
running deployment; only one runs at a time under one runs/. COMPLYROUTE_RUNS names another
root than runs/, and COMPLYROUTE_LOOPBACK another loopback network than 127.0.0.1 and 127.0.1.x
(LocalNetwork): with both, a second deployment runs beside the first (make test runs the
experiments' end-to-end tests so, beside the other end-to-end tests' deployments).

Every part runs under one supervisord (the `supervisor` package) per deployment, whose
configuration the control plane renders into the run folder: a part that dies is started
again (within about a second; supervisord notices an exit on its next one-second tick), and
`status` shows how often each part was restarted. Its control interface is a unix socket in the
run folder that only the deployment's user can open; it listens on no port.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import sys
import tempfile
import time
import xmlrpc.client
from pathlib import Path

import psutil

from complyroute.policy.ruleset import RuleSet
from complyroute.runtime.local import heldnetworks, scrape, warmup
from complyroute.runtime.local.rendering import PKI, SERVICE_BUNDLE, SERVICE_BUNDLE_INPUTS, render
from complyroute.runtime.local.supervision import (GROUP, STOP_GRACE_SECONDS, DeploymentError, alive, healthy, programs_info, refresh_pids,
                                                  restarts, start_supervisor, supervisor, tail)
from complyroute.runtime.target import runs_root
from complyroute.topology.manifest import REPO, Topology
from complyroute.topology.plan import LocalNetwork, place


def current_link() -> Path:
    """The link to the running deployment's run folder."""
    return runs_root() / "current"


def stop_part(name: str, state: dict | None = None) -> None:
    """Stop one part and keep it down (supervisord does not restart a part it was told to stop)."""
    state = state or read_state()
    supervisor(state).supervisor.stopProcess(f"{GROUP}:{state['supervisor']['programs'][name]}", True)


def start_part(name: str, state: dict | None = None) -> None:
    """Start a part stopped by stop_part again."""
    state = state or read_state()
    supervisor(state).supervisor.startProcess(f"{GROUP}:{state['supervisor']['programs'][name]}", True)


def signal_part(name: str, signal_name: str, state: dict | None = None) -> None:
    """Send a running part a signal ("HUP": a service reads its labels again) through supervisord."""
    state = state or read_state()
    supervisor(state).supervisor.signalProcess(f"{GROUP}:{state['supervisor']['programs'][name]}", signal_name)


def read_state(run_dir: Path | None = None) -> dict | None:
    state_file = (run_dir or current_link()) / "state.json"
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
    return state if state and processes_using(state["run_dir"]) else None


def new_run_dir(name: str) -> Path:
    """A fresh folder under runs/: deployments started in the same second get -2, -3, ..."""
    runs_root().mkdir(parents=True, exist_ok=True)
    for attempt in range(1, 1000):
        run_dir = runs_root() / (name if attempt == 1 else f"{name}-{attempt}")
        try:
            run_dir.mkdir()
            return run_dir
        except FileExistsError:
            continue
    raise DeploymentError(f"no free run folder name for {name} under {runs_root()}")


def refuse_a_stale_service_bundle(bundle: Path = SERVICE_BUNDLE, inputs: Path = SERVICE_BUNDLE_INPUTS, root: Path = REPO) -> None:
    """Refuses (DeploymentError) to deploy without the service bundle every instance runs
    (rendering.py SERVICE_BUNDLE) or with one older than a file it was made of (`inputs`, the
    bundler's list of them, paths from `root`): its instances would run what the sources no
    longer say."""
    if not bundle.exists() or not inputs.exists():
        raise DeploymentError(f"{bundle} is missing: run make setup, which bundles the service")
    made = bundle.stat().st_mtime
    changed = [name for name in json.loads(inputs.read_text())["inputs"]
               if not (root / name).exists() or (root / name).stat().st_mtime > made]
    if changed:
        raise DeploymentError(f"{bundle} is older than {', '.join(changed[:3])}{' and others' if len(changed) > 3 else ''} (or "
                              "they are gone): run make setup to bundle the service again")


def deploy(topology: Topology, rule_set: RuleSet, health_timeout: float | None = None, out=sys.stdout,
           restart: bool = True) -> dict:
    """Start every part of the topology under supervisord and wait until each answers its health check.

    `rule_set` is what every enforcement point decides with, made where it was chosen (the command
    line: the manifest's `policy` unless another is given; a test: a modified copy).
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
    try:
        heldnetworks.refuse_if_held(LocalNetwork().loopback)
    except heldnetworks.NetworkHeld as error:
        raise DeploymentError(str(error)) from None
    refuse_a_stale_service_bundle()

    started = time.monotonic()
    run_dir = new_run_dir(f"{topology.name}-{len(topology.instances)}-{time.strftime('%Y%m%d-%H%M%S')}")
    # The points' private folders (their sockets) under one of this deployment's own, mode
    # 0700, at a short path: a socket's path has at most 107 bytes, and a run folder's can be
    # longer. Removed by undeploy.
    private = Path(tempfile.mkdtemp(prefix="complyroute-"))
    try:
        network = LocalNetwork(private, logs=run_dir / "logs")
        plan = place(topology, network)
        parts, deployed = render(plan, run_dir, rule_set)
    except BaseException:
        shutil.rmtree(private, ignore_errors=True)
        raise
    # The credentials are the run's under mutual TLS (render wrote them), the scraper's among them.
    scrape_config = scrape.write(run_dir, plan, run_dir / PKI if deployed.point_trust else None)
    state = {
        "topology": topology.name,
        "kind": topology.kind,
        # Whether any point decides a hop: a deployment that does not (the baseline) lets every record through.
        "enforces": plan.enforces,
        "engine": topology.engine["kind"],
        "decision_logs": topology.engine.get("decision_logs", "off"),
        "manifest": str(topology.source),
        "services": len(topology.instances),
        "run_dir": str(run_dir),
        "private": str(private),
        "entry_url": f"{plan.entry.url}/process",
        "scrape_config": str(scrape_config),
        # The rule set's revision the points decide with (reload.py updates it).
        "revision": deployed.revision,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        # Which point decides the hops of which sender: what a reader (or a test) needs to
        # know which records a failing point affects.
        "points": [
            {"name": p.name, "node": p.node, "senders": [d.sender for d in p.deciding], "destinations": sorted(p.destinations)}
            for p in plan.points
        ],
        "parts": [part.to_json(0) for part in parts],
    }
    if current_link().is_symlink() or current_link().exists():
        current_link().unlink()
    current_link().symlink_to(run_dir.name)

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

    # Healthy is not yet deciding: every deciding listener decides a warm-up record first (warmup.py).
    listeners = warmup.listeners(plan, deployed.point_trust, run_dir)
    try:
        state["warm_up"] = warmup.wait(listeners, warmup.token_key(run_dir, plan), deployed.revision, timeout, point_logs(state))
    except warmup.WarmUpError as error:
        stop(out=open(os.devnull, "w"))
        raise DeploymentError(f"deploy: {error}") from None
    if listeners:
        print(f"deploy: {len(listeners)} deciding listeners decided a warm-up record in {state['warm_up']['seconds']} s", file=out)
    state["bring_up_seconds"] = round(time.monotonic() - started, 2)
    state["memory_mib"] = memory(state)
    write_state(run_dir, state)
    print(f"deploy: {len(parts)} processes healthy in {state['bring_up_seconds']} s", file=out)
    print(f"deploy: memory (PSS) {describe_memory(state['memory_mib'])}", file=out)
    for line in node_lines(topology, network, state["parts"]):
        print(line, file=out)
    print(f"deploy: Prometheus scrape configuration {scrape_config} (every point's metrics listener, every service's /metrics)", file=out)
    print(f"deploy: entry {state['entry_url']}   run folder {run_dir}   supervisord pid {state['supervisor']['pid']}", file=out)
    return state


def point_logs(state: dict) -> dict[str, list[str]]:
    """Each enforcement point's parts' logs (its OPA's and its Envoy's), by point name."""
    logs: dict[str, list[str]] = {}
    for part in state["parts"]:
        if part["kind"] in ("opa", "envoy"):
            logs.setdefault(part["name"].split("/", 1)[0], []).append(part["log"])
    return logs


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


def node_lines(topology: Topology, network: LocalNetwork, parts: list[dict]) -> list[str]:
    """Each node, the address its parts listen on in the plan's network (COMPLYROUTE_LOOPBACK
    moves it off the manifest's) and how many of `parts` (the state's) run there."""
    return [f"  {node.name} ({network.address(node)}): {sum(part['node'] == node.name for part in parts)} processes"
            for node in [topology.gateway, *topology.service_nodes]]


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
    """Processes whose command line names the run folder, or whose AUDIT_LOG is in it: every
    process of the deployment (supervisord, by its configuration's path; each part), whatever
    state.json says. The only processes stop() signals: a pid state.json recorded may since have
    ended and been given to another process, even another deployment's or the bench's."""
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
    # interrupted deploy) as before. Asked over its socket rather than by a signal, and asked
    # again while it winds down: its main loop takes a signal, or sees a part gone, only at its
    # next turn, up to a second later, and a request starts a turn at once (a second of every
    # undeploy, 50 s of make test's).
    run_dir = state["run_dir"]
    pids = set(processes_using(run_dir))
    if sup.get("pid") in pids:
        try:
            supervisor(state).supervisor.shutdown()
        except (OSError, xmlrpc.client.Error):
            try:
                os.kill(sup["pid"], signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + STOP_GRACE_SECONDS + 5
        while time.monotonic() < deadline and alive(sup["pid"]):
            time.sleep(0.05)
            with contextlib.suppress(OSError, xmlrpc.client.Error):
                supervisor(state).supervisor.getState()
    for pid in processes_using(run_dir):
        try:
            os.killpg(pid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and processes_using(run_dir):
        time.sleep(0.1)
    for pid in processes_using(run_dir):
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    left = processes_using(run_dir)
    if left:
        raise DeploymentError(f"undeploy: processes {left} did not stop; kill them by hand")
    if current_link().is_symlink():
        current_link().unlink()
    if sup.get("socket") and Path(sup["socket"]).parent != Path(state["run_dir"]):
        shutil.rmtree(Path(sup["socket"]).parent, ignore_errors=True)  # the private folder of a long path's socket
    if state.get("private"):
        shutil.rmtree(state["private"], ignore_errors=True)  # the points' sockets
    print(f"undeploy: stopped {len(pids)} processes of {state['topology']}; logs kept in {state['run_dir']}", file=out)
    return len(pids)
