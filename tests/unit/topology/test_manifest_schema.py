"""A manifest its JSON Schema (topologies/topology.schema.json) refuses is refused by name and
path, with the nearest known field, before anything starts; every shipped manifest passes."""

from pathlib import Path

import pytest

from complyroute.__main__ import main
from complyroute.topology import manifest
from complyroute.topology.manifest import MANIFESTS

SHIPPED = sorted(MANIFESTS.rglob("*.yaml"))
SIDECAR = (MANIFESTS / "sidecar.yaml").read_text()
MIXED = (MANIFESTS / "examples" / "mixed-regions.yaml").read_text()


def written(tmp_path, text: str) -> Path:
    path = tmp_path / "typo.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("path", SHIPPED, ids=lambda path: path.name)
def test_every_shipped_manifest_passes_its_schema_allowed(path):
    manifest.load(str(path))
    schema = "../topology.schema.json" if path.parent.name == "examples" else "topology.schema.json"
    assert path.read_text().splitlines()[0] == f"# yaml-language-server: $schema={schema}"  # editors check it too


@pytest.mark.parametrize(("text", "refusal"), [
    # misspelt fields, each with its path and the nearest known field
    (SIDECAR.replace("services: 5", "servics: 50"), "field 'servics': is not a field of a manifest; did you mean 'services'?"),
    (SIDECAR.replace("decision_timeout: 2s", "decison_timeout: 9s"), "field 'engine.decison_timeout': is not a field of a manifest; did you mean 'decision_timeout'?"),
    (SIDECAR.replace("kind: envoy-opa", "kind: envoy-opa\n  decision_log: file"), "field 'engine.decision_log': is not a field of a manifest; did you mean 'decision_logs'?"),
    (MIXED.replace("replicas: 2}", "replica: 2}", 1), "field 'services[0].replica': is not a field of a manifest; did you mean 'replicas'?"),
    (MIXED.replace("replicas: 2}", "replicas: 2, attributs: {clearance: [public]}}", 1), "field 'services[0].attributs': is not a field of a manifest; did you mean 'attributes'?"),
    # one per kind of value: a type, a range, a choice, a form
    (SIDECAR.replace("services: 5", "services: many"), "field 'services': 'many' is not of type 'integer'"),
    (SIDECAR.replace("service: 3 ", "service: 0 "), "field 'nodes.service': 0 is less than the minimum of 1"),
    (SIDECAR.replace("kind: envoy-opa", "kind: envoy"), "field 'engine.kind': 'envoy' is not one of ['envoy-opa', 'envoy-compiled']"),
    (SIDECAR.replace("decision_timeout: 2s", "decision_timeout: soon"), "field 'engine.decision_timeout': 'soon' does not match"),
    (MIXED.replace("replicas: 2}", "replicas: 0}", 1), "field 'services[0].replicas': 0 is less than the minimum of 1"),
], ids=["servics", "decison_timeout", "decision_log", "replica", "attributs", "type", "range", "choice", "form", "item-range"])
def test_a_manifest_its_schema_refuses_is_refused_by_path_denied(tmp_path, text, refusal):
    path = written(tmp_path, text)
    with pytest.raises(manifest.ManifestError) as refused:
        manifest.load(str(path))
    assert str(refused.value).startswith(f"{path}: {refusal}")


def test_render_exits_2_before_anything_starts_denied(tmp_path, capsys):
    path = written(tmp_path, SIDECAR.replace("services: 5", "servics: 50"))
    assert main(["render", "--topology", str(path)]) == 2
    assert "did you mean 'services'?" in capsys.readouterr().err
