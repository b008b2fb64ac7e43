"""Kubernetes manifests: every topology renders from its manifest and passes strict offline validation."""

import base64
import contextlib
import http.client
import io
import json
import os
import pickle
import re
import shutil
import socket
import ssl
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from complyroute.engines import precompute
from complyroute.policy import bundles
from complyroute.policy.policyfiles import POLICIES
from complyroute.proxy.routes import ROUTE_CONFIGURATION, split_routes
from complyroute.runtime.kubernetes import apply, images, render, validate
from complyroute.runtime.kubernetes.nodes import NODE_LABEL, ROLE_LABEL
from complyroute.runtime.local import rendering
from complyroute.runtime.local.reload import ReloadError
from complyroute.topology import manifest
from complyroute.topology.plan import ADMIN_SOCKET, API_SOCKET, DECISION_SOCKET
from complyroute.trust import kubetrust, pki

from tests.relabel import rule_set_with_label

TOPOLOGIES = ["sidecar", "central-entity", "dynamic-router-3", "dynamic-router-6", "baseline"]


PLAIN = {"security": {"mtls": False, "label_tokens": False}}


# Where each render `rendered` was asked for first was written, and what it built, by its arguments.
RENDERS: dict[tuple, tuple[Path, str]] = {}


def rendered(topology, services, tmp_path, engine=None, overrides=None):
    """The topology rendered into tmp_path/kustomization, its built YAML written beside it, and its
    objects. A render costs seconds here (OPA checks every point's quick path, kustomize builds),
    and most tests only read what the same arguments render to: each set of arguments (with the
    ConfigMap budget and the rule set's revision, which a commit or an edit of policies/ during
    the run changes) is rendered once a session, and every later test gets a copy of that
    kustomization folder and objects parsed anew, which it may change. What two renders of the
    same arguments differ in, the CA and keys, is test_every_render_makes_a_new_ca's, which
    renders anew (render_anew)."""
    key = (topology, services, engine, json.dumps(overrides, sort_keys=True), render.CONFIGMAP_BUDGET, bundles.revision())
    if key in RENDERS:
        first, text = RENDERS[key]
        shutil.copytree(first, tmp_path / "kustomization")
    else:
        text = render_anew(topology, services, tmp_path, engine, overrides)
        RENDERS[key] = (tmp_path / "kustomization", text)
    path = tmp_path / f"{topology}-{services}.yaml"
    path.write_text(text)
    return path, [o for o in yaml.safe_load_all(text) if o]


def render_anew(topology, services, tmp_path, engine=None, overrides=None) -> str:
    return render.render(manifest.load(topology, services=services, engine=engine, overrides=overrides), tmp_path / "kustomization")


def by_kind(objects, kind):
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}


@pytest.mark.parametrize("services", [5, 50])
@pytest.mark.parametrize("topology", TOPOLOGIES)
def test_rendered_manifests_pass_strict_validation_allowed(topology, services, tmp_path):
    path, objects = rendered(topology, services, tmp_path)
    assert validate.validate(path) == []
    assert max(configmap_bytes(o) for o in objects if o["kind"] == "ConfigMap") <= render.CONFIGMAP_BUDGET


def configmap_bytes(configmap) -> int:
    """What a ConfigMap holds, keys and values, binary ones as their bytes (the API server counts
    the values: at most 1 MiB)."""
    return sum(len(key.encode()) + len(value if isinstance(value, bytes) else value.encode()) for key, value in text_files(configmap).items())


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
            sources = [(text_files(configmaps[volume["configMap"]["name"]]), volume["configMap"].get("items"))]
        elif "secret" in volume:
            sources = [(decoded(stored[volume["secret"]["secretName"]]), None)]
        elif "projected" in volume:
            sources = [(text_files(configmaps[s["configMap"]["name"]]), s["configMap"].get("items")) for s in volume["projected"]["sources"]]
        else:
            continue
        for data, items in sources:
            paths = {i["key"]: i["path"] for i in items} if items else {key: key for key in data}
            for key, path in paths.items():
                assert f"{mount['mountPath']}/{path}" not in files, (mount, path)
                files[f"{mount['mountPath']}/{path}"] = data[key]
    return files


def text_files(configmap) -> dict[str, str | bytes]:
    """A ConfigMap's files: data as text, binaryData as bytes."""
    return {**configmap.get("data", {}), **{key: base64.b64decode(value) for key, value in configmap.get("binaryData", {}).items()}}


BIG = [("central-entity", "central-entity"), ("dynamic-router-3", "router-1")]


def has_matcher_tree(route_config: dict) -> bool:
    """Whether a route configuration holds the compiled engine's decisions (a virtual host's matcher tree)."""
    return any("matcher" in host for host in route_config["virtual_hosts"])


# Under the compiled engine the routes OPA decided ahead of time (each deciding listener's
# matcher tree) are files Envoy reads from ConfigMaps routes-<point>-<n> of their own, which a
# reload updates. A compiled central entity or router set at 50 services holds 49 matcher trees
# with a TLS context and a token check each: with them its bootstrap would be over 1 MiB.
@pytest.fixture(scope="module")
def compiled_at_fifty(tmp_path_factory):
    """A compiled topology of 50 services as rendered under the default ConfigMap budget, rendered
    and validated once for the tests below (compiling 49 matcher trees takes OPA most of a minute here)."""
    rendered_once = {}

    def render(topology):
        if topology not in rendered_once:
            path, objects = rendered(topology, 50, tmp_path_factory.mktemp(topology), engine="envoy-compiled")
            assert validate.validate(path) == []
            rendered_once[topology] = objects
        return rendered_once[topology]
    return render


@pytest.mark.parametrize("topology", ["sidecar", "central-entity", "dynamic-router-3", "dynamic-router-6"])
def test_compiled_engine_renders_its_matcher_trees_into_route_configmaps_under_the_size_limit_allowed(topology, compiled_at_fifty):
    objects = compiled_at_fifty(topology)
    configmaps = by_kind(objects, "ConfigMap")
    # The API server refuses a ConfigMap over 1 MiB; the renderer leaves a margin.
    assert max(configmap_bytes(o) for o in configmaps.values()) <= render.CONFIGMAP_BUDGET < render.CONFIGMAP_LIMIT
    routes = {name: o for name, o in configmaps.items() if name.startswith("routes-")}
    assert routes and all(has_matcher_tree(json.loads(value)["resources"][0]) for o in routes.values() for value in o["data"].values())
    assert not any(has_matcher_tree(manager["route_config"]) for name, o in configmaps.items() if name.startswith("envoy-")
                   for manager in connection_managers(json.loads(o["data"]["envoy.json"])).values() if "route_config" in manager)
    # Every point's route ConfigMaps are mounted by its Envoy, and by nothing else.
    for workload, pod in pods(objects).items():
        for container in containers(pod):
            projected = [s["configMap"]["name"] for v in pod["volumes"] if "projected" in v and v["name"] in
                         {m["name"] for m in container.get("volumeMounts", [])} for s in v["projected"]["sources"]]
            if container["name"] == "envoy":
                point, _ = envoy_config(objects, pod, container)
                assert projected == sorted(name for name in routes if name.rsplit("-", 1)[0] == f"routes-{point}"), workload
            else:
                assert not [name for name in projected if name in routes], (workload, container["name"])


