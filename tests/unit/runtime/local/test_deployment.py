"""Unit tests of the local deployment's bookkeeping (no part is started; a few idle children are)."""

import contextlib
import io
import json
import os
import subprocess
import sys
import time

import psutil
import pytest

from complyroute.runtime.local import deployment, rendering, supervision


def test_new_run_dir_same_second_allowed(tmp_path, monkeypatch):
    monkeypatch.setenv("COMPLYROUTE_RUNS", str(tmp_path / "runs"))
    first = deployment.new_run_dir("central-entity-5-20261122-053000")
    second = deployment.new_run_dir("central-entity-5-20261122-053000")
    assert first.name == "central-entity-5-20261122-053000"
    assert second.name == "central-entity-5-20261122-053000-2"
    assert first.is_dir() and second.is_dir()


def test_new_run_dir_exhausted_denied(tmp_path, monkeypatch):
    monkeypatch.setenv("COMPLYROUTE_RUNS", str(tmp_path))
    (tmp_path / "x").mkdir()
    for attempt in range(2, 1000):
        (tmp_path / f"x-{attempt}").mkdir()
    with pytest.raises(supervision.DeploymentError, match="no free run folder name"):
        deployment.new_run_dir("x")


def bundled(root):
    """A service's sources under `root`, and a bundle made of them with the bundler's list of its inputs."""
    sources = ["services/server.js", "services/src/routes.js", "services/node_modules/fastify/fastify.js"]
    for name in sources:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("export {}\n")
    inputs, bundle = root / "server.inputs.json", root / "server.mjs"
    inputs.write_text(json.dumps({"inputs": {name: {"bytes": 10} for name in sources}}))
    bundle.write_text("// bundled\n")
    return bundle, inputs


def test_a_bundle_newer_than_every_file_it_was_made_of_is_deployed_allowed(tmp_path):
    bundle, inputs = bundled(tmp_path)
    deployment.refuse_a_stale_service_bundle(bundle, inputs, tmp_path)


@pytest.mark.parametrize("changed", ["services/src/routes.js", "services/node_modules/fastify/fastify.js"])
def test_a_bundle_older_than_a_file_it_was_made_of_gone_or_never_made_is_refused_denied(tmp_path, changed):
    bundle, inputs = bundled(tmp_path)
    later = bundle.stat().st_mtime + 1
    os.utime(tmp_path / changed, (later, later))
    with pytest.raises(supervision.DeploymentError, match=rf"server.mjs is older than {changed} .*: run make setup"):
        deployment.refuse_a_stale_service_bundle(bundle, inputs, tmp_path)
    (tmp_path / changed).unlink()
    with pytest.raises(supervision.DeploymentError, match=rf"server.mjs is older than {changed} \(or they are gone\)"):
        deployment.refuse_a_stale_service_bundle(bundle, inputs, tmp_path)
    bundle.unlink()
    with pytest.raises(supervision.DeploymentError, match="server.mjs is missing: run make setup"):
        deployment.refuse_a_stale_service_bundle(bundle, inputs, tmp_path)


def supervised_parts(tmp_path):
    logs = tmp_path / "logs"
    return [
        rendering.Part("entry/opa", "opa", "gateway", ["/bin/opa", "run", "--addr", "127.0.0.1:1"], {}, "http://x/health", str(logs / "entry.opa.log")),
        rendering.Part("svc-01", "service", "node-1", ["node", "server.js"], {"CATALOG": 'a,b "c" 100%', "PORT": "1"},
                        "http://x/health", str(logs / "svc-01.log")),
    ]


def test_supervisor_config_restarts_parts_on_a_private_socket_allowed(tmp_path):
    import configparser
    import shlex

    config = supervision.supervisor_config(tmp_path, supervised_parts(tmp_path), tmp_path / "supervisor.sock")
    parsed = configparser.RawConfigParser()
    parsed.read_string(config)
    assert parsed["unix_http_server"]["chmod"] == "0700"
    assert "inet_http_server" not in parsed  # no port
    assert parsed["group:deployment"]["programs"] == "entry_opa,svc-01"
    service = parsed["program:svc-01"]
    assert service["autorestart"] == "true" and service["startretries"] == "3" and service["stopasgroup"] == "true"
    assert service["stdout_logfile"] == str(tmp_path / "logs" / "svc-01.log") and service["redirect_stderr"] == "true"
    # env(1) carries each value as it is; supervisord expands %(...)s, so a % is doubled.
    argv = shlex.split(service["command"].replace("%%", "%"))
    assert argv[1:] == ['CATALOG=a,b "c" 100%', "PORT=1", "node", "server.js"]


