"""Manifest validation: every error names the field and what is allowed."""

import re

import pytest

from complyroute.topology import manifest
from complyroute.topology.manifest import ManifestError, expand

SOURCE = manifest.REPO / "topologies" / "test.yaml"


def test_generated_chain_spreads_services_evenly_allowed():
    topology = expand({"topology": "sidecar", "services": 7}, SOURCE)
    assert [i.id for i in topology.instances] == [f"svc-{n:02d}" for n in range(1, 8)]
    assert topology.steps == [f"step-{n:02d}" for n in range(1, 8)]
    per_node = [sum(i.node == node for i in topology.instances) for node in topology.service_nodes]
    assert per_node == [3, 2, 2]
    assert {i.node.address for i in topology.instances} == {"127.0.1.2", "127.0.1.3", "127.0.1.4"}


def test_services_override_replaces_manifest_count_allowed():
    assert len(expand({"topology": "sidecar", "services": 5}, SOURCE, services=50).instances) == 50


@pytest.mark.parametrize(
    "raw, field",
    [
        ({"topology": "mesh"}, "topology"),
        ({"topology": "sidecar", "services": 0}, "services"),
        ({"topology": "sidecar", "services": "five"}, "services"),
        ({"topology": "sidecar", "services": []}, "services"),
        ({"topology": "sidecar", "nodes": {"service": 0}}, "nodes.service"),
        ({"topology": "sidecar", "gateway_region": "Atlantis"}, "gateway_region"),
        ({"topology": "sidecar", "services": [{"id": "a", "step": "s", "region": "XX"}]}, "services[0].region"),
        ({"topology": "sidecar", "services": [{"id": "a", "region": "EU"}]}, "services[0].step"),
        ({"topology": "sidecar", "services": [{"id": "a", "step": "s", "region": "EU"}, {"id": "a", "step": "t", "region": "EU"}]}, "services[1].id"),
        ({"topology": "sidecar", "services": [{"id": "a", "step": "s", "region": "EU", "node": "node-9"}]}, "services[0].node"),
        ({"topology": "sidecar", "services": [{"id": "a", "step": "s", "region": "EU", "purposes": "care"}]}, "services[0].purposes"),
        ({"topology": "sidecar", "services": [{"id": "a", "step": "s", "region": "EU", "attributes": ["secret"]}]}, "services[0].attributes"),
        ({"topology": "sidecar", "services": [{"id": "a", "step": "s", "region": "EU", "attributes": {"region": ["US"]}}]},
         "services[0].attributes"),
        ({"topology": "sidecar", "services": [{"id": "a", "step": "s", "region": "EU", "attributes": {"clearance": "secret"}}]},
         "services[0].attributes.clearance"),
        ({"topology": "sidecar", "policy": ""}, "policy"),
    ],
)
def test_invalid_manifest_denied(raw, field):
    with pytest.raises(ManifestError, match=re.escape(f"field '{field}'")):
        expand(raw, SOURCE)


def test_attributes_and_the_rule_set_reach_the_catalog_allowed():
    topology = manifest.load("topologies/examples/classification.yaml")
    assert topology.policy == "classification"
    entry = next(i for i in topology.instances if i.id == "analyse-eu").catalog_entry()
    assert entry["clearance"] == ["confidential"] and entry["retains"] == ["short", "standard"] and entry["step"] == "analyse"
    # Without attributes, a catalog entry is as it was; without `policy`, the shipped rule set.
    plain = manifest.load("topologies/examples/mixed-regions.yaml")
    assert plain.policy == "policies" and set(plain.instances[0].catalog_entry()) == {"step", "region", "node", "certifications", "purposes"}


def test_explicit_list_keeps_step_order_allowed():
    topology = manifest.load("topologies/examples/mixed-regions.yaml")
    assert topology.steps == ["ingest", "analyse", "store"]
    assert [i.id for i in topology.instances_of("analyse")] == ["analyse-eu-1", "analyse-eu-2", "analyse-us"]
    assert topology.next_step("analyse") == "store" and topology.next_step("store") is None