@pytest.mark.parametrize("budget", [None, 560_000], ids=["budget", "two-configmaps"])
@pytest.mark.parametrize("topology, point", BIG)
def test_every_route_file_a_listener_names_is_in_one_configmap_mounted_where_it_reads_allowed(topology, point, budget, tmp_path, monkeypatch,
                                                                                            compiled_at_fifty):
    if budget:  # the route files of the central entity (about 600 kB) fill two ConfigMaps of 560,000 bytes
        monkeypatch.setattr(render, "CONFIGMAP_BUDGET", budget)
        path, objects = rendered(topology, 50, tmp_path, engine="envoy-compiled")
        assert validate.validate(path) == []
    else:
        objects = compiled_at_fifty(topology)
    configmaps = by_kind(objects, "ConfigMap")
    assert max(configmap_bytes(o) for o in configmaps.values()) <= (budget or render.CONFIGMAP_BUDGET)
    pod = pods(objects)[point]
    envoy_container = next(c for c in containers(pod) if c["name"] == "envoy")
    _, envoy = envoy_config(objects, pod, envoy_container)
    managers = connection_managers(envoy)
    assert len(managers) == len(envoy["static_resources"]["listeners"])
    # The 49 hops' matcher trees in files; the entry's and the readiness listener's routes, which
    # hold no decision of the rule set, stay in the bootstrap.
    inline = {listener for listener, manager in managers.items() if "route_config" in manager}
    assert len(managers) - len(inline) == 49 and not any(has_matcher_tree(managers[listener]["route_config"]) for listener in inline)
    files = mounted_files(objects, pod, envoy_container)
    for listener, manager in [(l, m) for l, m in managers.items() if l not in inline]:
        rds = manager["rds"]
        # Envoy reads a file again when the kubelet swaps the volume's contents (a rename in the folder).
        assert rds["config_source"] == {"path_config_source": {"path": f"{render.ROUTES_MOUNT}/{listener}.json",
                                                               "watched_directory": {"path": render.ROUTES_MOUNT}},
                                        "resource_api_version": "V3"}
        holding = [name for name, o in configmaps.items() if f"{listener}.json" in o.get("data", {})]
        assert len(holding) == 1, (listener, holding)
        response = json.loads(files[rds["config_source"]["path_config_source"]["path"]])
        # Its version is the rule set's revision: what Envoy's rds statistics tell of a reload.
        assert response["version_info"] == bundles.revision() and len(response["resources"]) == 1
        assert response["resources"][0]["@type"] == ROUTE_CONFIGURATION
        assert has_matcher_tree(response["resources"][0])
        assert response["resources"][0]["name"] == rds["route_config_name"] == listener
    routes = [name for name in configmaps if name.startswith(f"routes-{point}-")]
    assert len(routes) == (2 if budget else 1)
    projected = next(v for v in pod["volumes"] if v["name"] == f"routes-{point}")
    assert sorted(s["configMap"]["name"] for s in projected["projected"]["sources"]) == sorted(routes)
    assert [m for m in envoy_container["volumeMounts"] if m["name"] == f"routes-{point}"] == [
        {"name": f"routes-{point}", "mountPath": render.ROUTES_MOUNT, "readOnly": True}]
    # Only that point's Envoy reads them.
    assert [(w, c["name"]) for w, p in pods(objects).items() for c in containers(p)
            if any(m["mountPath"] == render.ROUTES_MOUNT for m in c.get("volumeMounts", []))] == [(point, "envoy")]


@pytest.mark.parametrize("engine", manifest.ENGINES)
@pytest.mark.parametrize("topology, point", BIG)
def test_only_routes_the_rule_set_decides_leave_the_bootstrap_denied(topology, point, engine, tmp_path):
    """Under envoy-opa no route depends on the rule set (OPA's answers carry every change): every
    route stays in its bootstrap. Under envoy-compiled only the matcher trees leave it."""
    _, objects = rendered(topology, 5, tmp_path, engine=engine)
    compiled = engine == "envoy-compiled"
    assert [name for name in by_kind(objects, "ConfigMap") if name.startswith("routes-")] == ([f"routes-{point}-1"] if compiled else [])
    for workload, pod in pods(objects).items():
        for container in [c for c in containers(pod) if c["name"] == "envoy"]:
            _, envoy = envoy_config(objects, pod, container)
            managers = connection_managers(envoy)
            inline = [m for m in managers.values() if "route_config" in m]
            assert inline and not any(has_matcher_tree(m["route_config"]) for m in inline), workload
            split = len(managers) - len(inline)
            assert split == (4 if compiled and workload == point else 0), (workload, split)  # the 4 hops of 5 services
            mounts = [m["mountPath"] for m in container["volumeMounts"]]
            assert mounts == (["/config", render.ROUTES_MOUNT, kubetrust.MOUNT, render.PRIVATE_MOUNT] if split
                              else ["/config", kubetrust.MOUNT, render.PRIVATE_MOUNT]), (workload, mounts)


def test_split_routes_moves_every_route_configuration_and_leaves_the_bootstrap_it_was_given():
    manager = lambda name: {"stat_prefix": name, "route_config": {"name": name, "virtual_hosts": []}, "http_filters": []}
    listener = lambda name: {"name": name, "filter_chains": [{"filters": [{"name": "hcm", "typed_config": manager(name)}]}]}
    envoy = {"static_resources": {"listeners": [listener("a"), listener("b")], "clusters": []}}
    bootstrap, files = split_routes(envoy, render.ROUTES_MOUNT)
    assert envoy["static_resources"]["listeners"][0] == listener("a")
    assert list(connection_managers(bootstrap)["a"]) == ["stat_prefix", "rds", "http_filters"]
    assert connection_managers(bootstrap)["b"]["rds"]["config_source"]["path_config_source"]["path"] == "/etc/envoy/routes/b.json"
    assert json.loads(files["a.json"]) == {"version_info": "1", "resources": [{"@type": ROUTE_CONFIGURATION, "name": "a", "virtual_hosts": []}]}


