"""Kubernetes manifests: every topology renders from its manifest and passes strict offline
validation (the pinned Kubernetes version's schemas), at 5 services under the default engine and
at 50 under the compiled one, whose ConfigMaps are the largest (their matcher trees: the render
test_route_configmaps.py reads too; at scale, so make test-scale's); what breaks a schema is told
apart."""

import pytest
import yaml

from complyroute.runtime.kubernetes import render, validate
from complyroute.topology import manifest

from tests.integration.runtime.kubernetes.manifests import TOPOLOGIES, configmap_bytes, rendered


@pytest.mark.parametrize("services, engine", [(5, None), pytest.param(50, "envoy-compiled", marks=pytest.mark.scale)], ids=["5", "50-compiled"])
@pytest.mark.parametrize("topology", TOPOLOGIES)
def test_rendered_manifests_pass_strict_validation_allowed(topology, services, engine, tmp_path):
    path, objects = rendered(topology, services, tmp_path, engine=engine)
    assert validate.validate(path) == []
    assert max(configmap_bytes(o) for o in objects if o["kind"] == "ConfigMap") <= render.CONFIGMAP_BUDGET


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
