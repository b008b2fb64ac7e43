"""Kubernetes manifests: every topology renders from its manifest and passes strict offline validation."""

import base64
import contextlib
import json
import subprocess
import time
import urllib.request

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from complyroute import deployment, kubernetes, kubetrust, manifest, pki
from complyroute.deployment import POLICIES

TOPOLOGIES = ["sidecar", "central-entity", "dynamic-router-3", "dynamic-router-6", "baseline"]


PLAIN = {"security": {"mtls": False, "label_tokens": False}}


def rendered(topology, services, tmp_path, engine=None, overrides=None):
    text = kubernetes.render(manifest.load(topology, services=services, engine=engine, overrides=overrides), tmp_path / "kustomization")
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
    assert max(configmap_bytes(o) for o in objects if o["kind"] == "ConfigMap") <= kubernetes.CONFIGMAP_BUDGET


def configmap_bytes(configmap) -> int:
    """What a ConfigMap holds, keys and values (the API server counts the values: at most 1 MiB)."""
    return sum(len(key.encode()) + len(value.encode()) for key, value in configmap.get("data", {}).items())


def connection_managers(envoy) -> dict[str, dict]:
    """Every listener's HttpConnectionManager, by listener."""
    return {l["name"]: f["typed_config"] for l in envoy["static_resources"]["listeners"]
            for chain in l["filter_chains"] for f in chain["filters"] if "route_config" in f["typed_config"] or "rds" in f["typed_config"]}


def mounted_files(objects, pod, container) -> dict[str, str]:
    """Every file the container's ConfigMap, Secret and projected volumes show it, by path. A path
    two volumes or two sources of a projected volume would both put there fails."""
    configmaps, stored = by_kind(objects, "ConfigMap"), by_kind(objects, "Secret")
    volumes = {v["name"]: v for v in pod["volumes"]}
    files = {}
    for mount in container.get("volumeMounts", []):
        volume = volumes[mount["name"]]
        if "configMap" in volume:
            sources = [(configmaps[volume["configMap"]["name"]]["data"], volume["configMap"].get("items"))]
        elif "secret" in volume:
            sources = [(decoded(stored[volume["secret"]["secretName"]]), None)]
        elif "projected" in volume:
            sources = [(configmaps[s["configMap"]["name"]]["data"], s["configMap"].get("items")) for s in volume["projected"]["sources"]]
        else:
            continue
        for data, items in sources:
            paths = {i["key"]: i["path"] for i in items} if items else {key: key for key in data}
            for key, path in paths.items():
                assert f"{mount['mountPath']}/{path}" not in files, (mount, path)
                files[f"{mount['mountPath']}/{path}"] = data[key]
    return files


BIG = [("central-entity", "central-entity"), ("dynamic-router-3", "router-1")]


# With mutual TLS and label tokens a compiled central entity or router set at 50 services
# holds 49 matcher trees with a TLS context and a token check each: over 1 MiB. Its route
# configurations go into files Envoy reads from ConfigMaps of their own.
@pytest.mark.parametrize("topology", ["sidecar", "central-entity", "dynamic-router-3", "dynamic-router-6"])
def test_compiled_engine_renders_valid_configmaps_under_the_size_limit_allowed(topology, tmp_path):
    path, objects = rendered(topology, 50, tmp_path, engine="envoy-compiled")
    result = kubernetes.validate(path)
    assert result.returncode == 0, result.stdout + result.stderr
    configmaps = [o for o in objects if o["kind"] == "ConfigMap"]
    assert '"matcher"' in "".join(v for o in configmaps for v in o["data"].values()), "the compiled engine's matcher trees"
    # The API server refuses a ConfigMap over 1 MiB; the renderer leaves a margin.
    assert max(configmap_bytes(o) for o in configmaps) <= kubernetes.CONFIGMAP_BUDGET < kubernetes.CONFIGMAP_LIMIT
    split = {name for name in by_kind(objects, "ConfigMap") if name.startswith("routes-")}
    assert bool(split) == (topology in dict(BIG)), split