def test_route_files_fill_configmaps_in_turn_and_one_too_large_is_refused_denied():
    files = {"a.json": "x" * 10, "b.json": "y" * 10, "c.json": "z" * 10}  # 16 bytes each, key and value
    assert render.pack(files, budget=32) == [{"a.json": "x" * 10, "b.json": "y" * 10}, {"c.json": "z" * 10}]
    assert render.pack(files, budget=48) == [files]
    assert render.pack({}) == []
    with pytest.raises(render.RenderError, match="b.json is 26 bytes, over the 16 bytes"):
        render.pack({"a.json": "x" * 10, "b.json": "y" * 20}, budget=16)


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
    envoy["admin"]["address"] = {"socket_address": loopback}  # in its pod a socket in the private volume
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
        process = subprocess.Popen([rendering.envoy_binary(), "-c", bootstrap, "--disable-hot-restart", "--concurrency", "1",
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
    renderer = render.Renderer(manifest.load("central-entity", services=50, engine="envoy-compiled"))
    renderer.render()
    objects = [o for o in yaml.safe_load_all(render.build(renderer, tmp_path_factory.mktemp("render") / "kustomization")) if o]
    pod = pods(objects)["central-entity"]
    container = next(c for c in pod["containers"] if c["name"] == "envoy")
    return mounted_files(objects, pod, container), container["args"][container["args"].index("-c") + 1], renderer.configs["central-entity"].envoy


def test_envoy_loads_every_route_file_of_a_split_configuration_as_it_loads_them_inline_allowed(split_central_entity, tmp_path):
    files, config, whole = split_central_entity
    split = local_bootstrap(files, config, tmp_path / "split")
    names = [m["rds"]["route_config_name"] for m in connection_managers(json.loads(files[config])).values() if "rds" in m]
    assert len(names) == 49  # the 49 hops' matcher trees
    result = subprocess.run([rendering.envoy_binary(), "--mode", "validate", "-c", split, "--log-level", "error"], capture_output=True, text=True)
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
    assert sorted(read["dynamic"]) == sorted(names) and sorted(read["static"]) == ["entry", "ready"]
    assert expected["dynamic"] == {} and {**read["static"], **read["dynamic"]} == expected["static"]


def test_envoy_refuses_a_route_file_that_is_missing_or_malformed_denied(split_central_entity, tmp_path):
    files, config, _ = split_central_entity
    route_file = f"{render.ROUTES_MOUNT}/from-svc-07.json"
    missing = local_bootstrap({path: content for path, content in files.items() if path != route_file}, config, tmp_path / "missing")
    result = subprocess.run([rendering.envoy_binary(), "--mode", "validate", "-c", missing], capture_output=True, text=True)
    assert result.returncode != 0 and "from-svc-07.json' does not exist" in result.stdout + result.stderr
    # Validation takes a malformed file; Envoy refuses it when it loads it, and serves without those routes.
    response = json.loads(files[route_file])
    response["resources"][0]["virtual_host"] = response["resources"][0].pop("virtual_hosts")
    malformed = local_bootstrap({**files, route_file: json.dumps(response)}, config, tmp_path / "malformed")
    result = subprocess.run([rendering.envoy_binary(), "--mode", "validate", "-c", malformed], capture_output=True, text=True)
    assert result.returncode == 0
    with running_envoy(malformed) as loaded:
        read = loaded()
    assert "from-svc-07" not in read["dynamic"] and len(read["dynamic"]) == 48


def test_unknown_field_fails_strict_validation_denied(tmp_path):
    path, objects = rendered("central-entity", 5, tmp_path)
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    deployment["spec"]["template"]["spec"]["containers"][0]["imagePullPolicyy"] = "Always"
    path.write_text(yaml.safe_dump_all(objects))
    errors = validate.validate(path)
    assert len(errors) == 1 and errors[0].startswith(f"Deployment/{deployment['metadata']['name']}: spec.template.spec.containers.0:"), errors
    assert "'imagePullPolicyy' was unexpected" in errors[0]


@pytest.mark.parametrize("change, where, message", [
    (lambda d: d["spec"].update(replicas="one"), "spec.replicas", "'one' is not of type 'integer'"),
    (lambda d: d["spec"]["template"]["spec"]["containers"][0].update(ports=[{"containerPort": "http"}]),
     "spec.template.spec.containers.0.ports.0.containerPort", "'http' is not of type 'integer'"),
    (lambda d: d["metadata"]["labels"].update(x=5), "metadata.labels.x", "5 is not of type 'string'"),
    (lambda d: d["spec"].pop("selector"), "spec", "'selector' is a required property"),
], ids=["replicas", "container-port", "label", "selector"])
def test_wrong_types_and_missing_fields_fail_strict_validation_denied(change, where, message, tmp_path):
    path, objects = rendered("central-entity", 5, tmp_path)
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    change(deployment)
    path.write_text(yaml.safe_dump_all(objects))
    errors = validate.validate(path)
    assert len(errors) == 1 and errors[0].startswith(f"Deployment/{deployment['metadata']['name']}: {where}: {message}"), errors


@pytest.mark.parametrize("api_version, kind", [("apps/v1", "Deploymentt"), ("apps/v1beta1", "Deployment")], ids=["unknown-kind", "removed-version"])
def test_a_kind_without_a_schema_fails_strict_validation_denied(api_version, kind, tmp_path):
    path, objects = rendered("central-entity", 5, tmp_path)
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    deployment.update(apiVersion=api_version, kind=kind)
    path.write_text(yaml.safe_dump_all(objects))
    errors = validate.validate(path)
    assert len(errors) == 1 and errors[0].startswith(f"{kind}/{deployment['metadata']['name']}: Couldn't find schema for kind {kind}"), errors


def test_validation_uses_the_schemas_of_the_pinned_kubernetes_version_allowed(tmp_path):
    """The pinned control plane is v1.34 (tools/kubernetes/go.mod); kubernetes-validate ships its strict schemas."""
    from kubernetes_validate.utils import all_versions

    assert "k8s.io/kubernetes v" + validate.KUBERNETES_VERSION.rsplit(".", 1)[0] in (manifest.REPO / "tools" / "kubernetes" / "go.mod").read_text()
    assert validate.KUBERNETES_VERSION in all_versions()  # v1.34.0-local-strict
    path, _ = rendered("baseline", 5, tmp_path)
    assert validate.validate(path, validate.KUBERNETES_VERSION) == []


def test_validation_refuses_a_kubernetes_version_without_schemas_denied(tmp_path):
    """Rather than check against an older version's schemas, as the package would on its own."""
    from kubernetes_validate.utils import VersionNotSupportedError

    path, _ = rendered("baseline", 5, tmp_path)
    with pytest.raises(VersionNotSupportedError):
        validate.validate(path, "1.99.0")


def test_every_container_has_probes_and_resources(tmp_path):
    for topology in TOPOLOGIES:
        _, objects = rendered(topology, 5, tmp_path / topology)
        for workload in [o for o in objects if o["kind"] in ("Deployment", "DaemonSet")]:
            pod = workload["spec"]["template"]["spec"]
            for container in pod["containers"] + pod.get("initContainers", []):
                assert {"readinessProbe", "livenessProbe", "resources"} <= set(container), (topology, container["name"])
                assert container["resources"]["limits"] and container["resources"]["requests"]


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
    rule_set = bundles.rule_set_files()
    for name, bundle in bundle_files(objects).items():
        content = bundle_members(bundle)
        assert {key: content[key] for key in rule_set} == rule_set, name
        assert not [key for key in content if key.startswith(("system/", "examples/")) or key.endswith("_test.rego")], name


def bundle_files(objects) -> dict[str, bytes]:
    """Every bundle the bundle server's ConfigMaps hold, by file name (<point>.tar.gz)."""
    found = {}
    for name, configmap in by_kind(objects, "ConfigMap").items():
        if name.startswith("bundles-"):
            assert not set(configmap.get("data", {})) and not set(found) & set(configmap["binaryData"]), name
            found |= text_files(configmap)
    return found


def bundle_members(bundle: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(bundle), mode="r:gz") as tar:
        return {m.name.lstrip("/"): tar.extractfile(m).read() for m in tar.getmembers()}


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


def pods(objects):
    return {o["metadata"]["name"]: o["spec"]["template"]["spec"] for o in objects if o["kind"] in ("Deployment", "DaemonSet")}


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
    if topology != "baseline":  # nothing decides in the baseline: no bundle to serve
        expected[f"tls-{render.BUNDLE_SERVER}"] = pki.BUNDLE_SERVER
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
    configmaps = [value for o in objects if o["kind"] == "ConfigMap" for value in o.get("data", {}).values()]
    # Every bundle, unpacked: what each OPA is served.
    configmaps += [member.decode() for bundle in bundle_files(objects).values() for member in bundle_members(bundle).values()]
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
    assert opa["args"][-2:] == ["/policy", kubetrust.TOKEN_MOUNT]
    assert secret_mounts(pods(objects)[entry], opa) == {kubetrust.TOKEN_MOUNT: found[f"token-{entry}"]["metadata"]["name"],
                                                        kubetrust.MOUNT: found[f"tls-{entry}"]["metadata"]["name"]}


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
        assert pod["securityContext"]["fsGroup"] == render.RUN_AS
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
    assert validate.validate(path) == []
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
    first, second = (decoded(secrets([o for o in yaml.safe_load_all(render_anew("central-entity", 2, tmp_path / str(n))) if o])["tls-svc-01"])
                     for n in (1, 2))
    assert first["ca.crt"] != second["ca.crt"] and first["tls.key"] != second["tls.key"]
    folder = tmp_path / "2" / "kustomization"
    assert folder.stat().st_mode & 0o777 == 0o700
    assert all((folder / "tls-svc-01" / name).stat().st_mode & 0o777 == 0o600 for name in first)


# ---- the bundle server, and a rule set reaching running pods without rolling them

DECIDING = ["sidecar", "central-entity", "dynamic-router-3", "dynamic-router-6"]


def opa_point(pod, container) -> str:
    """The point an OPA container decides for: its configuration's volume is opa-config-<point>."""
    mount = next(m for m in container["volumeMounts"] if m["mountPath"] == "/config")
    return mount["name"].removeprefix("opa-config-")


def opa_containers(objects):
    """(workload, pod, container, point) of every OPA."""
    return [(workload, pod, c, opa_point(pod, c)) for workload, pod in pods(objects).items() for c in containers(pod) if c["name"] == "opa"]


def dns_sans(pem: str) -> list[str]:
    cert = x509.load_pem_x509_certificate(pem.encode())
    return cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)


@pytest.mark.parametrize("topology", DECIDING)
def test_the_bundle_server_serves_every_deciding_points_bundle_from_configmaps_named_without_a_hash_allowed(topology, tmp_path):
    _, objects = rendered(topology, 5, tmp_path)
    namespace = render.namespace_of(manifest.load(topology))
    server = by_kind(objects, "Deployment")[render.BUNDLE_SERVER]
    assert server["metadata"]["namespace"] == namespace and server["metadata"]["labels"]["component"] == render.BUNDLE_SERVER
    assert by_kind(objects, "Service")[render.BUNDLE_SERVER]["spec"]["ports"] == [
        {"name": f"p{render.KubernetesNetwork.BUNDLES}", "port": render.KubernetesNetwork.BUNDLES, "targetPort": render.KubernetesNetwork.BUNDLES}]
    pod = server["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {NODE_LABEL: "gateway"}  # where the control side lives
    [container] = pod["containers"]
    assert container["image"] == render.PYTHON_IMAGE and container["command"][:3] == ["python", "-m", "complyroute.policy.bundleserver"]
    # Its code: the module and all it imports, as they are in complyroute/.
    files = mounted_files(objects, pod, container)
    package = manifest.REPO / "complyroute"
    assert {path: content for path, content in files.items() if path.startswith(render.CODE_MOUNT)} == {
        f"{render.CODE_MOUNT}/complyroute/{name}": (package / name).read_text() for name in render.BUNDLE_SERVER_MODULES}
    # Its bundles: one per deciding point, each as that point's OPA asks for it, in ConfigMaps
    # named as they are (no hash suffix), all of them in its one projected volume.
    configmaps = by_kind(objects, "ConfigMap")
    names = sorted(name for name in configmaps if name.startswith("bundles-"))
    assert names == ["bundles-1"]
    projected = next(v for v in pod["volumes"] if v["name"] == "bundles")["projected"]["sources"]
    assert [s["configMap"]["name"] for s in projected] == names
    points = {point for *_, point in opa_containers(objects)}
    served = {path.removeprefix(f"{render.BUNDLES_MOUNT}/"): content for path, content in files.items() if path.startswith(render.BUNDLES_MOUNT)}
    assert set(served) == {f"{point}.tar.gz" for point in points} == set(bundle_files(objects))
    revision = bundles.revision()
    for name, bundle in served.items():
        content = bundle_members(bundle)
        assert json.loads(content[".manifest"])["revision"] == revision
        document = json.loads(content["data.json"])
        assert set(document) == {"complyroute", precompute.QUICK_PATH_DOCUMENT}, name
        assert set(document["complyroute"]) == {"index", "revision"} and document["complyroute"]["revision"] == revision, name
        assert set(document[precompute.QUICK_PATH_DOCUMENT]) == {"table", "digest", "set_clusters"}, name
    # Every ConfigMap the rule set fills says which revision it holds; no other one changes with it.
    rule_set = [o for o in configmaps.values() if o["metadata"].get("labels", {}).get("component") == "rule-set"]
    assert {o["metadata"]["name"] for o in rule_set} == {n for n in configmaps if n.startswith(("bundles-", "routes-"))}
    assert all(o["metadata"]["annotations"] == {render.REVISION_ANNOTATION: revision} for o in rule_set)
    assert all(re.search(r"-[a-z0-9]{10}$", n) for n in configmaps if n not in {o["metadata"]["name"] for o in rule_set})


def test_the_baseline_decides_nothing_so_renders_no_bundle_server_denied(tmp_path):
    _, objects = rendered("baseline", 5, tmp_path)
    assert render.BUNDLE_SERVER not in {**by_kind(objects, "Deployment"), **by_kind(objects, "Service"), **by_kind(objects, "NetworkPolicy")}
    assert [n for n in by_kind(objects, "ConfigMap") if n.startswith(("bundles-", "policy-", "opa-config-", "bundle-server-"))] == []


@pytest.mark.parametrize("topology", DECIDING)
def test_each_opa_fetches_its_own_bundle_with_its_own_credential_from_the_bundle_servers_service_allowed(topology, tmp_path):
    _, objects = rendered(topology, 5, tmp_path)
    net = render.KubernetesNetwork
    host = f"{render.BUNDLE_SERVER}.{render.namespace_of(manifest.load(topology))}.svc.cluster.local"
    server = pods(objects)[render.BUNDLE_SERVER]
    server_files = mounted_files(objects, server, server["containers"][0])
    # OPA checks the host it reaches: the bundle server's certificate names its Service.
    assert dns_sans(server_files[kubetrust.FILES.cert]) == [host] and uri_sans(server_files[kubetrust.FILES.cert]) == [pki.BUNDLE_SERVER]
    checked = set()
    for workload, pod, container, point in opa_containers(objects):
        files = mounted_files(objects, pod, container)
        config = yaml.safe_load(files["/config/opa.yaml"])
        assert config["services"] == {"control": {
            "url": f"https://{host}:{net.BUNDLES}", "tls": {"ca_cert": kubetrust.FILES.ca},
            "credentials": {"client_tls": {"cert": kubetrust.FILES.cert, "private_key": kubetrust.FILES.key}}}}
        assert config["bundles"]["complyroute"]["resource"] == f"bundles/{point}.tar.gz"
        # Its credential is the point's, from the Secret its pod mounts; the CA the server's.
        assert uri_sans(files[kubetrust.FILES.cert]) == [pki.spiffe_id("point", point)]
        assert files[kubetrust.FILES.ca] == server_files[kubetrust.FILES.ca]
        checked.add(point)
    assert checked and len(checked) == len(opa_containers(objects))  # one configuration per point


@pytest.mark.parametrize("topology", DECIDING)
def test_only_pods_with_an_opa_reach_the_bundle_server_denied(topology, tmp_path):
    _, objects = rendered(topology, 5, tmp_path)
    port = render.KubernetesNetwork.BUNDLES
    policies = list(by_kind(objects, "NetworkPolicy").values())
    policy_of = lambda c: next(p["spec"] for p in policies if p["spec"]["podSelector"]["matchLabels"]["component"] == c)
    component = {name: w["metadata"]["labels"]["component"] for name, w in {**by_kind(objects, "Deployment"), **by_kind(objects, "DaemonSet")}.items()}
    with_opa = {component[workload] for workload, *_ in opa_containers(objects)}
    for name in set(component.values()) - {render.BUNDLE_SERVER}:
        assert admitted(policy_of(render.BUNDLE_SERVER)["ingress"], "from", name, port) == (name in with_opa), name
        assert admitted(policy_of(name)["egress"], "to", render.BUNDLE_SERVER, port) == (name in with_opa), name
    # The bundle server itself sends nothing but DNS queries.
    assert len(policy_of(render.BUNDLE_SERVER)["egress"]) == 1 and policy_of(render.BUNDLE_SERVER)["egress"][0]["ports"][0]["port"] == 53


def test_without_mtls_opa_fetches_its_bundle_over_plain_http_and_the_server_is_probed_on_get_health(tmp_path):
    _, objects = rendered("central-entity", 5, tmp_path, overrides=PLAIN)
    net = render.KubernetesNetwork
    [(_, pod, container, point)] = opa_containers(objects)
    config = yaml.safe_load(mounted_files(objects, pod, container)["/config/opa.yaml"])
    assert config["services"] == {"control": {"url": f"http://{render.BUNDLE_SERVER}.complyroute-central-entity.svc.cluster.local:{net.BUNDLES}"}}
    server = pods(objects)[render.BUNDLE_SERVER]["containers"][0]
    assert "--cert" not in server["command"] and server["readinessProbe"]["httpGet"] == {"path": "/health", "port": net.BUNDLES}


@pytest.mark.parametrize("topology", TOPOLOGIES)
def test_each_secret_is_mounted_by_its_own_parts_containers_only_denied(topology, tmp_path):
    """Every TLS Secret where it was before bundles: a point's by its Envoy, and now its OPA too
    (its credential for the bundle server), a service's by the service; the bundle server's by
    it; the label-token key by the entry's OPA alone."""
    _, objects = rendered(topology, 5, tmp_path)
    names = {o["metadata"]["name"]: base for base, o in secrets(objects).items()}
    mounted = {}
    for workload, pod in pods(objects).items():
        for container in containers(pod):
            if container["name"] == "envoy":
                part = envoy_config(objects, pod, container)[0]
            elif container["name"] == "opa":
                part = opa_point(pod, container)
            else:
                part = workload  # a service, or the bundle server
            found = {path: names[secret] for path, secret in secret_mounts(pod, container).items()}
            token = {kubetrust.TOKEN_MOUNT: f"token-{part}"} if container["name"] == "opa" and part == ENTRY.get(topology) else {}
            assert found == {kubetrust.MOUNT: f"tls-{part}", **token}, (workload, container["name"], found)
            for secret in found.values():
                mounted.setdefault(secret, set()).add((workload, container["name"]))
    assert set(mounted) == set(names.values())  # none left unmounted
    if topology != "baseline":
        assert mounted[f"tls-{render.BUNDLE_SERVER}"] == {(render.BUNDLE_SERVER, render.BUNDLE_SERVER)}
        assert mounted[f"token-{ENTRY[topology]}"] == {(ENTRY[topology], "opa")}


@pytest.mark.parametrize("topology", DECIDING)
def test_no_bundle_holds_the_label_token_key_denied(topology, tmp_path):
    """The entry's OPA loads data.complyroute.token from its Secret; no bundle holds it, nor
    claims its path (a bundle owns its roots: one covering complyroute/token would erase it)."""
    _, objects = rendered(topology, 5, tmp_path)
    secret = decoded(secrets(objects)[f"token-{ENTRY[topology]}"])
    jwk = json.loads(secret[kubetrust.TOKEN_FILE])["complyroute"]["token"]["jwk"]
    for name, bundle in bundle_files(objects).items():
        content = bundle_members(bundle)
        assert "token" not in json.loads(content["data.json"])["complyroute"], name
        assert not any("complyroute/token".startswith(root) for root in json.loads(content[".manifest"])["roots"]), name
        assert not any(jwk["d"].encode() in member for member in content.values()), name


def kubelet_volume(folder, files: dict[str, str | bytes]) -> None:
    """Lay out `files` in `folder` as the kubelet lays out a ConfigMap volume (its atomic writer):
    the files in a new hidden folder, `..data` a link to it, each file a link through `..data`.
    Called again, it updates the volume as the kubelet does: the new folder, then `..data`
    swapped by a rename, then the old folder removed."""
    folder.mkdir(parents=True, exist_ok=True)
    old = os.readlink(folder / "..data") if (folder / "..data").is_symlink() else None
    generation = folder / f"..{time.strftime('%Y_%m_%d_%H_%M_%S')}.{time.monotonic_ns()}"
    generation.mkdir()
    for name, content in files.items():
        (generation / name).write_bytes(content if isinstance(content, bytes) else content.encode())
    os.symlink(generation.name, folder / "..data_tmp")
    os.rename(folder / "..data_tmp", folder / "..data")
    for name in files:
        if not (folder / name).is_symlink():
            os.symlink(f"..data/{name}", folder / name)
    if old:
        shutil.rmtree(folder / old)


@pytest.fixture(scope="module")
def us_adequate(tmp_path_factory):
    """policies/ with one routing change: the US joins the adequacy list."""
    policies = tmp_path_factory.mktemp("us-adequate") / "policies"
    shutil.copytree(POLICIES, policies)
    reference = policies / "complyroute" / "reference" / "data.json"
    reference.write_text(json.dumps({**(data := json.loads(reference.read_text())), "adequacy": [*data["adequacy"], "US"]}))
    return policies


def https_get(port: int, host: str, tls: dict[str, str], path: str, headers: dict | None = None) -> tuple[int, dict, bytes]:
    """GET over TLS to 127.0.0.1:`port` as a client that reached `host` (the name it checks in the
    server's certificate) with the credential `tls` (a Secret's files, by key)."""
    context = ssl.create_default_context(cadata=tls["ca.crt"])
    with tempfile.TemporaryDirectory() as folder:
        Path(folder, "c").write_text(tls["tls.crt"])
        Path(folder, "k").write_text(tls["tls.key"])
        context.load_cert_chain(Path(folder, "c"), Path(folder, "k"))
    connection = http.client.HTTPSConnection(host, port, timeout=30, context=context)
    connection.sock = context.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=30), server_hostname=host)
    try:
        connection.request("GET", path, headers=headers or {})
        answer = connection.getresponse()
        return answer.status, dict(answer.headers), answer.read()
    finally:
        connection.close()


