"""Every topology applied to a real API server (etcd, kube-apiserver, controllers, scheduler)
whose nodes kwok fakes: accepted, scheduled where the manifest says, and shaped as designed.
(The cluster, conftest.py, also has a real node, labelled for one-node renderings only: none of
these pods lands there. test_real_node_e2e.py runs pods on it.)

Run by `make k8s-e2e`, not by the default pytest run (it needs the binaries `make k8s-setup`
builds).
"""

import base64
import io
import json
import os
import shutil
import subprocess
import tarfile
from collections import Counter

import pytest
import yaml

from complyroute.policy import bundles, policyfiles
from complyroute.policy.ruleset import RuleSet
from complyroute.runtime.kubernetes import apply, render
from complyroute.topology import manifest
from complyroute.topology.manifest import REPO
from tests.rulesets import of_manifest


TOPOLOGIES = ["sidecar", "central-entity", "dynamic-router-3", "dynamic-router-6", "baseline"]
# Every topology at 5 and 50 services with the default engine; and the two whose compiled Envoy
# configuration at 50 services is over one ConfigMap, so its route configurations fill ConfigMaps
# of their own (routes.split_routes).
CASES = [(topology, services, None) for services in (5, 50) for topology in TOPOLOGIES]
CASES += [("central-entity", 50, "envoy-compiled"), ("dynamic-router-3", 50, "envoy-compiled")]


def get(cluster, kind, namespace):
    return json.loads(cluster.kubectl("-n", namespace, "get", kind, "-o", "json", quiet=True).stdout)["items"]