@pytest.mark.parametrize("budget", [None, 500_000], ids=["budget", "two-configmaps"])
@pytest.mark.parametrize("topology, point", BIG)
def test_every_route_file_a_listener_names_is_in_one_configmap_mounted_where_it_reads_allowed(topology, point, budget, tmp_path, monkeypatch):
    if budget:  # the route files of the central entity fill two ConfigMaps of 500,000 bytes
        monkeypatch.setattr(kubernetes, "CONFIGMAP_BUDGET", budget)
    path, objects = rendered(topology, 50, tmp_path, engine="envoy-compiled")
    result = kubernetes.validate(path)
    assert result.returncode == 0, result.stdout + result.stderr
    configmaps = by_kind(objects, "ConfigMap")
    assert max(configmap_bytes(o) for o in configmaps.values()) <= (budget or kubernetes.CONFIGMAP_BUDGET)
    pod = pods(objects)[point]
    envoy_container = next(c for c in containers(pod) if c["name"] == "envoy")
    _, envoy = envoy_config(objects, pod, envoy_container)
    managers = connection_managers(envoy)
    assert len(managers) == len(envoy["static_resources"]["listeners"])
    assert not any("route_config" in manager for manager in managers.values())
    files = mounted_files(objects, pod, envoy_container)
    for listener, manager in managers.items():
        rds = manager["rds"]
        # Envoy reads a file again when the kubelet swaps the volume's contents (a rename in the folder).
        assert rds["config_source"] == {"path_config_source": {"path": f"{kubernetes.ROUTES_MOUNT}/{listener}.json",
                                                               "watched_directory": {"path": kubernetes.ROUTES_MOUNT}},
                                        "resource_api_version": "V3"}
        holding = [name for name, o in configmaps.items() if f"{listener}.json" in o["data"]]
        assert len(holding) == 1, (listener, holding)
        response = json.loads(files[rds["config_source"]["path_config_source"]["path"]])
        assert response["version_info"] == "1" and len(response["resources"]) == 1
        assert response["resources"][0]["@type"] == kubernetes.ROUTE_CONFIGURATION
        assert response["resources"][0]["name"] == rds["route_config_name"] == listener
    routes = [name for name in configmaps if name.startswith(f"routes-{point}-")]
    assert len(routes) == (2 if budget else 1)
    projected = next(v for v in pod["volumes"] if v["name"] == f"routes-{point}")
    assert sorted(s["configMap"]["name"] for s in projected["projected"]["sources"]) == sorted(routes)
    assert [m for m in envoy_container["volumeMounts"] if m["name"] == f"routes-{point}"] == [
        {"name": f"routes-{point}", "mountPath": kubernetes.ROUTES_MOUNT, "readOnly": True}]
    # Only that point's Envoy reads them.
    assert [(w, c["name"]) for w, p in pods(objects).items() for c in containers(p)
            if any(m["mountPath"] == kubernetes.ROUTES_MOUNT for m in c.get("volumeMounts", []))] == [(point, "envoy")]


@pytest.mark.parametrize("topology, point", BIG)
def test_a_configuration_that_fits_keeps_its_route_configurations_inline_denied(topology, point, tmp_path):
    _, objects = rendered(topology, 5, tmp_path, engine="envoy-compiled")
    assert not [name for name in by_kind(objects, "ConfigMap") if name.startswith("routes-")]
    for workload, pod in pods(objects).items():
        assert not any("projected" in v for v in pod["volumes"]), workload
        for container in [c for c in containers(pod) if c["name"] == "envoy"]:
            assert [m["mountPath"] for m in container["volumeMounts"]] == ["/config", kubetrust.MOUNT]
            _, envoy = envoy_config(objects, pod, container)
            managers = connection_managers(envoy)
            assert managers and all("route_config" in m and "rds" not in m for m in managers.values()), workload


