"""One supervisord per deployment runs its parts (the `supervisor` package): its configuration,
rendered into the run folder, starts every part and starts again one that dies; its control
interface is a unix socket in the run folder. And how the control plane tells a part is up:
its health check (healthy), its process (alive)."""


from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import xmlrpc.client
from pathlib import Path

import psutil

from complyroute.runtime.local.rendering import Part
from complyroute.topology import localhttp
from complyroute.topology.manifest import REPO
from complyroute.trust import identity

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
        if info:
            # 0 for a part supervisord no longer runs (stopped, exited): the pid it had may since
            # be any other process's (pid_max is 32768 on these machines; make test starts thousands).
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


def health_answer(url: str, timeout: float = 1.0, tls: identity.TlsFiles | dict | None = None) -> dict | None:
    """The JSON a service's health check answers 200 with (services/src/routes.js: its labels' digest
    too); None when it does not."""
    try:
        with urllib.request.urlopen(url, timeout=timeout, context=control_context(tls) if tls else None) as answer:
            return json.loads(answer.read()) if answer.status == 200 else None
    except (urllib.error.URLError, OSError, ValueError):
        return None


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


def tail(path: str, lines: int = 20) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log written)"
