"""Kubernetes manifests: the bundle server, which serves each deciding point's OPA its bundle
from ConfigMaps, and runs, as its pod runs it, on the standard library alone; a kubelet update
of its ConfigMap reaches a long poll."""

import http.client
import json
import re
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
import yaml

from complyroute.engines import precompute
from complyroute.policy import bundles
from complyroute.policy.ruleset import RuleSet
from complyroute.runtime.kubernetes import render
from complyroute.runtime.kubernetes.nodes import NODE_LABEL
from complyroute.topology import manifest
from complyroute.trust import kubetrust, pki

from tests.integration.runtime.kubernetes.manifests import (
    DECIDING, PLAIN, admitted, bundle_files, bundle_members, by_kind, decoded, dns_sans, kubelet_volume, mounted_files, objects_of,
    opa_containers, pods, rendered, secrets, uri_sans)


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
        # The point's index and revision, beside the rule set's reference data (opa build merges the data files).
        assert set(document["complyroute"]) == {"index", "revision", "reference"} and document["complyroute"]["revision"] == revision, name
        assert set(document[precompute.QUICK_PATH_DOCUMENT]) == {"table", "keys", "digest", "set_clusters"}, name
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
    renderer = render.Renderer(manifest.load("sidecar", services=3), RuleSet.of("policies"))
    renderer.render()
    objects = objects_of(render.build(renderer, tmp_path / "kustomization"))
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
        reloaded = render.Renderer(renderer.topology, RuleSet.of(us_adequate))
        reloaded.signing_key = renderer.signing_key  # a reload signs with the deploy's key, as apply.reload_policy does
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