def test_split_routes_moves_every_route_configuration_and_leaves_the_bootstrap_it_was_given():
    manager = lambda name: {"stat_prefix": name, "route_config": {"name": name, "virtual_hosts": []}, "http_filters": []}
    listener = lambda name: {"name": name, "filter_chains": [{"filters": [{"name": "hcm", "typed_config": manager(name)}]}]}
    envoy = {"static_resources": {"listeners": [listener("a"), listener("b")], "clusters": []}}
    bootstrap, files = kubernetes.split_routes(envoy, kubernetes.ROUTES_MOUNT)
    assert envoy["static_resources"]["listeners"][0] == listener("a")
    assert list(connection_managers(bootstrap)["a"]) == ["stat_prefix", "rds", "http_filters"]
    assert connection_managers(bootstrap)["b"]["rds"]["config_source"]["path_config_source"]["path"] == "/etc/envoy/routes/b.json"
    assert json.loads(files["a.json"]) == {"version_info": "1", "resources": [{"@type": kubernetes.ROUTE_CONFIGURATION, "name": "a", "virtual_hosts": []}]}


def test_route_files_fill_configmaps_in_turn_and_one_too_large_is_refused_denied():
    files = {"a.json": "x" * 10, "b.json": "y" * 10, "c.json": "z" * 10}  # 16 bytes each, key and value
    assert kubernetes.pack(files, budget=32) == [{"a.json": "x" * 10, "b.json": "y" * 10}, {"c.json": "z" * 10}]
    assert kubernetes.pack(files, budget=48) == [files]
    assert kubernetes.pack({}) == []
    with pytest.raises(kubernetes.RenderError, match="b.json is 26 bytes, over the 16 bytes"):
        kubernetes.pack({"a.json": "x" * 10, "b.json": "y" * 20}, budget=16)


# ---- Envoy reads the split configuration: its route files as it reads route_config inline