@pytest.mark.parametrize("topology_name, services, engine", CASES, ids=[f"{t}-{n}" + (f"-{e}" if e else "") for t, n, e in CASES])
def test_topology_is_accepted_scheduled_and_shaped_as_designed(cluster, topology_name, services, engine, tmp_path):
    topology = manifest.load(topology_name, services=services, engine=engine)
    namespace = render.namespace_of(topology)
    net = render.KubernetesNetwork
    rendered = tmp_path / "rendered.yaml"
    rendered.write_text(render.render(topology, tmp_path / "kustomization", of_manifest(topology)))
    objects = [line for line in rendered.read_text().split("\n---\n") if line.strip()]

    # The API server accepts every object (server-side apply validates against its schemas).
    applied = cluster.kubectl("apply", "--server-side", "-f", str(rendered), quiet=True).stdout.splitlines()
    assert len(applied) == len(objects) and all(line.endswith("serverside-applied") for line in applied), applied
    try:
        cluster.kubectl("-n", namespace, "wait", "--for=condition=Available", "deployment", "--all", "--timeout=180s", quiet=True)
        for daemonset in get(cluster, "daemonsets", namespace):
            cluster.kubectl("-n", namespace, "rollout", "status", f"daemonset/{daemonset['metadata']['name']}", "--timeout=180s", quiet=True)

        pods = get(cluster, "pods", namespace)
        where = {i.id: i.node.name for i in topology.instances}
        routers = Counter()
        for pod in pods:
            app, component, node = pod["metadata"]["labels"]["app"], pod["metadata"]["labels"]["component"], pod["spec"]["nodeName"]
            if component == "service":
                assert node == where[app], (app, node)  # the manifest's placement
            elif component == "router":
                routers[node] += 1
            else:
                assert node == "gateway", (app, node)  # entry, central entity, baseline gateway
        assert sum(p["metadata"]["labels"]["component"] == "service" for p in pods) == services

        # Each service node gets exactly the routers DR_3 and DR_6 call for; the gateway none.
        expected_routers = topology.routers_per_node if topology.kind == "dynamic-router" else 0
        assert routers == Counter({n.name: expected_routers for n in topology.service_nodes if expected_routers}), routers

        if topology.kind == "sidecar":
            for pod in [p for p in pods if p["metadata"]["labels"]["component"] == "service"]:
                sidecars = {c["name"]: c.get("restartPolicy") for c in pod["spec"]["initContainers"]}
                last = topology.next_step(topology.instances[[i.id for i in topology.instances].index(pod["metadata"]["labels"]["app"])].step) is None
                assert sidecars == ({"envoy": "Always"} if last else {"opa": "Always", "envoy": "Always"})

        # Mutual TLS (on by default): the API server holds one kubernetes.io/tls Secret per
        # part (each service, each point's workload, the bundle server where anything decides),
        # the monitoring credential (tls-monitoring, for the operator's Prometheus) and the
        # entry's signing key; every pod's Secret volumes name Secrets that exist; no ConfigMap
        # holds a private key.
        stored = {s["metadata"]["name"]: s for s in get(cluster, "secrets", namespace)}
        configmaps = get(cluster, "configmaps", namespace)
        points = [c for c in configmaps if c["metadata"]["name"].startswith("envoy-")]
        deciding = topology.kind != "baseline"
        assert sum(s["type"] == "kubernetes.io/tls" for s in stored.values()) == services + len(points) + deciding + 1
        assert [s["type"] for n, s in stored.items() if n.startswith("tls-monitoring-")] == ["kubernetes.io/tls"]
        assert len([n for n in stored if n.startswith("token-")]) == (0 if topology.kind == "baseline" else 1)
        assert not any("PRIVATE KEY" in value for c in configmaps for value in c.get("data", {}).values())
        for pod in pods:
            assert pod["spec"]["securityContext"]["fsGroup"] == render.RUN_AS
            mounted = [v["secret"]["secretName"] for v in pod["spec"]["volumes"] if "secret" in v]
            assert mounted and all(name in stored for name in mounted), (pod["metadata"]["name"], mounted)

        # Every ConfigMap a pod mounts exists, under 1 MiB (the API server would have refused
        # it); a bootstrap too large for one reads its route files from ConfigMaps of their own.
        names = {c["metadata"]["name"] for c in configmaps}
        for pod in pods:
            volumes = pod["spec"]["volumes"]
            mounted = [v["configMap"]["name"] for v in volumes if "configMap" in v]
            mounted += [s["configMap"]["name"] for v in volumes if "projected" in v for s in v["projected"]["sources"]]
            assert set(mounted) <= names, (pod["metadata"]["name"], set(mounted) - names)
        assert max(configmap_bytes(c) for c in configmaps) <= render.CONFIGMAP_BUDGET
        routes = [c for c in configmaps if c["metadata"]["name"].startswith("routes-")]
        assert bool(routes) == (engine == "envoy-compiled"), [c["metadata"]["name"] for c in routes]
        # The deciding points' bundles, in ConfigMaps named as they are (a reload updates them in place).
        assert sorted(n for n in names if n.startswith("bundles-")) == (["bundles-1"] if deciding else [])

        # Every pod above passed the restricted Pod Security Standard, which the namespace
        # enforces; a pod that breaks it is refused at admission.
        for pod in pods:
            assert pod["spec"]["securityContext"]["runAsNonRoot"] and pod["spec"]["automountServiceAccountToken"] is False
        privileged = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "privileged", "namespace": namespace},
                      "spec": {"containers": [{"name": "c", "image": render.ENVOY_IMAGE, "securityContext": {"privileged": True}}]}}
        refused = cluster.kubectl("apply", "-f", "-", input=json.dumps(privileged), check=False, quiet=True)
        assert refused.returncode != 0 and "violates PodSecurity" in refused.stderr, refused.stdout + refused.stderr

        policies = {p["metadata"]["name"]: p["spec"] for p in get(cluster, "networkpolicies", namespace)}
        senders = {"sidecar": ["entry", "service"], "central-entity": ["central-entity"],
                   "dynamic-router": ["entry", "router"], "baseline": ["gateway", "service"]}[topology.kind]
        assert policies["services"]["ingress"][0]["from"][0]["podSelector"]["matchExpressions"][0]["values"] == senders
        closed = {net.ENVOY_READY, net.OPA_DIAGNOSTIC}  # admin, OPA's decisions and REST API: no port at all
        for name, spec in policies.items():  # the kubelet's probes need no rule; no peer reaches these
            assert not {port["port"] for rule in spec["ingress"] for port in rule["ports"]} & closed, name
        assert set(policies["services"]["policyTypes"]) == {"Ingress", "Egress"}
        assert ("routers" in policies) == (topology.kind == "dynamic-router")

        # Metrics: every pod with an Envoy is annotated for Prometheus at its point's metrics port
        # (and its OPA's path beside an OPA), a service pod without one at its service's port,
        # the bundle server not at all; only namespaces labelled for monitoring reach those ports.
        scraped = set()
        for pod in pods:
            annotations = pod["metadata"].get("annotations", {})
            containers = {c["name"] for c in pod["spec"]["containers"] + pod["spec"].get("initContainers", [])}
            if "envoy" in containers:
                expected = {"prometheus.io/port": str(net.METRICS), "prometheus.io/scheme": "https"}
                assert (render.OPA_METRICS_ANNOTATION in annotations) == ("opa" in containers), pod["metadata"]["name"]
            elif "service" in containers:
                expected = {"prometheus.io/port": str(net.SERVICE), "prometheus.io/scheme": "https"}
            else:
                assert "prometheus.io/scrape" not in annotations, pod["metadata"]["name"]
                continue
            assert {key: annotations.get(key) for key in [*expected, "prometheus.io/scrape"]} == {**expected, "prometheus.io/scrape": "true"}, pod["metadata"]["name"]
            scraped.add(pod["metadata"]["labels"]["component"])
        assert scraped and "service" in scraped
        monitoring = [{"namespaceSelector": {"matchLabels": {render.MONITORING_NAMESPACE_LABEL: render.MONITORING_NAMESPACE_VALUE}}}]
        for name, spec in policies.items():
            metrics_rules = [rule for rule in spec["ingress"] if net.METRICS in {port["port"] for port in rule["ports"]}]
            component = spec["podSelector"]["matchLabels"]["component"]
            if component == render.BUNDLE_SERVER:
                assert not metrics_rules, name
            else:
                assert [rule["from"] for rule in metrics_rules] == [monitoring], name
    finally:
        cluster.kubectl("delete", "namespace", namespace, "--wait=true", "--timeout=180s", quiet=True)
    assert cluster.kubectl("get", "namespace", namespace, check=False, quiet=True).returncode != 0


