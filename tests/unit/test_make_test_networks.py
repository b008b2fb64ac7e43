"""make test's loopback networks (tests/loopbacks.py): free of sockets, held against a second make
test for as long as the command it runs, and refused when too few are free; a deployment started
by hand on one it holds is refused (complyroute/runtime/local/heldnetworks.py)."""

import fcntl
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from complyroute.policy.ruleset import RuleSet
from complyroute.runtime.local import deployment, heldnetworks
from complyroute.topology import manifest
from complyroute.topology.plan import LOOPBACK_VARIABLE

from tests import loopbacks

REPO = Path(__file__).resolve().parents[2]
# Two networks the machine's other users are unlikely to hold while the test runs.
FIRST, SECOND = "127.0.251", "127.0.252"


def test_a_network_no_socket_is_bound_on_is_taken_allowed(tmp_path):
    [(network, descriptor)] = loopbacks.reserve(1, tmp_path, candidates=[FIRST], in_use=set())
    try:
        assert network == FIRST
    finally:
        os.close(descriptor)


def test_a_network_a_socket_is_bound_on_is_passed_over_denied(tmp_path):
    with socket.socket() as taken:
        taken.bind((f"{FIRST}.1", 0))
        taken.listen()
        assert FIRST in loopbacks.networks_in_use()
        [(network, descriptor)] = loopbacks.reserve(1, tmp_path, candidates=[FIRST, SECOND])
    os.close(descriptor)
    assert network == SECOND


def test_a_network_another_make_test_holds_is_passed_over_denied(tmp_path):
    held = os.open(loopbacks.lock_path(FIRST, tmp_path), os.O_RDWR | os.O_CREAT)
    fcntl.flock(held, fcntl.LOCK_EX)
    try:
        [(network, descriptor)] = loopbacks.reserve(1, tmp_path, candidates=[FIRST, SECOND], in_use=set())
        os.close(descriptor)
        assert network == SECOND
        with pytest.raises(loopbacks.NoFreeNetwork, match="only 1 of the 2 loopback networks make test needs are free"):
            loopbacks.reserve(2, tmp_path, candidates=[FIRST, SECOND], in_use=set())
    finally:
        os.close(held)
    # What a refusal had taken, it let go of: both are free again.
    taken = loopbacks.reserve(2, tmp_path, candidates=[FIRST, SECOND], in_use=set())
    assert sorted(network for network, _ in taken) == [FIRST, SECOND]
    for _, descriptor in taken:
        os.close(descriptor)


def test_a_deployment_on_a_network_another_make_test_holds_is_refused_denied(tmp_path):
    held = os.open(loopbacks.lock_path(FIRST, tmp_path), os.O_RDWR | os.O_CREAT)
    fcntl.flock(held, fcntl.LOCK_EX)
    try:
        with pytest.raises(heldnetworks.NetworkHeld, match=f"loopback network {FIRST} is held by a running make test"):
            heldnetworks.refuse_if_held(FIRST, tmp_path, environ={})
        # make test's own deployments run with the networks it holds named.
        heldnetworks.refuse_if_held(FIRST, tmp_path, environ={heldnetworks.HELD_VARIABLE: f"{SECOND} {FIRST}"})
    finally:
        os.close(held)
    heldnetworks.refuse_if_held(FIRST, tmp_path, environ={})  # let go of: free again


def test_a_deployment_on_a_network_no_make_test_holds_is_allowed(tmp_path):
    heldnetworks.refuse_if_held(SECOND, tmp_path, environ={})  # never held: no lock file, and none made
    assert not loopbacks.lock_path(SECOND, tmp_path).exists()
    heldnetworks.refuse_if_held(None, tmp_path, environ={})  # the default addresses, which make test never takes


def test_deploy_refuses_a_network_another_make_test_holds_before_it_writes_anything_denied(tmp_path, monkeypatch):
    monkeypatch.setattr(heldnetworks.tempfile, "tempdir", str(tmp_path))
    monkeypatch.setenv(LOOPBACK_VARIABLE, FIRST)
    monkeypatch.delenv(heldnetworks.HELD_VARIABLE, raising=False)
    held = os.open(loopbacks.lock_path(FIRST), os.O_RDWR | os.O_CREAT)
    fcntl.flock(held, fcntl.LOCK_EX)
    try:
        with pytest.raises(deployment.DeploymentError, match=f"loopback network {FIRST} is held by a running make test"):
            deployment.deploy(manifest.load("central-entity", services=5), RuleSet.of("policies"))
    finally:
        os.close(held)
    assert not list(deployment.runs_root().glob("central-entity-*"))  # no run folder begun


def test_the_sockets_table_is_read_as_networks(tmp_path):
    table = tmp_path / "tcp"
    table.write_text("  sl  local_address rem_address   st\n"
                     "   0: 0100007F:1F90 00000000:0000 0A\n"  # 127.0.0.1:8080
                     "   1: 0106007F:4E20 00000000:0000 0A\n")  # 127.0.6.1:20000
    assert loopbacks.networks_in_use((str(table), str(tmp_path / "absent"))) == {"127.0.0", "127.0.6"}


def test_the_command_runs_with_the_networks_held_until_it_ends_allowed(tmp_path):
    # The command tries each network's lock itself: held (by the descriptor it inherited).
    probe = ("import fcntl, os, sys\n"
             "from tests import loopbacks\n"
             "networks = os.environ['TEST_LOOPBACKS'].split()\n"
             "for network in networks:\n"
             "    descriptor = os.open(loopbacks.lock_path(network), os.O_RDWR)\n"
             "    try:\n"
             "        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)\n"
             "        sys.exit('not held: ' + network)\n"
             "    except BlockingIOError:\n"
             "        pass\n"
             "print(' '.join(networks))\n")
    environment = {**os.environ, "TMPDIR": str(tmp_path), "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-m", "tests.loopbacks", "2", "--", sys.executable, "-c", probe],
                          cwd=REPO, env=environment, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    networks = done.stdout.split()
    assert len(set(networks)) == 2 and all(network in loopbacks.CANDIDATES for network in networks)
    # Its end let go of them.
    taken = loopbacks.reserve(2, tmp_path, candidates=networks, in_use=set())
    for _, descriptor in taken:
        os.close(descriptor)


def test_a_command_line_without_the_separator_is_refused_denied(capsys):
    assert loopbacks.main(["2", "make"]) == 2
    assert "usage: python -m tests.loopbacks N -- COMMAND" in capsys.readouterr().err