def local_bootstrap(files: dict[str, str], config: str, folder) -> str:
    """The container's files written under `folder`, and its bootstrap (the file `config`) made
    to run on this machine: the paths it reads moved under `folder`, the admin and every listener
    on 127.0.0.1 at a port the kernel picks, every cluster at 127.0.0.1 (no DNS to wait for)."""
    for path, content in files.items():
        (folder / path.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
        (folder / path.lstrip("/")).write_text(content)
    text = files[config]
    for directory in sorted({path.rsplit("/", 1)[0] for path in files}, key=len, reverse=True):
        text = text.replace(f'"{directory}/', f'"{folder}{directory}/').replace(f'"{directory}"', f'"{folder}{directory}"')
    envoy = json.loads(text)
    loopback = {"address": "127.0.0.1", "port_value": 0}
    envoy["admin"]["address"]["socket_address"] = loopback
    for listener in envoy["static_resources"]["listeners"]:
        listener["address"]["socket_address"] = loopback
    for cluster in envoy["static_resources"]["clusters"]:
        cluster["type"] = "STATIC"
        for _, address in [(k, v) for k, v in walk(cluster["load_assignment"]) if k == "socket_address"]:
            address["address"] = "127.0.0.1"
    (folder / "bootstrap.json").write_text(json.dumps(envoy))
    return str(folder / "bootstrap.json")


@contextlib.contextmanager
def running_envoy(bootstrap: str):
    """A real Envoy on `bootstrap`, without hot restart (no shared memory, no --base-id to pick);
    unknown fields in what it loads from files are errors. Yields a function that waits until it
    serves (LIVE) and returns the route configurations it loaded: {"static"|"dynamic": {name: config}}."""
    admin_file, log = f"{bootstrap}.admin", f"{bootstrap}.log"
    with open(log, "w") as out:
        process = subprocess.Popen([deployment.envoy_binary(), "-c", bootstrap, "--disable-hot-restart", "--concurrency", "1",
                                    "--reject-unknown-dynamic-fields", "--log-level", "warn", "--admin-address-path", admin_file],
                                   stdout=out, stderr=subprocess.STDOUT)

    def loaded() -> dict[str, dict]:
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None and time.monotonic() < deadline, open(log).read()[-3000:]
            try:
                admin = open(admin_file).read().strip()
                if admin and json.load(urllib.request.urlopen(f"http://{admin}/server_info", timeout=5))["state"] == "LIVE":
                    break
            except (OSError, ValueError):
                pass
            time.sleep(0.1)
        dump = lambda kind: json.load(urllib.request.urlopen(f"http://{admin}/config_dump?resource={kind}_route_configs", timeout=30))
        return {kind: {c["route_config"]["name"]: c["route_config"] for c in dump(kind).get("configs", [])} for kind in ("static", "dynamic")}

    try:
        yield loaded
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture(scope="module")
def split_central_entity(tmp_path_factory):
    """The compiled central entity at 50 services, mutual TLS on: its Envoy container's files as
    the pod mounts them, its bootstrap's path, and the configuration before the split."""
    renderer = kubernetes.Renderer(manifest.load("central-entity", services=50, engine="envoy-compiled"))
    renderer.render()
    objects = [o for o in yaml.safe_load_all(kubernetes.build(renderer, tmp_path_factory.mktemp("render") / "kustomization")) if o]
    pod = pods(objects)["central-entity"]
    container = next(c for c in pod["containers"] if c["name"] == "envoy")
    return mounted_files(objects, pod, container), container["args"][container["args"].index("-c") + 1], renderer.configs["central-entity"].envoy


def test_envoy_loads_every_route_file_of_a_split_configuration_as_it_loads_them_inline_allowed(split_central_entity, tmp_path):
    files, config, whole = split_central_entity
    split = local_bootstrap(files, config, tmp_path / "split")
    names = [m["rds"]["route_config_name"] for m in connection_managers(json.loads(files[config])).values()]
    assert len(names) == 51  # the entry, 49 hops, the readiness listener
    result = subprocess.run([deployment.envoy_binary(), "--mode", "validate", "-c", split, "--log-level", "error"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    # Validation only checks the route files exist: a real Envoy loads them, and one on the whole
    # configuration (over 1 MiB, fine on disk) shows what it makes of the same routes inline.
    inline = local_bootstrap({**files, config: json.dumps(whole)}, config, tmp_path / "inline")
    # One after the other: each route file costs Envoy an inotify instance, of the 128 a user
    # holds by default (fs.inotify.max_user_instances).
    with running_envoy(split) as loaded:
        read = loaded()
    with running_envoy(inline) as loaded:
        expected = loaded()
    assert read["static"] == {} and sorted(read["dynamic"]) == sorted(names)
    assert expected["dynamic"] == {} and read["dynamic"] == expected["static"]


def test_envoy_refuses_a_route_file_that_is_missing_or_malformed_denied(split_central_entity, tmp_path):
    files, config, _ = split_central_entity
    route_file = f"{kubernetes.ROUTES_MOUNT}/from-svc-07.json"
    missing = local_bootstrap({path: content for path, content in files.items() if path != route_file}, config, tmp_path / "missing")
    result = subprocess.run([deployment.envoy_binary(), "--mode", "validate", "-c", missing], capture_output=True, text=True)
    assert result.returncode != 0 and "from-svc-07.json' does not exist" in result.stdout + result.stderr
    # Validation takes a malformed file; Envoy refuses it when it loads it, and serves without those routes.
    response = json.loads(files[route_file])
    response["resources"][0]["virtual_host"] = response["resources"][0].pop("virtual_hosts")
    malformed = local_bootstrap({**files, route_file: json.dumps(response)}, config, tmp_path / "malformed")
    result = subprocess.run([deployment.envoy_binary(), "--mode", "validate", "-c", malformed], capture_output=True, text=True)
    assert result.returncode == 0
    with running_envoy(malformed) as loaded:
        read = loaded()
    assert "from-svc-07" not in read["dynamic"] and len(read["dynamic"]) == 50


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
    assert egress["svc-01"].startswith(f"https://router-1.{kubernetes.namespace_of(manifest.load(topology))}.svc.cluster.local:")
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
                # Beside its sidecar the service listens on the pod's loopback: the probe runs inside.
                assert all(p == kubernetes.service_probe(net.SERVICE, beside=True, mtls=True) for p in probes)
                assert all("exec" in p and "connect(3000, '127.0.0.1')" in p["exec"]["command"][-1] for p in probes)
            else:
                # With mutual TLS GET /health needs the control plane's certificate: a TCP probe.
                assert all(p["tcpSocket"] == {"port": net.SERVICE} for p in probes)


@pytest.mark.parametrize("topology", ["sidecar", "central-entity"])
def test_without_mtls_services_are_probed_on_get_health(topology, tmp_path):
    _, objects = rendered(topology, 3, tmp_path, overrides=PLAIN)
    for name, pod in pods(objects).items():
        for container in [c for c in pod["containers"] if c["name"] == "service"]:
            probe = container["readinessProbe"]
            if topology == "sidecar":
                assert "http://127.0.0.1:3000/health" in probe["exec"]["command"][-1], name
            else:
                assert probe["httpGet"] == {"path": "/health", "port": kubernetes.KubernetesNetwork.SERVICE}, name


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


# ---- mutual TLS and label tokens (kubetrust.py)

def secrets(objects):
    """Secrets by the name the renderer gave them (kustomize appends a hash of the content)."""
    return {o["metadata"]["name"].rsplit("-", 1)[0]: o for o in objects if o["kind"] == "Secret"}


def decoded(secret) -> dict:
    return {key: base64.b64decode(value).decode() for key, value in secret["data"].items()}


def uri_sans(pem: str) -> list[str]:
    cert = x509.load_pem_x509_certificate(pem.encode())
    return cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(x509.UniformResourceIdentifier)


def containers(pod):
    return pod["containers"] + pod.get("initContainers", [])


def secret_mounts(pod, container) -> dict:
    """mountPath -> the (hashed) name of the Secret mounted there in this container."""
    volumes = {v["name"]: v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
    return {m["mountPath"]: volumes[m["name"]] for m in container.get("volumeMounts", []) if m["name"] in volumes}


def envoy_config(objects, pod, container) -> tuple[str, dict]:
    """The point an Envoy container runs (its ConfigMap's volume is envoy-<point>) and its configuration."""
    mount = next(m for m in container["volumeMounts"] if m["mountPath"] == "/config")
    configmap = next(v["configMap"]["name"] for v in pod["volumes"] if v["name"] == mount["name"])
    return mount["name"].removeprefix("envoy-"), json.loads(by_kind(objects, "ConfigMap")[configmap]["data"]["envoy.json"])


def tls_filenames(node) -> list[str]:
    """Every file a transport socket of an Envoy configuration reads."""
    found = []
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "transport_socket":
                found += [v for k, v in walk(value) if k == "filename"]
            else:
                found += tls_filenames(value)
    elif isinstance(node, list):
        for value in node:
            found += tls_filenames(value)
    return found


def walk(node):
    if isinstance(node, dict):
        for key, value in node.items():
            yield key, value
            yield from walk(value)
    elif isinstance(node, list):
        for value in node:
            yield from walk(value)


def env_of(container) -> dict:
    return {e["name"]: e["value"] for e in container["env"]}


ENTRY = {"sidecar": "entry", "central-entity": "central-entity", "dynamic-router-3": "entry", "dynamic-router-6": "entry"}


@pytest.mark.parametrize("topology", TOPOLOGIES)
def test_every_part_has_its_own_tls_secret_issued_by_one_ca_allowed(topology, tmp_path):
    _, objects = rendered(topology, 5, tmp_path)
    found = secrets(objects)
    points = {name.removeprefix("envoy-").rsplit("-", 1)[0] for name in by_kind(objects, "ConfigMap") if name.startswith("envoy-")}
    expected = {f"tls-{p}": pki.spiffe_id("point", p) for p in points}
    expected |= {f"tls-{i.id}": pki.spiffe_id("service", i.id) for i in manifest.load(topology, services=5).instances}
    assert {name for name in found if name.startswith("tls-")} == set(expected)
    authorities = set()
    for name, part in expected.items():
        assert found[name]["type"] == "kubernetes.io/tls"
        files = decoded(found[name])
        assert set(files) == {"tls.crt", "tls.key", "ca.crt"}
        assert uri_sans(files["tls.crt"]) == [part]
        cert, ca = x509.load_pem_x509_certificate(files["tls.crt"].encode()), x509.load_pem_x509_certificate(files["ca.crt"].encode())
        cert.verify_directly_issued_by(ca)
        key = serialization.load_pem_private_key(files["tls.key"].encode(), None)
        assert key.public_key().public_numbers() == cert.public_key().public_numbers()
        authorities.add(files["ca.crt"])
    assert len(authorities) == 1  # one CA per deployment, whose key is written nowhere


@pytest.mark.parametrize("topology", TOPOLOGIES)
def test_no_private_key_in_a_configmap_and_the_signing_key_only_in_the_entrys_secret_denied(topology, tmp_path):
    _, objects = rendered(topology, 5, tmp_path)
    configmaps = [value for o in objects if o["kind"] == "ConfigMap" for value in o["data"].values()]
    assert not any("PRIVATE KEY" in value for value in configmaps)
    found = secrets(objects)
    tokens = [name for name in found if name.startswith("token-")]
    if topology == "baseline":  # nothing decides, so nothing signs
        assert tokens == []
        return
    entry = ENTRY[topology]
    assert tokens == [f"token-{entry}"] and found[f"token-{entry}"]["type"] == "Opaque"
    token = json.loads(decoded(found[f"token-{entry}"])[kubetrust.TOKEN_FILE])["complyroute"]["token"]
    private = token["jwk"]["d"]
    assert not any(private in value for value in configmaps)
    assert [name for name, secret in found.items() if any(private in v for v in decoded(secret).values())] == [f"token-{entry}"]
    # The later points verify with the public key only, from their Envoy configuration.
    assert any(token["jwk"]["x"] in value and '"d"' not in value for value in configmaps)
    # Only the entry's OPA mounts the key, as a second data path beside its catalog.
    mounting = [(workload, c["name"]) for workload, pod in pods(objects).items() for c in containers(pod)
                if any(m["name"] == f"token-{entry}" for m in c.get("volumeMounts", []))]
    assert mounting == [(entry, "opa")]
    opa = next(c for c in pods(objects)[entry]["containers"] if c["name"] == "opa")
    assert opa["args"][-3:] == ["/policy", "/catalog", kubetrust.TOKEN_MOUNT]
    assert secret_mounts(pods(objects)[entry], opa) == {kubetrust.TOKEN_MOUNT: found[f"token-{entry}"]["metadata"]["name"]}


@pytest.mark.parametrize("engine", manifest.ENGINES)
@pytest.mark.parametrize("topology", TOPOLOGIES)
def test_every_envoy_tls_file_is_in_the_secret_of_its_point_allowed(topology, engine, tmp_path):
    _, objects = rendered(topology, 5, tmp_path, engine=engine)
    found = by_kind(objects, "Secret")
    checked = 0
    for workload, pod in pods(objects).items():
        for container in [c for c in containers(pod) if c["name"] == "envoy"]:
            point, envoy = envoy_config(objects, pod, container)
            mounts = secret_mounts(pod, container)
            assert list(mounts) == [kubetrust.MOUNT], (workload, mounts)
            files = decoded(found[mounts[kubetrust.MOUNT]])
            assert uri_sans(files["tls.crt"]) == [pki.spiffe_id("point", point)]
            filenames = set(tls_filenames(envoy))
            assert filenames == {kubetrust.FILES.cert, kubetrust.FILES.key, kubetrust.FILES.ca}, (workload, filenames)
            assert all(path.rsplit("/", 1)[1] in files for path in filenames)
            checked += 1
    assert checked == len([o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"].startswith("envoy-")])


@pytest.mark.parametrize("topology", TOPOLOGIES)
def test_services_read_their_credential_from_their_mounted_secret(topology, tmp_path):
    _, objects = rendered(topology, 5, tmp_path)
    found = by_kind(objects, "Secret")
    for workload, pod in pods(objects).items():
        for container in [c for c in pod["containers"] if c["name"] == "service"]:
            env, mounts = env_of(container), secret_mounts(pod, container)
            assert list(mounts) == [kubetrust.MOUNT]
            assert (env["TLS_CERT"], env["TLS_KEY"], env["TLS_CA"]) == (kubetrust.FILES.cert, kubetrust.FILES.key, kubetrust.FILES.ca)
            files = decoded(found[mounts[kubetrust.MOUNT]])
            assert {path.rsplit("/", 1)[1] for path in (env["TLS_CERT"], env["TLS_KEY"], env["TLS_CA"])} <= set(files)
            assert uri_sans(files["tls.crt"]) == [pki.spiffe_id("service", env["INSTANCE_ID"])]
            assert env["CONTROL_PEERS"] == pki.CONTROL and env["RECORD_PEERS"]
            if env["NEXT_STEP"]:
                assert env["EGRESS_URL"].startswith("https://") and env["EGRESS_IDENTITY"].startswith("spiffe://complyroute/")
            else:
                assert env["EGRESS_URL"] == "" and "EGRESS_IDENTITY" not in env
            assert ("LABEL_TOKENS" in env) == (topology != "baseline")


def test_each_sidecar_pod_admits_only_its_own_service_and_sidecar(tmp_path):
    """Every sidecar pod's service listens on 127.0.0.1:3000 and its egress on 127.0.0.1:15002:
    the same addresses, yet each admits and expects only the parts of its own pod."""
    _, objects = rendered("sidecar", 5, tmp_path)
    for n in range(1, 6):
        instance = f"svc-{n:02d}"
        pod = pods(objects)[instance]
        service = env_of(pod["containers"][0])
        assert service["RECORD_PEERS"] == pki.spiffe_id("point", f"sidecar-{instance}")
        if n < 5:
            assert service["EGRESS_IDENTITY"] == pki.spiffe_id("point", f"sidecar-{instance}")
        _, envoy = envoy_config(objects, pod, next(c for c in pod["initContainers"] if c["name"] == "envoy"))
        peers = {}
        for item in envoy["static_resources"]["listeners"] + envoy["static_resources"]["clusters"]:
            peers[item["name"]] = sorted(m["matcher"]["exact"] for _, v in walk(item.get("filter_chains", item.get("transport_socket")))
                                         if isinstance(v, list) for m in v if isinstance(m, dict) and m.get("san_type") == "URI")
        assert peers["upstream-ingress"] == [pki.spiffe_id("service", instance)]
        assert peers["ingress"] == [pki.spiffe_id("point", "entry" if n == 1 else f"sidecar-svc-{n - 1:02d}")]
        if n < 5:
            assert peers["egress"] == [pki.spiffe_id("service", instance)]
            assert peers[f"svc-{n + 1:02d}"] == [pki.spiffe_id("point", f"sidecar-svc-{n + 1:02d}")]


@pytest.mark.parametrize("topology", TOPOLOGIES)
def test_secrets_are_mounted_read_only_for_the_pods_group(topology, tmp_path):
    _, objects = rendered(topology, 5, tmp_path)
    for workload, pod in pods(objects).items():
        assert pod["securityContext"]["fsGroup"] == kubernetes.RUN_AS
        secret_volumes = {v["name"]: v for v in pod["volumes"] if "secret" in v}
        assert secret_volumes, workload
        assert all(v["secret"]["defaultMode"] == 0o440 for v in secret_volumes.values())
        for container in containers(pod):
            assert all(m.get("readOnly") for m in container.get("volumeMounts", []) if m["name"] in secret_volumes)


def selects(peer: dict, component: str) -> bool:
    selector = peer["podSelector"]
    return selector.get("matchLabels", {}).get("component") == component or any(
        e["key"] == "component" and component in e["values"] for e in selector.get("matchExpressions", []))


def admitted(rules: list[dict], side: str, component: str, port: int) -> bool:
    """Whether any rule lets `port` to or from pods of `component` (side: "from" or "to")."""
    return any(
        any(p["port"] <= port <= p.get("endPort", p["port"]) for p in rule["ports"])
        and (side not in rule or any(selects(peer, component) for peer in rule[side]))
        for rule in rules
    )


@pytest.mark.parametrize("topology", TOPOLOGIES)
def test_network_policies_admit_every_connection_records_take_allowed(topology, tmp_path):
    _, objects = rendered(topology, 5, tmp_path)
    component = {name: w["metadata"]["labels"]["component"] for name, w in {**by_kind(objects, "Deployment"), **by_kind(objects, "DaemonSet")}.items()}
    policies = list(by_kind(objects, "NetworkPolicy").values())
    policy_of = lambda c: next(p["spec"] for p in policies if p["spec"]["podSelector"]["matchLabels"]["component"] == c)
    connections = set()  # (sending workload, receiving Service, port), over TLS
    for workload, pod in pods(objects).items():
        for container in containers(pod):
            if container["name"] == "envoy":
                _, envoy = envoy_config(objects, pod, container)
                for cluster in envoy["static_resources"]["clusters"]:
                    if "transport_socket" in cluster:
                        address = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]["socket_address"]
                        connections.add((workload, address["address"], address["port_value"]))
            elif container["name"] == "service" and env_of(container)["EGRESS_URL"]:
                host, port = env_of(container)["EGRESS_URL"].split("://")[1].rsplit(":", 1)
                connections.add((workload, host, int(port)))
    assert connections
    for sender, host, port in connections:
        if host == "127.0.0.1":
            assert component[sender] == "service"  # within a sidecar pod: no policy applies
            continue
        receiver = component[host.split(".")[0]]
        assert admitted(policy_of(receiver)["ingress"], "from", component[sender], port), (sender, host, port)
        assert admitted(policy_of(component[sender])["egress"], "to", receiver, port), (sender, host, port)


@pytest.mark.parametrize("topology", TOPOLOGIES)
def test_without_mtls_no_secret_is_rendered_denied(topology, tmp_path):
    path, objects = rendered(topology, 5, tmp_path, overrides=PLAIN)
    result = kubernetes.validate(path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert [o["metadata"]["name"] for o in objects if o["kind"] == "Secret"] == []
    assert "secretGenerator" not in yaml.safe_load((tmp_path / "kustomization" / "kustomization.yaml").read_text())
    for workload, pod in pods(objects).items():
        assert not any("secret" in v for v in pod["volumes"]), workload
        for container in containers(pod):
            assert kubetrust.TOKEN_MOUNT not in container.get("args", [])
            if container["name"] == "service":
                env = env_of(container)
                assert not {"TLS_CERT", "TLS_KEY", "TLS_CA", "RECORD_PEERS", "LABEL_TOKENS"} & set(env)
                assert not env["EGRESS_URL"].startswith("https://")
            if container["name"] == "envoy":
                assert tls_filenames(envoy_config(objects, pod, container)[1]) == []


def test_every_render_makes_a_new_ca_and_keeps_its_keys_private(tmp_path):
    first, second = (decoded(secrets(rendered("central-entity", 2, tmp_path / str(n))[1])["tls-svc-01"]) for n in (1, 2))
    assert first["ca.crt"] != second["ca.crt"] and first["tls.key"] != second["tls.key"]
    folder = tmp_path / "2" / "kustomization"
    assert folder.stat().st_mode & 0o777 == 0o700
    assert all((folder / "tls-svc-01" / name).stat().st_mode & 0o777 == 0o600 for name in first)
