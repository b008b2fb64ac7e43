"""Unit tests of the local deployment's bookkeeping (no process is started)."""

import pytest

from complyroute import deployment


def test_new_run_dir_same_second_allowed(tmp_path, monkeypatch):
    monkeypatch.setattr(deployment, "RUNS", tmp_path / "runs")
    first = deployment.new_run_dir("central-entity-5-20261122-053000")
    second = deployment.new_run_dir("central-entity-5-20261122-053000")
    assert first.name == "central-entity-5-20261122-053000"
    assert second.name == "central-entity-5-20261122-053000-2"
    assert first.is_dir() and second.is_dir()


def test_new_run_dir_exhausted_denied(tmp_path, monkeypatch):
    monkeypatch.setattr(deployment, "RUNS", tmp_path)
    (tmp_path / "x").mkdir()
    for attempt in range(2, 1000):
        (tmp_path / f"x-{attempt}").mkdir()
    with pytest.raises(deployment.DeploymentError, match="no free run folder name"):
        deployment.new_run_dir("x")


def supervised_parts(tmp_path):
    logs = tmp_path / "logs"
    return [
        deployment.Part("entry/opa", "opa", "gateway", ["/bin/opa", "run", "--addr", "127.0.0.1:1"], {}, "http://x/health", str(logs / "entry.opa.log")),
        deployment.Part("svc-01", "service", "node-1", ["node", "server.js"], {"CATALOG": 'a,b "c" 100%', "PORT": "1"},
                        "http://x/health", str(logs / "svc-01.log")),
    ]


def test_supervisor_config_restarts_parts_on_a_private_socket_allowed(tmp_path):
    import configparser
    import shlex

    config = deployment.supervisor_config(tmp_path, supervised_parts(tmp_path), tmp_path / "supervisor.sock")
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
    config = deployment.supervisor_config(tmp_path, supervised_parts(tmp_path), tmp_path / "supervisor.sock", restart=False)
    assert "autorestart=true" not in config and config.count("autorestart=false") == 2 and "startretries=0" in config


def test_socket_path_too_long_for_a_unix_socket_moves_to_a_private_folder_allowed(tmp_path):
    import stat

    long_dir = tmp_path / ("x" * 120)
    path = deployment.socket_path(long_dir)
    assert len(str(path)) < 100 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    path.parent.rmdir()
