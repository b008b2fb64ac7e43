"""Kubernetes manifests: the workloads of each topology (sidecars, routers, the central entity,
each replica of a service), their probes, resources and images, the restricted Pod Security
Standard, the private sockets of Envoy and OPA, and where pods go (one node or several)."""

import json
import re
import socket

import pytest

from complyroute.policy import bundles
from complyroute.policy.policyfiles import POLICIES
from complyroute.runtime.kubernetes import images, render, validate
from complyroute.runtime.kubernetes.nodes import NODE_LABEL, ROLE_LABEL
from complyroute.topology import manifest
from complyroute.topology.plan import ADMIN_SOCKET, API_SOCKET, DECISION_SOCKET
from complyroute.trust import pki
from tests.rulesets import of_manifest

from tests.integration.runtime.kubernetes.manifests import (
    PLAIN, TOPOLOGIES, admitted, bundle_files, bundle_members, by_kind, containers, decoded, env_of, envoy_config, objects_of, pods,
    rendered, secrets, uri_sans, walk)


def test_every_container_has_probes_and_resources(tmp_path):
    for topology in TOPOLOGIES:
        _, objects = rendered(topology, 5, tmp_path / topology)
        for workload in [o for o in objects if o["kind"] in ("Deployment", "DaemonSet")]:
            pod = workload["spec"]["template"]["spec"]
            for container in pod["containers"] + pod.get("initContainers", []):
                assert {"readinessProbe", "livenessProbe", "resources"} <= set(container), (topology, container["name"])
                assert container["resources"]["limits"] and container["resources"]["requests"]


def mebibytes(quantity: str) -> float:
    """A memory quantity as Kubernetes ("128Mi") or Go's GOMEMLIMIT ("96MiB") write it, in MiB."""
    number, unit = re.fullmatch(r"([0-9.]+)([KMG])iB?", quantity).groups()
    return float(number) * {"K": 1 / 1024, "M": 1, "G": 1024}[unit]


def test_every_opa_collects_sooner_before_its_memory_limit_allowed(tmp_path):
    """GOGC=400 lets an OPA's heap grow to five times what it holds live (fewer collections a
    check); its GOMEMLIMIT, under its container's memory limit, has Go collect sooner as the heap
    nears it, so the larger heap never reaches the limit."""
    for topology in (t for t in TOPOLOGIES if t != "baseline"):  # the baseline decides nothing: no OPA
        _, objects = rendered(topology, 5, tmp_path / topology)
        opas = [c for pod in pods(objects).values() for c in containers(pod) if c["name"] == "opa"]
        assert opas, topology
        for container in opas:
            env = env_of(container)
            assert env["GOGC"] == "400" and env["GOMAXPROCS"] == "1" and env["GODEBUG"] == "adaptivestackstart=1"
            assert mebibytes(env["GOMEMLIMIT"]) < mebibytes(container["resources"]["limits"]["memory"]), topology


def test_a_memory_limit_under_the_heap_ceiling_is_told_apart_denied():
    assert not mebibytes("96MiB") < mebibytes("64Mi")
    assert mebibytes("96MiB") < mebibytes("128Mi") and mebibytes("1Gi") == 1024


