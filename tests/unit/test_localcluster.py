"""The local test cluster (tests/k8s/harness/localcluster.py) refuses to start over another one: a unit
test of the k8s tier's harness, which needs none of the k8s binaries."""

import socket

import pytest

from tests.k8s.harness import localcluster
from tests.k8s.harness.localcluster import LocalCluster, port_in_use


def test_start_refuses_when_a_control_plane_port_is_taken_denied(tmp_path, monkeypatch):
    with socket.socket() as squatter:
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        squatter.bind(("127.0.0.1", 0))  # a port of its own: the real ones may be a running cluster's (make k8s-e2e)
        squatter.listen()
        taken = squatter.getsockname()[1]
        monkeypatch.setattr(localcluster, "PORTS", {"kube-apiserver": taken})
        cluster = LocalCluster(tmp_path / "cluster")
        with pytest.raises(RuntimeError, match=f"ports in use: {taken} \\(kube-apiserver\\)"):
            cluster.start()
    assert cluster.processes == {} and not (tmp_path / "cluster").exists()  # nothing started, nothing written


def test_port_in_use_sees_a_free_port_allowed():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        free = probe.getsockname()[1]
    assert not port_in_use(free)


def test_a_real_node_names_what_it_lacks_before_starting_anything_denied(tmp_path, monkeypatch):
    from complyroute.runtime.kubernetes import images
    from tests.k8s.harness import realnode

    monkeypatch.setattr(realnode, "BIN", tmp_path / "bin")
    monkeypatch.setattr(images, "IMAGES_DIR", tmp_path / "images")
    monkeypatch.setattr(localcluster, "port_in_use", lambda port: False)  # a running cluster's (make k8s-e2e) is no matter here
    cluster = LocalCluster(tmp_path / "cluster", real_node=True)
    with pytest.raises(RuntimeError, match=r"make k8s-setup|make images|needs root") as refused:
        cluster.start()
    assert "kubelet" in str(refused.value) or "root" in str(refused.value) or "image" in str(refused.value)
    assert cluster.processes == {} and not (tmp_path / "cluster").exists()


def test_a_real_node_is_reached_through_the_host_end_of_its_veth_allowed(tmp_path):
    from tests.k8s.harness import realnode

    cluster = LocalCluster(tmp_path / "cluster", real_node=True)
    assert cluster.apiserver_host == realnode.HOST_IP and LocalCluster(tmp_path / "other").apiserver_host == "127.0.0.1"