def configmap_bytes(configmap) -> int:
    """What the API server counts of a ConfigMap: its values, binary ones as their bytes."""
    return (sum(len(v.encode()) for v in configmap.get("data", {}).values())
            + sum(len(base64.b64decode(v)) for v in configmap.get("binaryData", {}).values()))


@pytest.fixture(scope="module")
def us_adequate(tmp_path_factory):
    """policies/ with one routing change: the US joins the adequacy list."""
    policies = tmp_path_factory.mktemp("us-adequate") / "policies"
    shutil.copytree(policyfiles.POLICIES, policies)
    reference = policies / "complyroute" / "reference" / "data.json"
    reference.write_text(json.dumps({**(data := json.loads(reference.read_text())), "adequacy": [*data["adequacy"], "US"]}))
    return policies


def snapshot(cluster, namespace) -> dict:
    """What a reload may change and what it must not: every ConfigMap's and Secret's
    resourceVersion; every workload's generation and pod template; every ReplicaSet (one per pod
    template a Deployment had) and pod."""
    workloads = get(cluster, "deployments", namespace) + get(cluster, "daemonsets", namespace)
    return {
        "configmaps": {c["metadata"]["name"]: c["metadata"]["resourceVersion"] for c in get(cluster, "configmaps", namespace)},
        "secrets": {s["metadata"]["name"]: s["metadata"]["resourceVersion"] for s in get(cluster, "secrets", namespace)},
        "workloads": {w["metadata"]["name"]: (w["metadata"]["generation"], json.dumps(w["spec"]["template"], sort_keys=True)) for w in workloads},
        "replicasets": sorted(r["metadata"]["labels"]["pod-template-hash"] for r in get(cluster, "replicasets", namespace)),
        "pods": sorted((p["metadata"]["name"], p["metadata"]["uid"]) for p in get(cluster, "pods", namespace)),
    }