def test_policy_configmap_holds_the_system_policies_only_and_each_bundle_the_rule_set_denied(tmp_path):
    """What OPA loads from disk is the enforcement point's own (policies/system: the REST API's
    authorization, the log mask), read from policies/; the rule set comes in its bundle."""
    _, objects = rendered("sidecar", 5, tmp_path)
    policy = next(o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"].startswith("policy-"))
    expected = {p for p in (POLICIES / "system").rglob("*") if p.is_file() and p.suffix in (".rego", ".json") and not p.name.endswith("_test.rego")}
    assert expected and len(policy["data"]) == len(expected)
    for path in expected:
        assert policy["data"][".".join(path.relative_to(POLICIES).parts)] == path.read_text()
    assert not [key for key in policy["data"] if not key.startswith("system.")]
    modules = {key: content for key, content in bundles.rule_set_files().items() if key.endswith(".rego")}
    for name, bundle in bundle_files(objects).items():
        content = bundle_members(bundle)
        assert {key: content[key] for key in modules} == modules, name
        # The rule set's reference data, which opa build merges into the bundle's data.json.
        assert "reference" in json.loads(content["data.json"])["complyroute"], name
        assert not [key for key in content if key.startswith(("system/", "examples/")) or key.endswith("_test.rego")], name


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
    assert deployments["entry"]["spec"]["template"]["spec"]["nodeSelector"] == {NODE_LABEL: "gateway"}


def test_each_sidecar_index_holds_itself_and_the_next_step_only(tmp_path):
    _, objects = rendered("sidecar", 5, tmp_path)
    bundle = bundle_members(bundle_files(objects)["sidecar-svc-02.tar.gz"])
    index = json.loads(bundle["data.json"])["complyroute"]["index"]
    assert set(index["senders"]) == {"svc-02", "svc-03"}
    assert {step: set(candidates) for step, candidates in index["steps"].items()} == {"step-02": {"svc-02"}, "step-03": {"svc-03"}}


@pytest.mark.parametrize("topology, sets", [("dynamic-router-3", 1), ("dynamic-router-6", 2)])
def test_routers_are_daemonsets_behind_node_local_services(topology, sets, tmp_path):
    _, objects = rendered(topology, 12, tmp_path)
    daemonsets = by_kind(objects, "DaemonSet")
    assert sorted(daemonsets) == [f"router-{k}" for k in range(1, sets + 1)]
    services = by_kind(objects, "Service")
    for name, daemonset in daemonsets.items():
        assert daemonset["spec"]["template"]["spec"]["nodeSelector"] == {ROLE_LABEL: "service"}
        assert services[name]["spec"]["internalTrafficPolicy"] == "Local"
    # Each service sends its records on to its own router set, on its own port.
    deployments = by_kind(objects, "Deployment")
    egress = {n: next(e["value"] for e in d["spec"]["template"]["spec"]["containers"][0]["env"] if e["name"] == "EGRESS_URL")
              for n, d in deployments.items() if n.startswith("svc-")}
    assert egress["svc-01"].startswith(f"https://router-1.{render.namespace_of(manifest.load(topology))}.svc.cluster.local:")
    assert egress["svc-12"] == ""


def test_central_entity_is_pinned_to_the_gateway_and_services_reach_only_it(tmp_path):
    _, objects = rendered("central-entity", 5, tmp_path)
    central = by_kind(objects, "Deployment")["central-entity"]
    assert central["spec"]["template"]["spec"]["nodeSelector"] == {NODE_LABEL: "gateway"}
    policy = by_kind(objects, "NetworkPolicy")["services"]["spec"]
    assert policy["ingress"][0]["from"][0]["podSelector"]["matchExpressions"][0]["values"] == ["central-entity"]
    assert policy["egress"][1]["to"][0]["podSelector"]["matchExpressions"][0]["values"] == ["central-entity"]


def test_baseline_lets_services_call_each_other_and_runs_no_opa(tmp_path):
    _, objects = rendered("baseline", 5, tmp_path)
    containers = [c["name"] for o in objects if o["kind"] == "Deployment" for c in o["spec"]["template"]["spec"]["containers"]]
    assert "opa" not in containers
    policy = by_kind(objects, "NetworkPolicy")["services"]["spec"]
    assert policy["egress"][1]["to"][0]["podSelector"]["matchExpressions"][0]["values"] == ["service"]


# Two entries of a manifest with `replicas:`, over the three service nodes.
REPLICATED = {"services": [{"id": "ingest", "step": "ingest", "region": "EU", "purposes": ["care"], "replicas": 2},
                           {"id": "store", "step": "store", "region": "EU", "purposes": ["care"], "replicas": 3}]}


def cluster_address(cluster) -> str:
    """The one address an Envoy cluster sends to."""
    [address] = [value["address"] for key, value in walk(cluster["load_assignment"]) if key == "socket_address"]
    return address


@pytest.mark.parametrize("topology", ["sidecar", "dynamic-router-3"])
def test_each_replica_is_a_deployment_and_service_of_its_own_with_its_own_identity_and_node_allowed(topology, tmp_path):
    path, objects = rendered(topology, None, tmp_path, overrides=REPLICATED)
    assert validate.validate(path) == []
    deployments, services, found = by_kind(objects, "Deployment"), by_kind(objects, "Service"), secrets(objects)
    namespace = render.namespace_of(manifest.load(topology, overrides=REPLICATED))
    # Every Envoy's clusters by name (an instance's is named as it), wherever a point runs.
    clusters = [cluster for pod in pods(objects).values() for container in containers(pod) if container["name"] == "envoy"
                for cluster in envoy_config(objects, pod, container)[1]["static_resources"]["clusters"]]
    for entry, count in (("ingest", 2), ("store", 3)):
        # The entry itself is no workload: a replica is an instance, not a pod of a Deployment with replicas > 1.
        assert entry not in deployments and entry not in services
        nodes = set()
        for replica in (f"{entry}-{n}" for n in range(1, count + 1)):
            assert deployments[replica]["spec"]["replicas"] == 1
            pod = deployments[replica]["spec"]["template"]["spec"]
            nodes.add(pod["nodeSelector"][NODE_LABEL])
            assert services[replica]["spec"]["selector"] == {"app": replica, "topology": topology}
            assert uri_sans(decoded(found[f"tls-{replica}"])["tls.crt"]) == [pki.spiffe_id("service", replica)]
            service = env_of(next(c for c in pod["containers"] if c["name"] == "service"))
            assert service["INSTANCE_ID"] == replica and service["AUDIT_LOG"].endswith(f"/{replica}.jsonl")
            # The points reach the instance at its own Service, never at another replica's, and
            # expect its own identity there (its sidecar's, where the sidecar receives for it).
            toward = [c for c in clusters if c["name"] == replica]
            assert {cluster_address(c) for c in toward} == {f"{replica}.{namespace}.svc.cluster.local"}, replica
            receiver = pki.spiffe_id("point", f"sidecar-{replica}") if topology == "sidecar" else pki.spiffe_id("service", replica)
            assert {v for c in toward for _, v in walk(c["transport_socket"]) if str(v).startswith("spiffe://")} == {receiver}
        assert len(nodes) == count, entry


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
    assert users == [f"{render.RUN_AS}:{render.RUN_AS}"]


@pytest.mark.parametrize("topology", TOPOLOGIES)
def test_admin_decisions_and_opa_api_are_private_sockets_and_probes_use_readiness_and_diagnostics(topology, tmp_path):
    """Envoy's admin, OPA's decision port and REST API are sockets in a memory emptyDir that only
    the point's Envoy and OPA containers mount: not the service beside a sidecar, which shares
    the pod's loopback."""
    net = render.KubernetesNetwork
    _, objects = rendered(topology, 5, tmp_path)
    envoys = [o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"].startswith("envoy-")]
    socket = lambda name: f"{render.PRIVATE_MOUNT}/{name}"
    for configmap in envoys:
        envoy = json.loads(configmap["data"]["envoy.json"])
        assert envoy["admin"]["address"] == {"pipe": {"path": socket(ADMIN_SOCKET), "mode": 0o600}}
        assert all("pipe" not in listener["address"] for listener in envoy["static_resources"]["listeners"])
        ready = next(l for l in envoy["static_resources"]["listeners"] if l["name"] == "ready")
        assert ready["address"]["socket_address"] == {"address": "0.0.0.0", "port_value": net.ENVOY_READY}
        for cluster in [c for c in envoy["static_resources"]["clusters"] if c["name"] == "opa"]:
            assert cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"] == {"pipe": {"path": socket(DECISION_SOCKET)}}
    for name, pod in pods(objects).items():
        mounting = set()
        for container in pod["containers"] + pod.get("initContainers", []):
            probes = [container["readinessProbe"], container["livenessProbe"]]
            if any(m["name"] == render.PRIVATE_VOLUME for m in container.get("volumeMounts", [])):
                assert render.PRIVATE in container["volumeMounts"], (name, container["name"])
                mounting.add(container["name"])
            if container["name"] == "opa":
                assert f"--addr=unix://{socket(API_SOCKET)}" in container["args"] and "--authorization=basic" in container["args"]
                assert "--unix-socket-perm=600" in container["args"]
                assert f"--diagnostic-addr=0.0.0.0:{net.OPA_DIAGNOSTIC}" in container["args"]
                assert {p["httpGet"]["port"] for p in probes} == {net.OPA_DIAGNOSTIC}
            elif container["name"] == "envoy":
                assert {(p["httpGet"]["path"], p["httpGet"]["port"]) for p in probes} == {("/ready", net.ENVOY_READY)}
            elif container["name"] == render.BUNDLE_SERVER:
                # With mutual TLS it answers /health to the control plane's certificate only: a TCP probe.
                assert all(p["tcpSocket"] == {"port": net.BUNDLES} for p in probes)
            elif any("127.0.0.1" == e["value"] for e in container["env"] if e["name"] == "HOST"):
                # Beside its sidecar the service listens on the pod's loopback: the probe runs inside.
                assert all(p == render.service_probe(net.SERVICE, beside=True, mtls=True) for p in probes)
                assert all("exec" in p and "connect(3000, '127.0.0.1')" in p["exec"]["command"][-1] for p in probes)
            else:
                # With mutual TLS GET /health needs the control plane's certificate: a TCP probe.
                assert all(p["tcpSocket"] == {"port": net.SERVICE} for p in probes)
        points = {c["name"] for c in pod["containers"] + pod.get("initContainers", [])} & {"envoy", "opa"}
        assert mounting == points, (name, mounting)
        volumes = [v for v in pod["volumes"] if v["name"] == render.PRIVATE_VOLUME]
        assert volumes == ([{"name": render.PRIVATE_VOLUME, "emptyDir": {"medium": "Memory"}}] if points else []), name


@pytest.mark.parametrize("topology", ["sidecar", "central-entity"])
def test_without_mtls_services_are_probed_on_get_health(topology, tmp_path):
    _, objects = rendered(topology, 3, tmp_path, overrides=PLAIN)
    for name, pod in pods(objects).items():
        for container in [c for c in pod["containers"] if c["name"] == "service"]:
            probe = container["readinessProbe"]
            if topology == "sidecar":
                assert "http://127.0.0.1:3000/health" in probe["exec"]["command"][-1], name
            else:
                assert probe["httpGet"] == {"path": "/health", "port": render.KubernetesNetwork.SERVICE}, name


@pytest.mark.parametrize("topology", TOPOLOGIES)
def test_network_policies_admit_no_peer_to_admin_opa_or_probe_ports_denied(topology, tmp_path):
    net = render.KubernetesNetwork
    _, objects = rendered(topology, 5, tmp_path)
    closed = {net.ENVOY_READY, net.OPA_DIAGNOSTIC}  # the rest listens on no port (private sockets)
    policies = by_kind(objects, "NetworkPolicy")
    assert policies
    for name, policy in policies.items():
        admitted = {p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"]}
        assert admitted and not admitted & closed, (name, admitted)


@pytest.mark.parametrize("topology", TOPOLOGIES)
def test_every_container_runs_an_image_make_images_builds_never_pulled(topology, tmp_path):
    _, objects = rendered(topology, 5, tmp_path)
    for name, pod in pods(objects).items():
        for container in pod["containers"] + pod.get("initContainers", []):
            assert container["image"] in images.IMAGES.values(), (name, container["image"])
            assert container["imagePullPolicy"] == "IfNotPresent", name


@pytest.mark.parametrize("topology", ["sidecar", "dynamic-router-6", "baseline"])
def test_a_one_node_rendering_puts_every_pod_on_the_node_labelled_for_all_roles(topology, tmp_path):
    loaded = manifest.load(topology, services=5)
    spread = objects_of(render.render(loaded, tmp_path / "spread", of_manifest(loaded)))
    one = objects_of(render.render(loaded, tmp_path / "one", of_manifest(loaded), one_node=True))
    assert {name: pod["nodeSelector"] for name, pod in pods(one).items()} == {name: {ROLE_LABEL: "all"} for name in pods(spread)}
    # The same workloads, Services and policies; only where the pods go differs.
    assert sorted((o["kind"], o["metadata"]["name"]) for o in one if o["kind"] not in ("ConfigMap", "Secret")) == \
        sorted((o["kind"], o["metadata"]["name"]) for o in spread if o["kind"] not in ("ConfigMap", "Secret"))
    if topology == "dynamic-router-6":  # one router pod per slot, carrying every node's routers, still node-local
        routers = {o["metadata"]["name"]: o for o in one if o["kind"] == "Service" and o["metadata"]["name"].startswith("router-")}
        assert sorted(routers) == ["router-1", "router-2"] and all(r["spec"]["internalTrafficPolicy"] == "Local" for r in routers.values())


@pytest.mark.parametrize("topology", ["sidecar", "central-entity"])
def test_pods_are_annotated_for_prometheus_and_only_the_monitoring_namespace_reaches_their_metrics_allowed(topology, tmp_path):
    """Every pod with an Envoy says where its point's metrics listener is (its OPA's path beside it),
    every service pod without one its service's /metrics; each NetworkPolicy admits those ports from
    the namespaces labelled for monitoring, and no other rule names a namespace: the scraper's
    credential is a Secret of its own."""
    path, objects = rendered(topology, 3, tmp_path)
    assert validate.validate(path) == []
    for name, workload in {**by_kind(objects, "Deployment"), **by_kind(objects, "DaemonSet")}.items():
        names = {c["name"] for c in containers(workload["spec"]["template"]["spec"])}
        annotations = workload["spec"]["template"]["metadata"].get("annotations", {})
        if name == render.BUNDLE_SERVER:
            assert "prometheus.io/scrape" not in annotations
            continue
        port = render.KubernetesNetwork.METRICS if "envoy" in names else render.KubernetesNetwork.SERVICE
        assert {key: annotations.get(key) for key in ("prometheus.io/scrape", "prometheus.io/port", "prometheus.io/path", "prometheus.io/scheme")} == {
            "prometheus.io/scrape": "true", "prometheus.io/port": str(port), "prometheus.io/path": "/metrics", "prometheus.io/scheme": "https"}, name
        assert annotations.get(render.OPA_METRICS_ANNOTATION) == ("/metrics/opa" if "opa" in names else None), name
        if "envoy" in names:
            envoy = next(c for c in containers(workload["spec"]["template"]["spec"]) if c["name"] == "envoy")
            assert {"name": "metrics", "containerPort": render.KubernetesNetwork.METRICS} in envoy["ports"]
    scraper = {"namespaceSelector": {"matchLabels": {render.MONITORING_NAMESPACE_LABEL: render.MONITORING_NAMESPACE_VALUE}}}
    for name, policy in by_kind(objects, "NetworkPolicy").items():
        from_namespaces = [rule for rule in policy["spec"]["ingress"] if any("namespaceSelector" in peer for peer in rule.get("from", []))]
        if name == render.BUNDLE_SERVER:
            assert from_namespaces == []
            continue
        [rule] = from_namespaces
        assert rule["from"] == [scraper], name
        assert render.KubernetesNetwork.METRICS in {port["port"] for port in rule["ports"]}, name
    assert "tls-monitoring" in secrets(objects)
