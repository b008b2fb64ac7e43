"""Kubernetes manifests: the recommended labels on every object, the service image (its
kustomization's, or one given), and `k8s-status` over the pods kubectl reports."""

import io
import json
import re

import pytest
import yaml

from complyroute.policy.ruleset import RuleSet
from complyroute.runtime.kubernetes import apply, render
from complyroute.topology import manifest

from tests.integration.runtime.kubernetes.manifests import TOPOLOGIES, containers, objects_of, pods, rendered


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
    resources = objects_of((tmp_path / "kustomization" / "resources.yaml").read_text())
    assert service_images(resources) == {"complyroute/service"}


@pytest.mark.parametrize("image, entry", [
    ("registry.example:5000/team/service:1.2.0", {"newName": "registry.example:5000/team/service", "newTag": "1.2.0"}),
    ("localhost/complyroute/service", {"newName": "localhost/complyroute/service"}),
    ("ghcr.io/x/service@sha256:" + "a" * 64, {"newName": "ghcr.io/x/service", "digest": "sha256:" + "a" * 64}),
    ("ghcr.io/x/service:2@sha256:" + "b" * 64, {"newName": "ghcr.io/x/service", "newTag": "2", "digest": "sha256:" + "b" * 64}),
], ids=["registry-port-tag", "no-tag", "digest", "tag-and-digest"])
def test_an_image_given_replaces_the_service_image_everywhere_allowed(image, entry, tmp_path):
    text = render.render(manifest.load("sidecar", services=3), tmp_path / "kustomization", RuleSet.of("policies"), image=image)
    objects = objects_of(text)
    assert service_images(objects) == {image}
    assert yaml.safe_load((tmp_path / "kustomization" / "kustomization.yaml").read_text())["images"] == [{"name": "complyroute/service", **entry}]
    # Envoy, OPA and the bundle server keep the images make images builds.
    others = {c["image"] for pod in pods(objects).values() for c in containers(pod) if c["name"] != "service"}
    assert others == {render.ENVOY_IMAGE, render.OPA_IMAGE, render.PYTHON_IMAGE}


@pytest.mark.parametrize("image", ["", "Complyroute/Service:1", "complyroute/service:1 --x", "a/b@sha256:short", "a/b:"])
def test_an_image_that_is_no_image_reference_is_refused_denied(image, tmp_path):
    with pytest.raises(render.RenderError, match="is not an image reference"):
        render.render(manifest.load("sidecar", services=3), tmp_path / "kustomization", RuleSet.of("policies"), image=image)
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
