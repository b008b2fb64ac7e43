"""The Kubernetes manifests the tests of this folder read: each topology rendered from its
manifest (once a run for each set of arguments, whichever pytest worker asks first), and what they read in them: objects by
kind, pods and their containers, the files a container's volumes show it, its Envoy's
configuration, its Secrets and certificates, the bundles, the network policies' rules; and a
ConfigMap volume laid out as the kubelet lays it out."""

import base64
import fcntl
import hashlib
import io
import json
import os
import shutil
import tarfile
import time
from pathlib import Path

import yaml
from cryptography import x509

from complyroute.policy import bundles
from complyroute.runtime.kubernetes import render
from complyroute.topology import manifest
from tests.rulesets import of_manifest


TOPOLOGIES = ["sidecar", "central-entity", "dynamic-router-3", "dynamic-router-6", "baseline"]
PLAIN = {"security": {"mtls": False, "label_tokens": False}}


def objects_of(text: str) -> list[dict]:
    """The objects of a YAML stream (what kustomize builds), parsed by libyaml as validate.py
    parses them: PyYAML's own parser took most of these tests' time (0.7 s of CPU for a
    topology of 5 services, 2.5 s for one of 50, parsed anew for every test)."""
    return [o for o in yaml.load_all(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)) if o]


def rendered(topology, services, tmp_path, engine=None, overrides=None):
    """The topology rendered into tmp_path/kustomization, its built YAML written beside it, and its
    objects. A render costs seconds here (OPA checks every point's quick path, kustomize builds),
    and most tests only read what the same arguments render to: each set of arguments (with the
    ConfigMap budget and the rule set's revision, which a commit or an edit of policies/ during
    the run changes) is rendered once a run into a folder every pytest worker of the run shares
    (make check's and make test's run these files on a worker per core, and two files on two
    workers often ask for the same render), and every test gets a copy of that kustomization
    folder and objects parsed anew, which it may change. What two renders of the same arguments
    differ in, the CA and keys, is test_every_render_makes_a_new_ca's, which renders anew
    (render_anew)."""
    key = (topology, services, engine, json.dumps(overrides, sort_keys=True), render.CONFIGMAP_BUDGET, bundles.revision())
    kept = shared_folder(tmp_path) / "renders" / hashlib.sha256(repr(key).encode()).hexdigest()[:16]
    kept.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{kept}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a worker asking for the same render meanwhile waits for it; released on close
        if not (kept / "built.yaml").exists():
            (kept / "built.yaml.new").parent.mkdir(exist_ok=True)
            (kept / "built.yaml.new").write_text(render_anew(topology, services, kept, engine, overrides))
            (kept / "built.yaml.new").rename(kept / "built.yaml")  # written last: a render cut short is rendered again
    shutil.copytree(kept / "kustomization", tmp_path / "kustomization")
    text = (kept / "built.yaml").read_text()
    path = tmp_path / f"{topology}-{services}.yaml"
    path.write_text(text)
    return path, objects_of(text)


def shared_folder(tmp_path: Path) -> Path:
    """The temporary folder of this run that all its pytest workers share: under pytest-xdist
    each worker's base folder (popen-gw<n>) is inside the run's, else the base folder is the run's."""
    base = tmp_path.parent
    return base.parent if base.name.startswith("popen-gw") else base


def render_anew(topology, services, tmp_path, engine=None, overrides=None) -> str:
    loaded = manifest.load(topology, services=services, engine=engine, overrides=overrides)
    return render.render(loaded, tmp_path / "kustomization", of_manifest(loaded))


def by_kind(objects, kind):
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}


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


def has_matcher_tree(route_config: dict) -> bool:
    """Whether a route configuration holds the compiled engine's decisions (a virtual host's matcher tree)."""
    return any("matcher" in host for host in route_config["virtual_hosts"])


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


def pods(objects):
    return {o["metadata"]["name"]: o["spec"]["template"]["spec"] for o in objects if o["kind"] in ("Deployment", "DaemonSet")}


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
