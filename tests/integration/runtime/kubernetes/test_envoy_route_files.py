"""A real Envoy on a rendered point's files: it loads every route file of a split configuration
as it loads the same routes inline, refuses a missing or malformed one, and rereads them when
the kubelet swaps their ConfigMap (a reload)."""

import contextlib
import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request

import pytest

from complyroute import engines
from complyroute.policy import bundles
from complyroute.policy.ruleset import RuleSet
from complyroute.runtime.kubernetes import render
from complyroute.runtime.local import rendering
from complyroute.topology import manifest

from tests.integration.runtime.kubernetes.manifests import connection_managers, kubelet_volume, mounted_files, objects_of, pods, walk


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
    renderer = render.Renderer(manifest.load("central-entity", services=50, engine="envoy-compiled"), RuleSet.of("policies"))
    renderer.render()
    objects = objects_of(render.build(renderer, tmp_path_factory.mktemp("render") / "kustomization"))
    pod = pods(objects)["central-entity"]
    container = next(c for c in pod["containers"] if c["name"] == "envoy")
    whole = engines.configure("envoy-compiled", renderer.points, renderer.topology.engine, renderer.rule_set, renderer.point_trust)
    return mounted_files(objects, pod, container), container["args"][container["args"].index("-c") + 1], whole["central-entity"].envoy


@pytest.mark.scale  # the central entity at 50 services, whose routes are split
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
    assert sorted(read["dynamic"]) == sorted(names) and sorted(read["static"]) == ["entry", "metrics", "ready"]
    assert expected["dynamic"] == {} and {**read["static"], **read["dynamic"]} == expected["static"]


@pytest.mark.scale  # the central entity at 50 services, whose routes are split
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


def test_envoy_rereads_its_route_files_when_the_kubelet_swaps_their_configmap_allowed(us_adequate, tmp_path):
    """A compiled central entity's Envoy as its pod runs it, its route files in a volume laid out
    as the kubelet does: when the kubelet swaps in the route files a reload renders (the same
    points and trust, the US adequate), Envoy serves them, named by the new revision, without a
    restart; its bootstrap is the same for both rule sets."""
    renderer = render.Renderer(manifest.load("central-entity", services=5, engine="envoy-compiled"), RuleSet.of("policies"))
    renderer.render()
    objects = objects_of(render.build(renderer, tmp_path / "kustomization"))
    pod = pods(objects)["central-entity"]
    container = next(c for c in pod["containers"] if c["name"] == "envoy")
    files = mounted_files(objects, pod, container)
    bootstrap = local_bootstrap(files, container["args"][container["args"].index("-c") + 1], tmp_path / "pod")
    routes = tmp_path / "pod" / render.ROUTES_MOUNT.lstrip("/")
    shutil.rmtree(routes)
    kubelet_volume(routes, {path.rsplit("/", 1)[1]: content for path, content in files.items() if path.startswith(render.ROUTES_MOUNT)})
    reloaded = render.Renderer(renderer.topology, RuleSet.of(us_adequate))
    reloaded.signing_key = renderer.signing_key  # a reload signs with the deploy's key, as apply.reload_policy does
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
