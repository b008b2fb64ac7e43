"""policydata: the rule set derives every enforcement point's OPA data, in one OPA run."""

import shutil

import pytest

from complyroute.policy import policydata, policyfiles
from complyroute.topology import manifest
from complyroute.topology.plan import place


def deciding_catalogs(topology: str, services: int) -> dict[str, dict]:
    return {p.name: p.catalog for p in place(manifest.load(topology, services=services)).points if p.deciding}


def test_every_point_gets_its_catalog_indexed_in_one_run_allowed():
    catalogs = deciding_catalogs("sidecar", 50)
    documents = policydata.opa_data(catalogs)
    assert set(documents) == set(catalogs)
    index = documents["sidecar-svc-04"]["complyroute"]["index"]
    assert set(index["senders"]) == {"svc-04", "svc-05"}
    assert index["steps"]["step-05"]["svc-05"]["protected"] is True  # EU


def test_no_points_need_no_run_allowed():
    assert policydata.opa_data({}) == {}


def test_a_rule_set_without_the_indexing_package_loads_empty_documents_allowed(tmp_path):
    stand_in = tmp_path / "policies" / "complyroute" / "envoy"
    stand_in.mkdir(parents=True)
    (stand_in / "response.rego").write_text("package complyroute.envoy\n\nresponse := {\"allowed\": true}\n")
    assert policydata.opa_data({"p": {}}, tmp_path / "policies") == {"p": {}}


def test_a_broken_rule_set_is_an_error_denied(tmp_path):
    broken = tmp_path / "policies"
    shutil.copytree(policyfiles.POLICIES, broken)
    (broken / "complyroute" / "indexing" / "indexing.rego").write_text("package complyroute.indexing\n\ndocuments :=\n")
    with pytest.raises(policydata.PolicyDataError, match="could not derive"):
        policydata.opa_data({"p": {}}, broken)