def test_reload_policy_updates_the_bundle_and_route_configmaps_and_rolls_no_pod_allowed(cluster, us_adequate, monkeypatch):
    """`deploy --target k8s`, then `make reload-policy target=k8s` with the deployed rule set (changes
    nothing), then a reload with the US adequate: the bundle and route ConfigMaps take the new
    rule set, named by its revision; no Deployment's generation or pod template changes, no
    ReplicaSet or pod is made. (kwok runs no kubelet: nothing here swaps files in a pod.)"""
    monkeypatch.setenv("KUBECONFIG", str(cluster.kubeconfig))
    topology = manifest.load("central-entity", services=5, engine="envoy-compiled")
    namespace = render.namespace_of(topology)
    changing = ["bundles-1", "routes-central-entity-1"]
    try:
        assert apply.apply(topology, REPO / "runs" / "k8s" / "central-entity-5", of_manifest(topology), "180s") == 0
        deployed = snapshot(cluster, namespace)
        assert set(changing) <= set(deployed["configmaps"]) and deployed["replicasets"]

        same = subprocess.run(["make", "reload-policy", "target=k8s", "topology=ce"], cwd=REPO, env=os.environ, capture_output=True, text=True)
        assert same.returncode == 0, same.stdout + same.stderr
        assert f"revision {bundles.revision()} applied to namespace {namespace}: no ConfigMap changed" in same.stdout
        assert snapshot(cluster, namespace) == deployed

        result = apply.reload_policy(topology, RuleSet.of(us_adequate), out=io.StringIO())
        revision = bundles.revision(us_adequate)
        assert result["changed"] == changing and result["revision"] == revision != bundles.revision()
        reloaded = snapshot(cluster, namespace)
        assert {n for n, version in reloaded["configmaps"].items() if deployed["configmaps"][n] != version} == set(changing)
        assert {key: reloaded[key] for key in ("secrets", "workloads", "replicasets", "pods")} == {
            key: deployed[key] for key in ("secrets", "workloads", "replicasets", "pods")}
        stored = {c["metadata"]["name"]: c for c in get(cluster, "configmaps", namespace)}
        assert all(stored[n]["metadata"]["annotations"][render.REVISION_ANNOTATION] == revision for n in changing)
        bundle = base64.b64decode(stored["bundles-1"]["binaryData"]["central-entity.tar.gz"])
        with tarfile.open(fileobj=io.BytesIO(bundle), mode="r:gz") as tar:
            members = {m.name.lstrip("/"): tar.extractfile(m).read() for m in tar.getmembers()}
        # opa build merges the rule set's reference data into the bundle's data.json.
        assert json.loads(members["data.json"])["complyroute"]["reference"]["adequacy"][-1] == "US"
        assert json.loads(members[".manifest"])["revision"] == revision
        assert all(json.loads(route)["version_info"] == revision for route in stored["routes-central-entity-1"]["data"].values())
    finally:
        cluster.kubectl("delete", "namespace", namespace, "--wait=true", "--timeout=180s", quiet=True, check=False)
        apply.record_path(namespace).unlink(missing_ok=True)


def test_make_deploy_and_undeploy_target_k8s_drive_the_current_context(cluster):
    """The operator's commands, against the current kubectl context (here: the local cluster)."""
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig)}
    deployed = subprocess.run(["make", "topology=dr6", "services=5", "deploy", "target=k8s"], cwd=REPO, env=env, capture_output=True, text=True)
    assert deployed.returncode == 0, deployed.stdout + deployed.stderr
    assert "port-forward service/entry 8080:8080" in deployed.stdout
    assert len(get(cluster, "pods", "complyroute-dynamic-router-6")) == 5 + 1 + 6 + 1  # services, entry, 2 routers x 3 nodes, bundle server

    # make status target=k8s: the pods of what was deployed, each ready, with its restarts.
    status = subprocess.run(["make", "status", "target=k8s"], cwd=REPO, env=env, capture_output=True, text=True)
    assert status.returncode == 0, status.stdout + status.stderr
    lines = status.stdout.splitlines()
    assert "complyroute-dynamic-router-6: 13 pods" in lines and "status: complyroute-dynamic-router-6: 13/13 pods ready" in lines, status.stdout
    pod_lines = [line for line in lines if line.startswith("  ready ")]
    assert len(pod_lines) == 13 and all("restarts 0" in line for line in pod_lines), status.stdout
    assert sum(" router " in line for line in pod_lines) == 6 and sum(" service " in line for line in pod_lines) == 5

    undeployed = subprocess.run(["make", "undeploy", "target=k8s"], cwd=REPO, env=env, capture_output=True, text=True)
    assert undeployed.returncode == 0, undeployed.stdout + undeployed.stderr
    assert cluster.kubectl("get", "namespace", "complyroute-dynamic-router-6", check=False, quiet=True).returncode != 0
    status = subprocess.run(["make", "status", "target=k8s"], cwd=REPO, env=env, capture_output=True, text=True)
    assert status.returncode != 0 and "no complyroute topology is deployed" in status.stdout, status.stdout + status.stderr


KINDS = ["deployments", "daemonsets", "services", "configmaps", "secrets", "networkpolicies"]


def inventory(cluster, namespace) -> dict[tuple[str, str], dict]:
    """Every object of KINDS in the namespace, by (kind, name)."""
    return {(o["kind"], o["metadata"]["name"]): o for kind in KINDS for o in get(cluster, kind, namespace)}