def test_the_rendered_bundle_server_runs_on_the_standard_library_alone_and_takes_a_kubelet_update_allowed(us_adequate, tmp_path):
    """The bundle server as the pod runs it: its code, bundles and Secret as the pod mounts them,
    under a Python without site-packages (so without `cryptography` and the rest of
    complyroute): it serves a point's OPA its own bundle, over mutual TLS, under the Service's
    name; and when the kubelet swaps the bundles' ConfigMap, a long poll gets the new bundle."""
    renderer = render.Renderer(manifest.load("sidecar", services=3))
    renderer.render()
    objects = [o for o in yaml.safe_load_all(render.build(renderer, tmp_path / "kustomization")) if o]
    pod = pods(objects)[render.BUNDLE_SERVER]
    container = pod["containers"][0]
    files = mounted_files(objects, pod, container)
    root = tmp_path / "pod"
    for path, content in files.items():
        if not path.startswith(render.BUNDLES_MOUNT):
            (root / path.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
            (root / path.lstrip("/")).write_text(content)
    served = {path.rsplit("/", 1)[1]: content for path, content in files.items() if path.startswith(render.BUNDLES_MOUNT)}
    kubelet_volume(root / render.BUNDLES_MOUNT.lstrip("/"), served)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [str(root / a.lstrip("/")) if a.startswith(("/bundles", "/etc/")) else a for a in container["command"][1:]]
    command[command.index("--address") + 1], command[command.index("--port") + 1] = "127.0.0.1", str(port)
    # -S: no site-packages; -E, -s: no environment or user site either. The working directory, as
    # the pod's, puts its complyroute package on the path.
    server = subprocess.Popen([sys.executable, "-S", "-E", "-s", *command], cwd=root / render.CODE_MOUNT.lstrip("/"),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    host = renderer.net.bundle_server().reach
    point = "sidecar-svc-01"
    credential = decoded(secrets(objects)[f"tls-{point}"])
    try:
        deadline = time.monotonic() + 20
        while True:
            assert server.poll() is None, server.stdout.read().decode()
            try:
                status, headers, body = https_get(port, host, credential, f"/bundles/{point}.tar.gz")
                break
            except ConnectionRefusedError:
                assert time.monotonic() < deadline
                time.sleep(0.1)
        assert status == 200 and body == served[f"{point}.tar.gz"]
        status, _, _ = https_get(port, host, credential, "/bundles/sidecar-svc-02.tar.gz")
        assert status == 403  # a point reads its own bundle only
        with pytest.raises(ssl.SSLCertVerificationError, match="match"):  # OPA checks the name it reached
            https_get(port, f"{render.BUNDLE_SERVER}.elsewhere.svc.cluster.local", credential, f"/bundles/{point}.tar.gz")

        # A reload: the same points and trust, another rule set; the kubelet swaps the volume.
        reloaded = render.Renderer(renderer.topology, us_adequate)
        reloaded.configure(renderer.points, renderer.point_trust)
        [new] = reloaded.bundles
        answers = []
        waiting = threading.Thread(target=lambda: answers.append(https_get(
            port, host, credential, f"/bundles/{point}.tar.gz", {"If-None-Match": headers["ETag"], "Prefer": "wait=20"})))
        waiting.start()
        time.sleep(0.5)
        kubelet_volume(root / render.BUNDLES_MOUNT.lstrip("/"), new)
        waiting.join(25)
        status, new_headers, body = answers[0]
        assert status == 200 and body == new[f"{point}.tar.gz"] != served[f"{point}.tar.gz"]
        assert json.loads(bundle_members(body)[".manifest"])["revision"] == bundles.revision(us_adequate) != bundles.revision()
    finally:
        server.terminate()
        server.wait(10)


def test_envoy_rereads_its_route_files_when_the_kubelet_swaps_their_configmap_allowed(us_adequate, tmp_path):
    """A compiled central entity's Envoy as its pod runs it, its route files in a volume laid out
    as the kubelet does: when the kubelet swaps in the route files a reload renders (the same
    points and trust, the US adequate), Envoy serves them, named by the new revision, without a
    restart; its bootstrap is the same for both rule sets."""
    renderer = render.Renderer(manifest.load("central-entity", services=5, engine="envoy-compiled"))
    renderer.render()
    objects = [o for o in yaml.safe_load_all(render.build(renderer, tmp_path / "kustomization")) if o]
    pod = pods(objects)["central-entity"]
    container = next(c for c in pod["containers"] if c["name"] == "envoy")
    files = mounted_files(objects, pod, container)
    bootstrap = local_bootstrap(files, container["args"][container["args"].index("-c") + 1], tmp_path / "pod")
    routes = tmp_path / "pod" / render.ROUTES_MOUNT.lstrip("/")
    shutil.rmtree(routes)
    kubelet_volume(routes, {path.rsplit("/", 1)[1]: content for path, content in files.items() if path.startswith(render.ROUTES_MOUNT)})
    reloaded = render.Renderer(renderer.topology, us_adequate)
    reloaded.configure(renderer.points, renderer.point_trust)
    assert reloaded.bootstraps == renderer.bootstraps and reloaded.routes != renderer.routes
    [new] = reloaded.routes["central-entity"]

    def versions(admin: str) -> set[str]:
        query = "/stats?format=json&filter=" + urllib.parse.quote(r"\.rds\..*\.version_text$")
        return {s["value"] for s in json.load(urllib.request.urlopen(f"http://{admin}{query}", timeout=10))["stats"]}

    with running_envoy(bootstrap) as loaded:
        before = loaded()
        admin = open(f"{bootstrap}.admin").read().strip()
        assert versions(admin) == {bundles.revision()}
        kubelet_volume(routes, new)
        deadline = time.monotonic() + 20
        while versions(admin) != {reloaded.revision}:
            assert time.monotonic() < deadline, versions(admin)
            time.sleep(0.1)
        after = loaded()
    assert sorted(after["dynamic"]) == sorted(before["dynamic"]) == sorted(name.removesuffix(".json") for name in new)
    # Every hop it routes itself now names the new revision, as OPA's answers under it would.
    named = lambda configs: {v["value"] for k, v in walk(configs) if k == "header" and v.get("key") == "x-complyroute-revision"}
    assert named(before["dynamic"]) == {renderer.revision} and named(after["dynamic"]) == {reloaded.revision}
    assert after["static"] == before["static"]


class FakeApiServer:
    """kubectl as reload_policy calls it, answered from memory (a unit test's stand-in; the real
    API server is tests/k8s/test_k8s_e2e.py's): the namespace and ConfigMaps of a rendered
    topology, a resourceVersion bumped on every change an apply makes."""

    def __init__(self, objects):
        self.objects = {(o["kind"], o["metadata"]["name"]): {**o, "metadata": {**o["metadata"], "resourceVersion": "1"}} for o in objects}
        self.applied: list[list[dict]] = []
        self.version = 1

    def __call__(self, *args):
        answer = lambda stdout, code=0: subprocess.CompletedProcess(args, code, stdout, "" if code == 0 else "not found")
        if args[:2] == ("get", "namespace"):
            found = self.objects.get(("Namespace", args[2]))
            return answer(json.dumps(found), 0) if found else answer("", 1)
        if args[2:4] == ("get", "configmap"):
            names = args[4:args.index("-o")]
            return answer(json.dumps({"items": [self.objects[("ConfigMap", n)] for n in names if ("ConfigMap", n) in self.objects]}))
        if args[:2] == ("apply", "--server-side"):
            documents = [o for o in yaml.safe_load_all(Path(args[3]).read_text()) if o]
            self.applied.append(documents)
            for document in documents:
                key = (document["kind"], document["metadata"]["name"])
                stored = self.objects.get(key)
                content = lambda o: {k: v for k, v in o.items() if k != "metadata"} | {"annotations": o["metadata"].get("annotations")}
                if stored is None or content(stored) != content(document):
                    self.version += 1
                    self.objects[key] = {**document, "metadata": {**document["metadata"], "resourceVersion": str(self.version)}}
            return answer("\n".join(f"configmap/{d['metadata']['name']} serverside-applied" for d in documents))
        raise AssertionError(f"reload_policy asked kubectl {args}")


@pytest.fixture
def deployed_central_entity(tmp_path, monkeypatch):
    """The compiled central entity (5 services unless told) as `deploy --target k8s` applies and records
    it, against a fake API server; its ConfigMaps' budget as given to the factory at deploy time."""
    monkeypatch.setattr(apply, "DEPLOYED", tmp_path / "deployed")

    def deploy(budget=None, services=5):
        with monkeypatch.context() as during:
            if budget:
                during.setattr(render, "CONFIGMAP_BUDGET", budget)
            renderer = render.Renderer(manifest.load("central-entity", services=services, engine="envoy-compiled"))
            renderer.render()
            objects = [o for o in yaml.safe_load_all(render.build(renderer, tmp_path / "kustomization")) if o]
        apply.Deployed.of(renderer).write()
        api = FakeApiServer(objects)
        monkeypatch.setattr(apply, "kubectl_output", api)
        return renderer, objects, api
    return deploy


def test_reload_with_the_deployed_rule_set_applies_the_same_configmaps_and_changes_nothing_denied(deployed_central_entity):
    renderer, objects, api = deployed_central_entity()
    result = apply.reload_policy(renderer.topology, out=io.StringIO())
    assert result["applied"] == ["bundles-1", "routes-central-entity-1"] and result["changed"] == []
    assert result["revision"] == renderer.revision == bundles.revision()
    [applied] = api.applied
    rendered_configmaps = by_kind(objects, "ConfigMap")
    assert all(o == rendered_configmaps[o["metadata"]["name"]] for o in applied)  # byte for byte what the deploy applied


def test_reload_with_another_rule_set_applies_only_the_bundle_and_route_configmaps_allowed(deployed_central_entity, us_adequate):
    renderer, objects, api = deployed_central_entity()
    out = io.StringIO()
    result = apply.reload_policy(renderer.topology, us_adequate, out=out)
    revision = bundles.revision(us_adequate)
    assert result == {"revision": revision, "namespace": "complyroute-central-entity",
                      "applied": ["bundles-1", "routes-central-entity-1"], "changed": ["bundles-1", "routes-central-entity-1"]}
    [applied] = api.applied
    assert {o["kind"] for o in applied} == {"ConfigMap"}  # no Deployment, so no pod template changes
    assert all(o["metadata"]["annotations"] == {render.REVISION_ANNOTATION: revision} for o in applied)
    bundle = bundle_members(bundle_files(applied)["central-entity.tar.gz"])
    assert json.loads(bundle["complyroute/reference/data.json"])["adequacy"][-1] == "US"
    assert json.loads(bundle["data.json"])["complyroute"]["revision"] == revision
    assert f"revision {revision} applied to namespace complyroute-central-entity" in out.getvalue()
    assert "does not wait" in out.getvalue() and "names the revision that decided it" in out.getvalue()
    # The record names the revision now applied; a second reload of it changes nothing.
    assert pickle.loads(apply.Deployed.path("complyroute-central-entity").read_bytes()).revision == revision
    assert apply.reload_policy(renderer.topology, us_adequate, out=io.StringIO())["changed"] == []


def test_reload_of_a_rule_set_that_does_not_compile_applies_nothing_denied(deployed_central_entity, tmp_path):
    renderer, _, api = deployed_central_entity()
    broken = tmp_path / "broken"
    shutil.copytree(POLICIES, broken)
    (broken / "complyroute" / "compliance" / "compliance.rego").write_text("package complyroute.compliance\n\nallow if {\n")
    with pytest.raises(ReloadError, match="cannot be applied; nothing was applied"):
        apply.reload_policy(renderer.topology, broken, out=io.StringIO())
    assert api.applied == []


def test_reload_refuses_a_namespace_it_has_no_record_of_or_one_deployed_again_since_denied(deployed_central_entity):
    renderer, _, api = deployed_central_entity()
    with pytest.raises(ReloadError, match="was not deployed to Kubernetes from here"):
        apply.reload_policy(manifest.load("sidecar"), out=io.StringIO())
    api.objects[("Namespace", "complyroute-central-entity")]["metadata"]["annotations"][render.RENDER_ANNOTATION] = "another"
    with pytest.raises(ReloadError, match="runs render another, not"):
        apply.reload_policy(renderer.topology, out=io.StringIO())
    del api.objects[("Namespace", "complyroute-central-entity")]
    with pytest.raises(ReloadError, match="not in the current kubectl context"):
        apply.reload_policy(renderer.topology, out=io.StringIO())
    assert api.applied == []


def test_reload_of_a_rule_set_with_another_label_applies_nothing_and_says_deploy_again_denied(deployed_central_entity, tmp_path):
    renderer, _, api = deployed_central_entity()
    with pytest.raises(ReloadError, match=r"changes the labels complyroute-central-entity was deployed with \(category, consent, region, "
                                          r"sensitivity; deployed: category, consent, region\): .*nothing was applied: deploy again"):
        apply.reload_policy(renderer.topology, rule_set_with_label(tmp_path), out=io.StringIO())
    assert api.applied == []


@pytest.mark.parametrize("written", [b"not a pickle", pickle.dumps({"topology": "an older record"}),
                                     pickle.dumps(object.__new__(apply.Deployed))])  # no fields: a record from before a field
def test_reload_refuses_a_record_another_version_wrote_and_says_deploy_again_denied(deployed_central_entity, written):
    renderer, _, api = deployed_central_entity()
    apply.Deployed.path(render.namespace_of(renderer.topology)).write_bytes(written)
    with pytest.raises(ReloadError, match="written by another version of complyroute and cannot be read: deploy again"):
        apply.reload_policy(renderer.topology, out=io.StringIO())
    assert api.applied == []


# A ConfigMap budget that the compiled central entity's bootstrap at 20 services fits (about
# 212 kB) and its route files (about 240 kB: each listener's allowed labellings) do not: they
# take two. (At 5 services the route files, 48 kB, are smaller than the bootstrap, 55 kB.)
SMALL_BUDGET = 225_000
SMALL_BUDGET_SERVICES = 20


def test_reload_keeps_the_configmaps_the_pods_mount_allowed(deployed_central_entity, us_adequate):
    """Deployed with the route files over two ConfigMaps (SMALL_BUDGET), a rule set whose files
    fill one leaves the second mounted, empty."""
    renderer, _, api = deployed_central_entity(budget=SMALL_BUDGET, services=SMALL_BUDGET_SERVICES)
    assert renderer.route_configmaps("central-entity") == ["routes-central-entity-1", "routes-central-entity-2"]
    result = apply.reload_policy(renderer.topology, us_adequate, out=io.StringIO())
    assert result["applied"] == ["bundles-1", "routes-central-entity-1", "routes-central-entity-2"]
    emptied = by_kind(api.applied[0], "ConfigMap")["routes-central-entity-2"]
    assert "data" not in emptied and "binaryData" not in emptied
    # Every compiled listener's route file, one per hop out of a service, in the first.
    assert len(by_kind(api.applied[0], "ConfigMap")["routes-central-entity-1"]["data"]) == SMALL_BUDGET_SERVICES - 1


def test_reload_of_the_baseline_says_there_is_no_rule_set_to_reload_denied(tmp_path, monkeypatch):
    monkeypatch.setattr(apply, "DEPLOYED", tmp_path / "deployed")
    renderer = render.Renderer(manifest.load("baseline", services=3))
    renderer.render()
    api = FakeApiServer([o for o in yaml.safe_load_all(render.build(renderer, tmp_path / "kustomization")) if o])
    monkeypatch.setattr(apply, "kubectl_output", api)
    apply.Deployed.of(renderer).write()
    with pytest.raises(ReloadError, match="baseline runs no OPA"):
        apply.reload_policy(renderer.topology, out=io.StringIO())
    assert api.applied == []


def test_reload_refuses_files_that_would_need_configmaps_the_pods_do_not_mount_denied(deployed_central_entity, us_adequate, monkeypatch):
    renderer, _, api = deployed_central_entity(services=SMALL_BUDGET_SERVICES)
    monkeypatch.setattr(render, "CONFIGMAP_BUDGET", SMALL_BUDGET)
    with pytest.raises(ReloadError, match=r"fills ConfigMaps the pods do not mount \(routes-central-entity-2\)"):
        apply.reload_policy(renderer.topology, us_adequate, out=io.StringIO())
    assert api.applied == []


def test_reload_refuses_a_rule_set_that_changes_an_envoy_bootstrap_denied(deployed_central_entity):
    renderer, _, api = deployed_central_entity()
    path = apply.Deployed.path("complyroute-central-entity")
    record = pickle.loads(path.read_bytes())
    path.write_bytes(pickle.dumps(replace(record, bootstraps={"central-entity": "0" * 64})))  # as if deployed with another bootstrap
    with pytest.raises(ReloadError, match="changes the Envoy configuration of central-entity beyond its route files"):
        apply.reload_policy(renderer.topology, out=io.StringIO())
    assert api.applied == []


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
    spread = [o for o in yaml.safe_load_all(render.render(loaded, tmp_path / "spread")) if o]
    one = [o for o in yaml.safe_load_all(render.render(loaded, tmp_path / "one", one_node=True)) if o]
    assert {name: pod["nodeSelector"] for name, pod in pods(one).items()} == {name: {ROLE_LABEL: "all"} for name in pods(spread)}
    # The same workloads, Services and policies; only where the pods go differs.
    assert sorted((o["kind"], o["metadata"]["name"]) for o in one if o["kind"] not in ("ConfigMap", "Secret")) == \
        sorted((o["kind"], o["metadata"]["name"]) for o in spread if o["kind"] not in ("ConfigMap", "Secret"))
    if topology == "dynamic-router-6":  # one router pod per slot, carrying every node's routers, still node-local
        routers = {o["metadata"]["name"]: o for o in one if o["kind"] == "Service" and o["metadata"]["name"].startswith("router-")}
        assert sorted(routers) == ["router-1", "router-2"] and all(r["spec"]["internalTrafficPolicy"] == "Local" for r in routers.values())


# ---- the recommended labels, the service image, the pods' status
def recommended_labels(topology) -> dict:
    """The app.kubernetes.io/ labels every object of `topology` carries but its name and component."""
    return {"app.kubernetes.io/instance": f"complyroute-{topology}",
            "app.kubernetes.io/version": render.VERSION, "app.kubernetes.io/part-of": "complyroute",
            "app.kubernetes.io/managed-by": "complyroute"}


def missing_labels(objects) -> list[str]:
    """Every object, and every pod template, without all six recommended labels."""
    missing = []
    for o in objects:
        for where, meta in [("", o["metadata"])] + ([(" template", o["spec"]["template"]["metadata"])] if "template" in o.get("spec", {}) else []):
            absent = [key for key in render.RECOMMENDED_LABELS if not meta.get("labels", {}).get(key)]
            if absent:
                missing.append(f"{o['kind']}/{o['metadata']['name']}{where}: {', '.join(absent)}")
    return missing


@pytest.mark.parametrize("topology", TOPOLOGIES)
def test_every_rendered_object_carries_the_recommended_labels_allowed(topology, tmp_path):
    _, objects = rendered(topology, 5, tmp_path)
    assert {o["kind"] for o in objects} >= {"Namespace", "Deployment", "Service", "ConfigMap", "Secret", "NetworkPolicy"}
    assert missing_labels(objects) == []
    expected = recommended_labels(topology)
    for o in objects:
        found = o["metadata"]["labels"]
        assert {key: found[key] for key in expected} == expected, (o["kind"], o["metadata"]["name"])
        # name: the object's own (a generated ConfigMap or Secret: its name before kustomize's hash).
        assert o["metadata"]["name"].startswith(found["app.kubernetes.io/name"]), (o["kind"], o["metadata"]["name"])
        assert found["app.kubernetes.io/component"]
    components = {o["metadata"]["name"]: o["metadata"]["labels"]["app.kubernetes.io/component"] for o in objects if o["kind"] in ("Deployment", "DaemonSet")}
    assert components.get("bundle-server", "bundle-server") == "bundle-server"
    assert {c for name, c in components.items() if name not in ("bundle-server",)} <= {"service", "entry", "central-entity", "router", "gateway"}
    # The short labels the selectors and network policies use are still there.
    for workload in [o for o in objects if o["kind"] in ("Deployment", "DaemonSet")]:
        assert workload["spec"]["selector"]["matchLabels"].items() <= workload["spec"]["template"]["metadata"]["labels"].items()


def test_an_object_without_a_recommended_label_is_found_and_topologies_are_told_apart_denied(tmp_path):
    _, objects = rendered("central-entity", 5, tmp_path / "ce")
    service = next(o for o in objects if o["kind"] == "Service")
    del service["metadata"]["labels"]["app.kubernetes.io/managed-by"]
    template = next(o for o in objects if o["kind"] == "Deployment")["spec"]["template"]["metadata"]
    del template["labels"]["app.kubernetes.io/version"]
    assert sorted(missing_labels(objects)) == sorted([f"Service/{service['metadata']['name']}: app.kubernetes.io/managed-by",
                                                      f"Deployment/{next(o for o in objects if o['kind'] == 'Deployment')['metadata']['name']} template: app.kubernetes.io/version"])
    # What selects one topology's objects (its instance) selects none of another's.
    _, sidecar = rendered("sidecar", 5, tmp_path / "sa")
    assert {o["metadata"]["labels"]["app.kubernetes.io/instance"] for o in sidecar} == {"complyroute-sidecar"}
    assert "complyroute-sidecar" not in {o["metadata"]["labels"]["app.kubernetes.io/instance"] for o in objects}


def test_a_label_value_the_api_server_would_refuse_is_refused_at_render_denied():
    topology = manifest.load("sidecar", services=3)
    assert render.labels(topology, "ingest-eu", "service")["app.kubernetes.io/name"] == "ingest-eu"
    with pytest.raises(render.RenderError, match="not a label value"):
        render.labels(topology, "x" * 64, "service")


def service_images(objects) -> set[str]:
    return {c["image"] for pod in pods(objects).values() for c in containers(pod) if c["name"] == "service"}


def test_the_service_image_is_the_kustomizations_by_default_its_own_version_allowed(tmp_path):
    _, objects = rendered("sidecar", 5, tmp_path)
    assert service_images(objects) == {render.SERVICE_IMAGE}
    version = json.loads((manifest.REPO / "services" / "package.json").read_text())["version"]
    assert render.SERVICE_IMAGE == f"complyroute/service:{version}"
    kustomization = yaml.safe_load((tmp_path / "kustomization" / "kustomization.yaml").read_text())
    assert kustomization["images"] == [{"name": "complyroute/service", "newName": "complyroute/service", "newTag": version}]
    # The resources name the image without a tag: which one is the kustomization's to say.
    resources = [o for o in yaml.safe_load_all((tmp_path / "kustomization" / "resources.yaml").read_text()) if o]
    assert service_images(resources) == {"complyroute/service"}


@pytest.mark.parametrize("image, entry", [
    ("registry.example:5000/team/service:1.2.0", {"newName": "registry.example:5000/team/service", "newTag": "1.2.0"}),
    ("localhost/complyroute/service", {"newName": "localhost/complyroute/service"}),
    ("ghcr.io/x/service@sha256:" + "a" * 64, {"newName": "ghcr.io/x/service", "digest": "sha256:" + "a" * 64}),
    ("ghcr.io/x/service:2@sha256:" + "b" * 64, {"newName": "ghcr.io/x/service", "newTag": "2", "digest": "sha256:" + "b" * 64}),
], ids=["registry-port-tag", "no-tag", "digest", "tag-and-digest"])
def test_an_image_given_replaces_the_service_image_everywhere_allowed(image, entry, tmp_path):
    text = render.render(manifest.load("sidecar", services=3), tmp_path / "kustomization", image=image)
    objects = [o for o in yaml.safe_load_all(text) if o]
    assert service_images(objects) == {image}
    assert yaml.safe_load((tmp_path / "kustomization" / "kustomization.yaml").read_text())["images"] == [{"name": "complyroute/service", **entry}]
    # Envoy, OPA and the bundle server keep the images make images builds.
    others = {c["image"] for pod in pods(objects).values() for c in containers(pod) if c["name"] != "service"}
    assert others == {render.ENVOY_IMAGE, render.OPA_IMAGE, render.PYTHON_IMAGE}


@pytest.mark.parametrize("image", ["", "Complyroute/Service:1", "complyroute/service:1 --x", "a/b@sha256:short", "a/b:"])
def test_an_image_that_is_no_image_reference_is_refused_denied(image, tmp_path):
    with pytest.raises(render.RenderError, match="is not an image reference"):
        render.render(manifest.load("sidecar", services=3), tmp_path / "kustomization", image=image)
    assert not (tmp_path / "kustomization").exists()


def fake_pod(name, component, ready, restarts=0, sidecars=0, node="node-1"):
    containers = [{"name": "service"}]
    init = [{"name": f"sidecar-{n}", "restartPolicy": "Always"} for n in range(sidecars)]
    return {"metadata": {"name": name, "labels": {"component": component}},
            "spec": {"containers": containers, "initContainers": init, "nodeName": node},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
                       "containerStatuses": [{"name": "service", "ready": ready, "restartCount": restarts}],
                       "initContainerStatuses": [{"name": c["name"], "ready": True, "restartCount": 1} for c in init]}}


def fake_kubectl(namespaces, pods_by_namespace, asked):
    def kubectl_json(*args):
        asked.append(args)
        if args[:2] == ("get", "namespaces"):
            return {"items": [{"metadata": {"name": n}} for n in namespaces]}
        return {"items": pods_by_namespace[args[1]]}
    return kubectl_json


def test_k8s_status_shows_each_pod_ready_and_its_restarts_allowed(monkeypatch):
    asked = []
    pods_ = [fake_pod("ingest-eu-5d9c", "service", True, restarts=2, sidecars=2), fake_pod("entry-7f", "entry", True, node="gateway")]
    monkeypatch.setattr(apply, "kubectl_json", fake_kubectl(["complyroute-sidecar"], {"complyroute-sidecar": pods_}, asked))
    out = io.StringIO()
    assert apply.status(manifest.load("sidecar", services=3), out=out) == 0
    lines = out.getvalue().splitlines()
    assert lines[0] == "complyroute-sidecar: 2 pods"
    assert re.match(r"  ready +1/1 +restarts 0 +entry-7f +entry +gateway +Running$", lines[1]), lines[1]
    assert re.match(r"  ready +3/3 +restarts 4 +ingest-eu-5d9c +service +node-1 +Running$", lines[2]), lines[2]  # 2 + a restart of each sidecar
    assert lines[-1] == "status: complyroute-sidecar: 2/2 pods ready"
    assert asked[0] == ("get", "namespaces", "-l", "app.kubernetes.io/part-of=complyroute,app.kubernetes.io/instance=complyroute-sidecar")


def test_k8s_status_fails_on_a_pod_not_ready_and_on_nothing_deployed_denied(monkeypatch):
    asked = []
    pods_ = [fake_pod("ingest-eu-5d9c", "service", False, sidecars=1), fake_pod("entry-7f", "entry", True, node="gateway")]
    monkeypatch.setattr(apply, "kubectl_json", fake_kubectl(["complyroute-sidecar"], {"complyroute-sidecar": pods_}, asked))
    out = io.StringIO()
    assert apply.status(out=out) == 1
    assert re.search(r"NOT READY 1/2 +restarts 1 +ingest-eu-5d9c", out.getvalue()) and "1/2 pods ready" in out.getvalue()
    assert asked[0] == ("get", "namespaces", "-l", "app.kubernetes.io/part-of=complyroute")
    monkeypatch.setattr(apply, "kubectl_json", fake_kubectl([], {}, []))
    out = io.StringIO()
    assert apply.status(out=out) == 1 and "no complyroute topology is deployed" in out.getvalue()
    monkeypatch.setattr(apply, "kubectl_json", lambda *args: None)
    out = io.StringIO()
    assert apply.status(out=out) == 1 and "does not answer" in out.getvalue()


def test_reload_keeps_each_configmap_in_the_deploys_applyset_allowed(deployed_central_entity, us_adequate):
    """`deploy --target k8s` applied the ConfigMaps as members of its ApplySet (kubectl labelled them); a
    reload's server-side apply carries the label over, or it would take it off and the next
    deploy could no longer prune them."""
    renderer, objects, api = deployed_central_entity()
    for key in [("ConfigMap", "bundles-1"), ("ConfigMap", "routes-central-entity-1")]:
        api.objects[key]["metadata"]["labels"] = {**api.objects[key]["metadata"]["labels"], apply.APPLYSET_MEMBER: "applyset-abc-v1"}
    apply.reload_policy(renderer.topology, us_adequate, out=io.StringIO())
    [applied] = api.applied
    assert {o["metadata"]["name"]: o["metadata"]["labels"][apply.APPLYSET_MEMBER] for o in applied} == {
        "bundles-1": "applyset-abc-v1", "routes-central-entity-1": "applyset-abc-v1"}
    assert all(o["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "complyroute" for o in applied)


def test_reload_adds_no_applyset_label_where_the_deploy_had_none_denied(deployed_central_entity, us_adequate):
    renderer, objects, api = deployed_central_entity()
    apply.reload_policy(renderer.topology, us_adequate, out=io.StringIO())
    [applied] = api.applied
    assert not [o["metadata"]["name"] for o in applied if apply.APPLYSET_MEMBER in o["metadata"]["labels"]]
