"""The local test cluster refuses to start over another one (runs without the k8s binaries)."""

import socket

import pytest

from complyroute.localcluster import APISERVER, LocalCluster, port_in_use


def test_start_refuses_when_a_control_plane_port_is_taken_denied(tmp_path):
    with socket.socket() as squatter:
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        squatter.bind(("127.0.0.1", APISERVER))
        squatter.listen()
        cluster = LocalCluster(tmp_path / "cluster")
        with pytest.raises(RuntimeError, match=f"ports in use: {APISERVER} \\(kube-apiserver\\)"):
            cluster.start()
    assert cluster.processes == {} and not (tmp_path / "cluster").exists()  # nothing started, nothing written


def test_port_in_use_sees_a_free_port_allowed():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        free = probe.getsockname()[1]
    assert not port_in_use(free)