def test_deploying_5_services_after_50_prunes_what_only_the_50_had_allowed(cluster, monkeypatch):
    """`deploy --target k8s` applies a topology as an ApplySet with --prune: deployed again with 5 services
    after 50, the namespace holds exactly what the 5-service render holds. No svc-06..50 (their
    Deployments, Services, TLS Secrets), no ConfigMap or Secret of an earlier hash. What the
    deploy did not make (a ConfigMap an operator added) is not a member, and stays."""
    monkeypatch.setenv("KUBECONFIG", str(cluster.kubeconfig))
    big, small = manifest.load("central-entity", services=50), manifest.load("central-entity", services=5)
    namespace = render.namespace_of(small)
    folder = REPO / "runs" / "k8s-e2e-prune"
    gone = sorted({i.id for i in big.instances} - {i.id for i in small.instances})
    try:
        assert apply.apply(big, folder / "central-entity-50", of_manifest(big), "180s") == 0
        before = inventory(cluster, namespace)
        assert len(gone) == 45 and all(("Deployment", name) in before and ("Service", name) in before for name in gone)
        cluster.kubectl("-n", namespace, "create", "configmap", "operator-notes", "--from-literal=note=kept", quiet=True)

        assert apply.apply(small, folder / "central-entity-5", of_manifest(small), "180s") == 0
        after = inventory(cluster, namespace)
        rendered = {(o["kind"], o["metadata"]["name"]) for o in yaml.safe_load_all((folder / "central-entity-5.yaml").read_text()) if o}
        # Beside the render: the ApplySet's parent, the operator's ConfigMap, the CA bundle Kubernetes puts in every namespace.
        kept = {("Secret", apply.APPLYSET), ("ConfigMap", "operator-notes"), ("ConfigMap", "kube-root-ca.crt")}
        assert set(after) == rendered | kept, (sorted(set(after) - rendered - kept), sorted(rendered - set(after)))
        assert not [name for kind, name in after if name in gone or name.startswith(tuple(f"tls-{g}-" for g in gone))]
        # What only the 50-service deploy had is gone: the 45 services' objects, and every ConfigMap and
        # Secret named by a hash of content that changed (the central entity's Envoy configuration; every
        # TLS Secret, since each render makes a new CA).
        stale = set(before) - rendered - kept
        assert not stale & set(after), sorted(stale & set(after))
        assert [name for kind, name in stale if kind == "ConfigMap" and name.startswith("envoy-central-entity-")]
        assert len([name for kind, name in stale if kind == "Secret" and name.startswith("tls-")]) == len(before_tls := [
            name for kind, name in before if kind == "Secret" and name.startswith("tls-")]) and before_tls
        assert all(o["metadata"]["labels"].get(apply.APPLYSET_MEMBER) for key, o in after.items() if key in rendered)
        assert apply.APPLYSET_MEMBER not in after[("ConfigMap", "operator-notes")]["metadata"].get("labels", {})
    finally:
        cluster.kubectl("delete", "namespace", namespace, "--wait=true", "--timeout=180s", quiet=True, check=False)
        apply.record_path(namespace).unlink(missing_ok=True)
        shutil.rmtree(folder, ignore_errors=True)


def test_deploying_again_prunes_nothing_of_another_topology_denied(cluster, monkeypatch):
    """Each topology is its own ApplySet in its own namespace: deploying one with fewer services
    deletes nothing of another topology deployed beside it."""
    monkeypatch.setenv("KUBECONFIG", str(cluster.kubeconfig))
    other, this = manifest.load("baseline", services=5), manifest.load("sidecar", services=5)
    folder = REPO / "runs" / "k8s-e2e-prune-other"
    namespaces = [render.namespace_of(other), render.namespace_of(this)]
    try:
        assert apply.apply(other, folder / "baseline-5", of_manifest(other), "180s") == 0
        before = inventory(cluster, namespaces[0])
        assert apply.apply(this, folder / "sidecar-5", of_manifest(this), "180s") == 0
        three = manifest.load("sidecar", services=3)  # bound before the assert: pytest's rewrite of it saw a walrus's name unbound
        assert apply.apply(three, folder / "sidecar-3", of_manifest(three), "180s") == 0
        assert len([key for key in inventory(cluster, namespaces[1]) if key[0] == "Deployment"]) == 3 + 1 + 1  # pruned: 2 services
        after = inventory(cluster, namespaces[0])
        assert {key: o["metadata"]["uid"] for key, o in after.items()} == {key: o["metadata"]["uid"] for key, o in before.items()}
    finally:
        for namespace in namespaces:
            cluster.kubectl("delete", "namespace", namespace, "--wait=true", "--timeout=180s", quiet=True, check=False)
            apply.record_path(namespace).unlink(missing_ok=True)
        shutil.rmtree(folder, ignore_errors=True)