def test_supervisor_config_without_restarts_leaves_dead_parts_down_denied(tmp_path):
    config = supervision.supervisor_config(tmp_path, supervised_parts(tmp_path), tmp_path / "supervisor.sock", restart=False)
    assert "autorestart=true" not in config and config.count("autorestart=false") == 2 and "startretries=0" in config


def test_socket_path_too_long_for_a_unix_socket_moves_to_a_private_folder_allowed(tmp_path):
    import stat

    long_dir = tmp_path / ("x" * 120)
    path = supervision.socket_path(long_dir)
    assert len(str(path)) < 100 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    path.parent.rmdir()


# ---- processes, as psutil sees them (the deployment's own bookkeeping: alive, memory, what is left behind)
def sleeper(tmp_path, *args, env=None, own_group=False):
    """A child that does nothing for a minute; `args` end up in its command line; `own_group`:
    the leader of a process group of its own, as every part and the bench's parts are. Returned
    once /proc shows its command line: Popen returns when the exec has begun, and the kernel
    fills in the new program's command line and environment a moment later, a moment a loaded
    machine can stretch (make test at load 30 read one sleeper's environment empty)."""
    command = [sys.executable, "-c", "import time, sys; time.sleep(60)", *args]
    child = subprocess.Popen(command, env=env, start_new_session=own_group)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with contextlib.suppress(psutil.Error):
            if psutil.Process(child.pid).cmdline() == command:
                break
        time.sleep(0.01)
    return child


def test_alive_while_a_process_runs_allowed(tmp_path):
    child = sleeper(tmp_path)
    try:
        assert supervision.alive(child.pid)
    finally:
        child.kill()
        child.wait()


def test_alive_is_false_for_a_zombie_which_it_reaps_and_for_no_process_denied(tmp_path):
    child = sleeper(tmp_path)
    child.kill()
    deadline = time.monotonic() + 10
    while psutil.Process(child.pid).status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:
        time.sleep(0.01)
    assert psutil.Process(child.pid).status() == psutil.STATUS_ZOMBIE  # exited, not yet reaped
    assert not supervision.alive(child.pid)
    assert not psutil.pid_exists(child.pid) or psutil.Process(child.pid).status() != psutil.STATUS_ZOMBIE  # reaped
    assert not supervision.alive(0) and not supervision.alive(2**22 + 1)  # never started; no such pid


def test_processes_using_a_run_folder_finds_them_by_command_line_or_audit_log_allowed(tmp_path):
    run_dir = str(tmp_path / "runs" / "sidecar-5")
    by_command = sleeper(tmp_path, f"--config={run_dir}/envoy.json")
    by_audit_log = sleeper(tmp_path, env={**os.environ, "AUDIT_LOG": f"{run_dir}/audit/svc-01.jsonl"})
    try:
        assert sorted(deployment.processes_using(run_dir)) == sorted([by_command.pid, by_audit_log.pid])
    finally:
        for child in (by_command, by_audit_log):
            child.kill()
            child.wait()
    assert deployment.processes_using(run_dir) == []


def test_processes_using_a_run_folder_leaves_other_runs_processes_denied(tmp_path):
    run_dir = str(tmp_path / "runs" / "sidecar-5")
    other = [sleeper(tmp_path, f"--config={run_dir}-2/envoy.json"),  # another run folder whose name starts alike
             sleeper(tmp_path, env={**os.environ, "AUDIT_LOG": f"{run_dir}-2/audit/svc-01.jsonl"}),
             sleeper(tmp_path, env={**os.environ, "NOT_AUDIT_LOG": f"{run_dir}/audit/svc-01.jsonl"})]
    try:
        assert deployment.processes_using(run_dir) == []
    finally:
        for child in other:
            child.kill()
            child.wait()


