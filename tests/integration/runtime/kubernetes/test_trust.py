"""Kubernetes manifests: mutual TLS and label tokens (kubetrust.py): each part's own Secret issued
by one CA per render, mounted only where it is used; no private key in a ConfigMap or bundle;
network policies admit every connection records take; without mutual TLS, no Secret."""

import json

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from complyroute.runtime.kubernetes import render, validate
from complyroute.topology import manifest
from complyroute.trust import kubetrust, pki

from tests.integration.runtime.kubernetes.manifests import (
    DECIDING, ENTRY, PLAIN, TOPOLOGIES, admitted, bundle_files, bundle_members, by_kind, containers, decoded, env_of, envoy_config,
    objects_of, opa_point, pods, render_anew, rendered, secret_mounts, secrets, tls_filenames, uri_sans, walk)


@pytest.mark.parametrize("topology", TOPOLOGIES)
def test_every_part_has_its_own_tls_secret_issued_by_one_ca_allowed(topology, tmp_path):
    _, objects = rendered(topology, 5, tmp_path)
    found = secrets(objects)
    points = {name.removeprefix("envoy-").rsplit("-", 1)[0] for name in by_kind(objects, "ConfigMap") if name.startswith("envoy-")}
    expected = {f"tls-{p}": pki.spiffe_id("point", p) for p in points}
    expected |= {f"tls-{i.id}": pki.spiffe_id("service", i.id) for i in manifest.load(topology, services=5).instances}
    if topology != "baseline":  # nothing decides in the baseline: no bundle to serve
        expected[f"tls-{render.BUNDLE_SERVER}"] = pki.BUNDLE_SERVER
    expected["tls-monitoring"] = pki.MONITORING  # the scraper's, for the operator's Prometheus (Renderer.monitoring)
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
    first, second = (decoded(secrets(objects_of(render_anew("central-entity", 2, tmp_path / str(n))))["tls-svc-01"])
                     for n in (1, 2))
    assert first["ca.crt"] != second["ca.crt"] and first["tls.key"] != second["tls.key"]
    folder = tmp_path / "2" / "kustomization"
    assert folder.stat().st_mode & 0o777 == 0o700
    assert all((folder / "tls-svc-01" / name).stat().st_mode & 0o777 == 0o600 for name in first)


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
    # None left unmounted but the scraper's, which the operator gives their Prometheus (Renderer.monitoring).
    assert set(mounted) == set(names.values()) - {"tls-monitoring"}
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
