"""`python -m experiments run --target k8s` against the local cluster: one short cell deployed
to the real node (--one-node), loaded through `kubectl port-forward`, its namespace deleted
afterwards; and the same command with no cluster answering, refused before any cell.

The cell's load is one closed-loop user: on this shared 2-core machine an open loop's bursts
right after the pods became ready got 503 (no decision in time) from a starved OPA, which is
the machine's load, not what this test is about (where the run deployed, reached and removed).

Run by `make k8s-e2e` (it needs `make k8s-setup` and `make images`)."""

import csv
import gzip
import json
import os
import subprocess

import pytest
import yaml

from experiments import __main__ as cli
from tests.k8s.harness import realnode


TOPOLOGY = "dynamic-router-3"
RATE, WARMUP, DURATION = 5, 2, 8


def use_kubectl_of(monkeypatch, kubeconfig) -> None:
    """The commands the experiment runs (kubectl apply, port-forward, delete) see this cluster as
    the current context, through the kubectl `make k8s-setup` built."""
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    monkeypatch.setenv("PATH", f"{realnode.BIN}{os.pathsep}{os.environ['PATH']}")


def test_run_target_k8s_measures_one_short_cell_on_the_real_node_allowed(cluster, tmp_path, monkeypatch, capsys):
    if cluster.real_node is None:
        pytest.skip("the cluster runs without a real node (COMPLYROUTE_REAL_NODE=0)")
    use_kubectl_of(monkeypatch, cluster.kubeconfig)
    code = cli.main(["--results", str(tmp_path), "run", "--profile", "paper", "--target", "k8s", "--one-node", "--run-id", "k8s-cell",
                     "--topologies", TOPOLOGY, "--engines", "envoy-opa", "--rates", str(RATE), "--services", "5", "--repetitions", "1",
                     "--warmup", str(WARMUP), "--duration", str(DURATION), "--mix", "mixed", "--load", "closed",
                     "--user-rate", str(RATE)])
    out = capsys.readouterr().out
    assert code == 0, out
    run_dir = tmp_path / "k8s-cell"
    assert not list((run_dir / "raw").glob("*/failed.json")), out

    meta = json.loads((run_dir / "metadata.json").read_text())
    assert meta["target"]["target"] == "k8s" and meta["target"]["one_node"] is True
    assert meta["target"]["context"] == "local" and meta["target"]["server"].endswith(":36443")
    assert realnode.NAME in meta["target"]["nodes"] and meta["target"]["deploys_to"] == [realnode.NAME]
    assert meta["sessions"][-1]["bench"]["skipped"].startswith("target k8s")

    (cell_json,) = (run_dir / "raw").glob("*/cell.json")
    cell = json.loads(cell_json.read_text())
    assert cell["deployment"]["namespace"] == f"complyroute-{TOPOLOGY}" and cell["deployment"]["nodes"] == [realnode.NAME]
    with gzip.open(cell_json.parent / "requests.csv.gz", "rt") as file:
        rows = list(csv.DictReader(file))
    sent = [row for row in rows if not row["missed"]]
    assert len(sent) >= DURATION, f"{len(sent)} records sent"  # one user waiting for each answer: at least one a second
    wrong = [(row["record"], row["expected"], row["status"]) for row in sent if row["status"] != row["expected"]]
    assert not wrong, f"{len(wrong)} of {len(sent)} answered otherwise than expected: {wrong[:5]}"
    assert all(row["hops"] == "5" for row in sent if row["record"] == "allowed")
    cpu = (cell_json.parent / "cpu.csv").read_text().splitlines()
    assert cpu[1].split(",")[3] == ""  # the deployment's CPU: pods, not sampled

    report = (run_dir / "report" / "report.md").read_text()
    assert "Target: **k8s**: kubectl context `local`" in report and realnode.NAME in report
    assert "Not measured on this target: the deployment's CPU time and memory" in report

    gone = cluster.kubectl("get", "namespace", f"complyroute-{TOPOLOGY}", check=False, quiet=True)
    assert gone.returncode != 0 and "NotFound" in gone.stderr  # undeployed: the namespace was deleted and waited for
    assert "kubectl" not in subprocess.run(["pgrep", "-af", "port-forward.*complyroute-"], capture_output=True, text=True).stdout


def test_run_target_k8s_with_no_cluster_answering_is_refused_denied(tmp_path, monkeypatch, capsys):
    """A kubeconfig whose API server nobody listens on: exit 2, one line, no run folder."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "nowhere",
        "clusters": [{"name": "nowhere", "cluster": {"server": "https://127.0.0.1:9", "insecure-skip-tls-verify": True}}],
        "users": [{"name": "nobody", "user": {"token": "none"}}],
        "contexts": [{"name": "nowhere", "context": {"cluster": "nowhere", "user": "nobody"}}]}))
    use_kubectl_of(monkeypatch, kubeconfig)
    results = tmp_path / "results"
    assert cli.main(["--results", str(results), "run", "--profile", "paper", "--target", "k8s", "--one-node", "--topologies", TOPOLOGY, "--rates", "5",
                     "--services", "5", "--repetitions", "1", "--duration", "2", "--bench-rounds", "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --target k8s: the current kubectl context (nowhere, server https://127.0.0.1:9) does not answer")
    assert err.count("\n") == 1 and not results.exists()