def stopping(tmp_path, monkeypatch, recorded_pid: int) -> int:
    """deployment.stop() of a run whose state.json records `recorded_pid` as a part's and as
    supervisord's (which answers on no socket); how many processes it stopped."""
    runs = tmp_path / "runs"
    run_dir = runs / "sidecar-5"
    run_dir.mkdir(parents=True)
    monkeypatch.setenv("COMPLYROUTE_RUNS", str(runs))
    deployment.write_state(run_dir, {"topology": "sidecar", "run_dir": str(run_dir), "supervisor": {"pid": recorded_pid, "socket": str(run_dir / "supervisor.sock")},
                                     "parts": [{"name": "svc-01", "pid": recorded_pid}]})
    deployment.current_link().symlink_to(run_dir)
    return deployment.stop(out=io.StringIO(), grace=5)


def test_stop_ends_the_processes_naming_the_run_folder_allowed(tmp_path, monkeypatch):
    part = sleeper(tmp_path, f"--config={tmp_path}/runs/sidecar-5/envoy.json", own_group=True)
    try:
        assert deployment.running() is None  # nothing deployed yet
        stopped = stopping(tmp_path, monkeypatch, part.pid)
        assert stopped == 1 and not supervision.alive(part.pid)  # ended and reaped (by stop(), as its child)
        assert deployment.running() is None and not deployment.current_link().exists()
    finally:
        part.kill()
        part.wait()


def test_stop_leaves_a_process_given_a_pid_the_state_recorded_denied(tmp_path, monkeypatch):
    # A part that exited (stopped by a test, not restarted) keeps its pid in state.json; Linux
    # gives that pid to another process once its numbers wrap (pid_max 32768 here), and
    # killing that process's group would kill, say, another deployment's part or the bench's Envoy.
    stranger = sleeper(tmp_path, own_group=True)
    try:
        stopped = stopping(tmp_path, monkeypatch, stranger.pid)
        assert stopped == 0 and stranger.poll() is None
    finally:
        stranger.kill()
        stranger.wait()


def test_memory_sums_each_kinds_proportional_set_size_allowed(tmp_path):
    # Read once Python runs in the child: just after exec its pages are not faulted in yet (PSS about 0).
    child = subprocess.Popen([sys.executable, "-c", "import time; print('up', flush=True); time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "up\n"
        state = {"parts": [{"pid": child.pid, "kind": "service"}, {"pid": os.getpid(), "kind": "opa"}, {"pid": child.pid, "kind": "opa"}]}
        mib = deployment.memory(state)
        own = psutil.Process().memory_full_info().pss / 2**20
        assert set(mib) == {"service", "opa", "total"} and 0 < mib["service"] < mib["opa"]
        assert mib["opa"] == pytest.approx(own + mib["service"], rel=0.2)
        assert mib["total"] == pytest.approx(mib["service"] + mib["opa"], abs=0.2)
    finally:
        child.kill()
        child.wait()


def test_memory_leaves_out_parts_that_are_gone_or_never_started_denied(tmp_path):
    child = sleeper(tmp_path)
    child.kill()
    child.wait()
    assert deployment.memory({"parts": [{"pid": child.pid, "kind": "service"}, {"pid": 0, "kind": "envoy"}]}) == {"total": 0}


def test_deploy_names_each_node_by_the_address_of_the_plans_network_allowed(monkeypatch):
    """The nodes' addresses a deploy prints are where its parts listen: moved by COMPLYROUTE_LOOPBACK
    (LocalNetwork's loopback) off the manifest's 127.0.1.x, which it prints only when nothing moves them."""
    from complyroute.topology import manifest
    from complyroute.topology.plan import LocalNetwork

    topology = manifest.load("sidecar", services=3)
    parts = [{"node": "gateway"}, {"node": "node-1"}, {"node": "node-1"}]
    moved = deployment.node_lines(topology, LocalNetwork(loopback="127.0.5"), parts)
    assert moved[:2] == ["  gateway (127.0.5.1): 1 processes", "  node-1 (127.0.5.2): 2 processes"]
    assert all("127.0.1." not in line for line in moved)
    monkeypatch.delenv("COMPLYROUTE_LOOPBACK", raising=False)
    assert deployment.node_lines(topology, LocalNetwork(), parts)[0] == "  gateway (127.0.1.1): 1 processes"
