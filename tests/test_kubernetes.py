"""Kubernetes manifests: every topology renders from its manifest and passes strict offline validation."""

import json

import pytest
import yaml

from complyroute import kubernetes, manifest
from complyroute.deployment import POLICIES

TOPOLOGIES = ["sidecar", "central-entity", "dynamic-router-3", "dynamic-router-6", "baseline"]


def rendered(topology, services, tmp_path, engine=None):
    text = kubernetes.render(manifest.load(topology, services=services, engine=engine), tmp_path / "kustomization")
    path = tmp_path / f"{topology}-{services}.yaml"
    path.write_text(text)
    return path, [o for o in yaml.safe_load_all(text) if o]


def by_kind(objects, kind):
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}


@pytest.mark.parametrize("services", [5, 50])
@pytest.mark.parametrize("topology", TOPOLOGIES)
def test_rendered_manifests_pass_strict_validation_allowed(topology, services, tmp_path):
    path, objects = rendered(topology, services, tmp_path)
    result = kubernetes.validate(path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"Valid: {len(objects)}, Invalid: 0, Errors: 0, Skipped: 0" in result.stdout


@pytest.mark.parametrize("topology", ["sidecar", "central-entity", "dynamic-router-3"])
def test_compiled_engine_renders_valid_configmaps_under_the_size_limit_allowed(topology, tmp_path):
    path, objects = rendered(topology, 50, tmp_path, engine="envoy-compiled")
    result = kubernetes.validate(path)
    assert result.returncode == 0, result.stdout + result.stderr
    envoys = [o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"].startswith("envoy-")]
    compiled = [o for o in envoys if '"matcher"' in o["data"]["envoy.json"]]
    assert compiled, "the compiled engine put matcher trees in front of the decision routes"
    # The API server refuses a ConfigMap over 1 MiB.
    assert max(len(o["data"]["envoy.json"]) for o in envoys) < 1024 * 1024


def test_unknown_field_fails_strict_validation_denied(tmp_path):
    path, objects = rendered("central-entity", 5, tmp_path)
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    deployment["spec"]["template"]["spec"]["containers"][0]["imagePullPolicyy"] = "Always"
    path.write_text(yaml.safe_dump_all(objects))
    result = kubernetes.validate(path)
    assert result.returncode != 0 and "Invalid: 1" in result.stdout, result.stdout


def test_every_container_has_probes_and_resources(tmp_path):
    for topology in TOPOLOGIES:
        _, objects = rendered(topology, 5, tmp_path / topology)
        for workload in [o for o in objects if o["kind"] in ("Deployment", "DaemonSet")]:
            pod = workload["spec"]["template"]["spec"]
            for container in pod["containers"] + pod.get("initContainers", []):
                assert {"readinessProbe", "livenessProbe", "resources"} <= set(container), (topology, container["name"])
                assert container["resources"]["limits"] and container["resources"]["requests"]


def test_policy_configmap_is_generated_from_policies_folder(tmp_path):
    _, objects = rendered("sidecar", 5, tmp_path)
    policy = next(o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"].startswith("policy-"))
    expected = {p for p in POLICIES.rglob("*") if p.is_file() and p.suffix in (".rego", ".json")
                and "examples" not in p.parts and not p.name.endswith("_test.rego")}
    assert len(policy["data"]) == len(expected)
    for path in expected:
        assert policy["data"][".".join(path.relative_to(POLICIES).parts)] == path.read_text()


def test_sidecars_are_native_sidecar_containers_in_each_service_pod(tmp_path):
    _, objects = rendered("sidecar", 5, tmp_path)
    deployments = by_kind(objects, "Deployment")
    for n in range(1, 6):
        pod = deployments[f"svc-{n:02d}"]["spec"]["template"]["spec"]
        sidecars = {c["name"]: c for c in pod["initContainers"]}
        assert all(c["restartPolicy"] == "Always" for c in sidecars.values())
        # The last step decides nothing, so its sidecar has no OPA.
        assert set(sidecars) == ({"envoy"} if n == 5 else {"opa", "envoy"})
        service = pod["containers"][0]
        assert {"name": "HOST", "value": "127.0.0.1"} in service["env"]  # reachable only through the sidecar
    assert deployments["entry"]["spec"]["template"]["spec"]["nodeSelector"] == {kubernetes.NODE_LABEL: "gateway"}


def test_each_sidecar_catalog_holds_itself_and_the_next_step_only(tmp_path):
    _, objects = rendered("sidecar", 5, tmp_path)
    catalog = next(o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"].startswith("catalog-sidecar-svc-02"))
    index = json.loads(catalog["data"]["data.json"])["complyroute"]["index"]
    assert set(index["senders"]) == {"svc-02", "svc-03"}
    assert {step: set(candidates) for step, candidates in index["steps"].items()} == {"step-02": {"svc-02"}, "step-03": {"svc-03"}}


@pytest.mark.parametrize("topology, sets", [("dynamic-router-3", 1), ("dynamic-router-6", 2)])
def test_routers_are_daemonsets_behind_node_local_services(topology, sets, tmp_path):
    _, objects = rendered(topology, 12, tmp_path)
    daemonsets = by_kind(objects, "DaemonSet")
    assert sorted(daemonsets) == [f"router-{k}" for k in range(1, sets + 1)]
    services = by_kind(objects, "Service")
    for name, daemonset in daemonsets.items():
        assert daemonset["spec"]["template"]["spec"]["nodeSelector"] == {kubernetes.ROLE_LABEL: "service"}
        assert services[name]["spec"]["internalTrafficPolicy"] == "Local"
    # Each service sends its records on to its own router set, on its own port.
    deployments = by_kind(objects, "Deployment")
    egress = {n: next(e["value"] for e in d["spec"]["template"]["spec"]["containers"][0]["env"] if e["name"] == "EGRESS_URL")
              for n, d in deployments.items() if n.startswith("svc-")}
    assert egress["svc-01"].startswith(f"http://router-1.{kubernetes.namespace_of(manifest.load(topology))}.svc.cluster.local:")
    assert egress["svc-12"] == ""


def test_central_entity_is_pinned_to_the_gateway_and_services_reach_only_it(tmp_path):
    _, objects = rendered("central-entity", 5, tmp_path)
    central = by_kind(objects, "Deployment")["central-entity"]
    assert central["spec"]["template"]["spec"]["nodeSelector"] == {kubernetes.NODE_LABEL: "gateway"}
    policy = by_kind(objects, "NetworkPolicy")["services"]["spec"]
    assert policy["ingress"][0]["from"][0]["podSelector"]["matchExpressions"][0]["values"] == ["central-entity"]
    assert policy["egress"][1]["to"][0]["podSelector"]["matchExpressions"][0]["values"] == ["central-entity"]


def test_baseline_lets_services_call_each_other_and_runs_no_opa(tmp_path):
    _, objects = rendered("baseline", 5, tmp_path)
    containers = [c["name"] for o in objects if o["kind"] == "Deployment" for c in o["spec"]["template"]["spec"]["containers"]]
    assert "opa" not in containers
    policy = by_kind(objects, "NetworkPolicy")["services"]["spec"]
    assert policy["egress"][1]["to"][0]["podSelector"]["matchExpressions"][0]["values"] == ["service"]


def pods(objects):
    return {o["metadata"]["name"]: o["spec"]["template"]["spec"] for o in objects if o["kind"] in ("Deployment", "DaemonSet")}


def restricted_violations(pod: dict) -> list[str]:
    """What in a pod spec breaks the restricted Pod Security Standard (or our token rule)."""
    found = []
    security = pod.get("securityContext", {})
    if pod.get("automountServiceAccountToken") is not False:
        found.append("automountServiceAccountToken")
    if security.get("runAsNonRoot") is not True or not isinstance(security.get("runAsUser"), int) or security["runAsUser"] <= 0:
        found.append("a numeric non-root user")
    if security.get("seccompProfile") != {"type": "RuntimeDefault"}:
        found.append("seccompProfile")
    for container in pod["containers"] + pod.get("initContainers", []):
        context = container.get("securityContext", {})
        if context.get("allowPrivilegeEscalation") is not False:
            found.append(f"{container['name']}: allowPrivilegeEscalation")
        if context.get("capabilities") != {"drop": ["ALL"]}:
            found.append(f"{container['name']}: capabilities")
        if context.get("readOnlyRootFilesystem") is not True:
            found.append(f"{container['name']}: readOnlyRootFilesystem")
        if context.get("privileged") or "runAsUser" in context:
            found.append(f"{container['name']}: its own user or privileges")
    return found


@pytest.mark.parametrize("engine", manifest.ENGINES)
@pytest.mark.parametrize("topology", TOPOLOGIES)
def test_every_pod_runs_under_the_restricted_pod_security_standard_allowed(topology, engine, tmp_path):
    _, objects = rendered(topology, 5, tmp_path, engine=engine)
    namespace = next(o for o in objects if o["kind"] == "Namespace")
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    assert {name: restricted_violations(pod) for name, pod in pods(objects).items()} == {name: [] for name in pods(objects)}


def test_a_pod_that_breaks_the_standard_is_told_apart_denied(tmp_path):
    _, objects = rendered("sidecar", 5, tmp_path)
    pod = pods(objects)["svc-01"]
    pod["initContainers"][0]["securityContext"] = {**pod["initContainers"][0]["securityContext"], "allowPrivilegeEscalation": True}
    pod["automountServiceAccountToken"] = True
    assert restricted_violations(pod) == ["automountServiceAccountToken", "opa: allowPrivilegeEscalation"]


def test_the_service_image_runs_as_the_pods_numeric_user():
    dockerfile = (manifest.REPO / "services" / "Dockerfile").read_text()
    users = [line.split()[1] for line in dockerfile.splitlines() if line.startswith("USER ")]
    assert users == [f"{kubernetes.RUN_AS}:{kubernetes.RUN_AS}"]


@pytest.mark.parametrize("topology", TOPOLOGIES)
def test_admin_and_opa_api_stay_in_the_pod_and_probes_use_readiness_and_diagnostics(topology, tmp_path):
    net = kubernetes.KubernetesNetwork
    _, objects = rendered(topology, 5, tmp_path)
    envoys = [o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"].startswith("envoy-")]
    for configmap in envoys:
        envoy = json.loads(configmap["data"]["envoy.json"])
        assert envoy["admin"]["address"]["socket_address"]["address"] == "127.0.0.1"
        ready = next(l for l in envoy["static_resources"]["listeners"] if l["name"] == "ready")
        assert ready["address"]["socket_address"] == {"address": "0.0.0.0", "port_value": net.ENVOY_READY}
    for name, pod in pods(objects).items():
        for container in pod["containers"] + pod.get("initContainers", []):
            probes = [container["readinessProbe"], container["livenessProbe"]]
            ports = {p["containerPort"] for p in container.get("ports", [])}
            assert net.ENVOY_ADMIN not in ports and net.OPA_HTTP not in ports, (name, container["name"])
            if container["name"] == "opa":
                assert f"--addr=127.0.0.1:{net.OPA_HTTP}" in container["args"] and "--authorization=basic" in container["args"]
                assert f"--diagnostic-addr=0.0.0.0:{net.OPA_DIAGNOSTIC}" in container["args"]
                assert {p["httpGet"]["port"] for p in probes} == {net.OPA_DIAGNOSTIC}
            elif container["name"] == "envoy":
                assert {(p["httpGet"]["path"], p["httpGet"]["port"]) for p in probes} == {("/ready", net.ENVOY_READY)}
            elif any("127.0.0.1" == e["value"] for e in container["env"] if e["name"] == "HOST"):
                # Beside its sidecar: the ingress passes records only, so the probe runs inside.
                assert all("exec" in p and "127.0.0.1:3000/health" in p["exec"]["command"][-1] for p in probes)
            else:
                assert {p["httpGet"]["port"] for p in probes} == {net.SERVICE}


@pytest.mark.parametrize("topology", TOPOLOGIES)
def test_network_policies_admit_no_peer_to_admin_opa_or_probe_ports_denied(topology, tmp_path):
    net = kubernetes.KubernetesNetwork
    _, objects = rendered(topology, 5, tmp_path)
    closed = {net.ENVOY_ADMIN, net.OPA_HTTP, net.OPA_GRPC, net.ENVOY_READY, net.OPA_DIAGNOSTIC}
    policies = by_kind(objects, "NetworkPolicy")
    assert policies
    for name, policy in policies.items():
        admitted = {p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"]}
        assert admitted and not admitted & closed, (name, admitted)
