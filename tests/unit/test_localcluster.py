"""The local test cluster (tests/k8s/harness/localcluster.py) refuses to start over another one: a unit
test of the k8s tier's harness, which needs none of the k8s binaries."""

import socket

import pytest

from complyroute.runtime.kubernetes import images
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


def a_killed_real_node(tmp_path, monkeypatch, pids: str = ""):
    """What a real node's test process, killed mid-run, leaves: its cgroup (with `pids` in it) and
    containerd's /run folder with the socket no one listens on; clean() recorded, not run."""
    from tests.k8s.harness import realnode

    cgroup = tmp_path / "cgroup" / "pids" / realnode.CGROUP
    cgroup.mkdir(parents=True)
    (cgroup / "cgroup.procs").write_text(pids)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "containerd.sock").touch()
    monkeypatch.setattr(realnode, "CGROUP_ROOT", tmp_path / "cgroup")
    monkeypatch.setattr(realnode, "RUN", tmp_path / "run")
    monkeypatch.setattr(realnode, "SOCKET", tmp_path / "run" / "containerd.sock")
    monkeypatch.setattr(realnode, "NETNS_HANDLE", tmp_path / "netns" / realnode.NETNS)
    cleaned = []
    monkeypatch.setattr(realnode, "clean", lambda: cleaned.append(True))
    monkeypatch.setattr(realnode, "run", lambda *command, **kwargs: pytest.fail(f"ran {command}"))
    return realnode, cleaned


def test_a_killed_real_nodes_leftovers_are_cleared_before_a_start_allowed(tmp_path, monkeypatch, capsys):
    realnode, cleaned = a_killed_real_node(tmp_path, monkeypatch)
    assert not realnode.running()
    realnode.clear_leftovers()
    assert cleaned == [True] and "removing what a killed one left" in capsys.readouterr().out


def test_a_running_real_node_is_not_cleared_denied(tmp_path, monkeypatch):
    realnode, cleaned = a_killed_real_node(tmp_path, monkeypatch, pids="4242\n")
    assert realnode.running()
    with pytest.raises(RuntimeError, match="another local cluster's real node runs"):
        realnode.clear_leftovers()
    assert cleaned == []


def test_images_are_not_imported_through_a_killed_nodes_socket_allowed(tmp_path, monkeypatch, capsys):
    """`make images` after a killed run: the socket is there, no containerd behind it. The images
    wait for the next node's start (before, ctr failed on the refused connection and so did make)."""
    a_killed_real_node(tmp_path, monkeypatch)
    assert localcluster.import_images() == 0
    assert "no local cluster with a real node runs" in capsys.readouterr().out


def test_images_are_imported_into_a_running_node_denied(tmp_path, monkeypatch):
    realnode, _ = a_killed_real_node(tmp_path, monkeypatch, pids="4242\n")
    imported = []
    monkeypatch.setattr(realnode, "run", lambda *command, **kwargs: imported.append(command))
    assert localcluster.import_images() == 0
    assert len(imported) == len(images.IMAGES)