def test_alias_resolves_allowed_and_unknown_name_denied():
    assert manifest.resolve("sa").name == "sidecar.yaml"
    with pytest.raises(ManifestError, match="unknown"):
        manifest.resolve("no-such-topology")


def test_aliases_and_the_papers_names_are_read_from_the_manifests_allowed():
    assert manifest.aliases() == {"ce": "central-entity", "dr3": "dynamic-router-3", "dr6": "dynamic-router-6", "sa": "sidecar"}
    assert manifest.paper_topologies() == ["central-entity", "dynamic-router-3", "dynamic-router-6", "sidecar", "baseline"]
    assert manifest.paper_names() == {"central-entity": "CE", "dynamic-router-3": "DR_3", "dynamic-router-6": "DR_6",
                                      "sidecar": "SA", "baseline": "baseline"}


def test_a_topology_without_a_placement_folder_denied():
    with pytest.raises(ManifestError, match=r"field 'topology': 'mesh' is not one of \['baseline', 'central-entity', 'dynamic-router', 'sidecar'\]"):
        expand({"topology": "mesh"}, SOURCE)


def test_services_from_another_manifest_allowed():
    topology = manifest.load("central-entity", services="topologies/examples/mixed-regions.yaml")
    assert topology.kind == "central-entity" and topology.name == "central-entity-mixed-regions"
    assert topology.gateway_region == "US" and len(topology.instances) == 8


def test_services_from_a_missing_file_denied():
    with pytest.raises(ManifestError, match="neither a count nor a manifest"):
        manifest.load("central-entity", services="topologies/examples/nothing.yaml")


@pytest.mark.parametrize("routers", [0, -1, "two", True])
def test_routers_per_node_below_one_denied(routers):
    with pytest.raises(ManifestError, match=re.escape("field 'routers_per_node'")):
        expand({"topology": "dynamic-router", "routers_per_node": routers}, SOURCE)


def test_step_list_with_a_step_without_instances_denied():
    raw = {"topology": "sidecar", "steps": ["a", "b"], "services": [{"id": "x", "step": "a", "region": "EU"}]}
    with pytest.raises(ManifestError, match="step 'b' has no instance"):
        expand(raw, SOURCE)


def test_step_list_orders_the_chain_allowed():
    raw = {"topology": "sidecar", "steps": ["b", "a"], "services": [{"id": "x", "step": "a", "region": "EU"}, {"id": "y", "step": "b", "region": "EU"}]}
    assert expand(raw, SOURCE).steps == ["b", "a"]


def test_unknown_engine_denied():
    with pytest.raises(ManifestError, match=re.escape("field 'engine.kind'")):
        expand({"topology": "sidecar", "engine": {"kind": "nginx"}}, SOURCE)


def test_decision_logs_off_by_default_or_to_file_allowed():
    assert expand({"topology": "sidecar"}, SOURCE).engine["decision_logs"] == "off"
    assert expand({"topology": "sidecar", "engine": {"decision_logs": "file"}}, SOURCE).engine["decision_logs"] == "file"


def test_decision_logs_elsewhere_denied():
    with pytest.raises(ManifestError, match=re.escape("field 'engine.decision_logs': 'console' is not one of ['off', 'file']")):
        expand({"topology": "sidecar", "engine": {"decision_logs": "console"}}, SOURCE)


@pytest.mark.parametrize("name", ["sidecar", "central-entity", "dynamic-router-3", "dynamic-router-6", "baseline"])
def test_every_shipped_manifest_is_valid_allowed(name):
    assert len(manifest.load(name).instances) == 5


def test_work_iterations_is_a_workload_setting_allowed_and_under_engine_denied():
    assert expand({"topology": "sidecar", "workload": {"work_iterations": 7}}, SOURCE).workload == {"work_iterations": 7}
    with pytest.raises(ManifestError, match=r"field 'engine.work_iterations': .* did you mean 'workload.work_iterations'\?"):
        expand({"topology": "sidecar", "engine": {"work_iterations": 7}}, SOURCE)
    with pytest.raises(ManifestError, match=r"field 'workload.work_iterations': -1 is less than the minimum of 0"):
        expand({"topology": "sidecar", "workload": {"work_iterations": -1}}, SOURCE)
