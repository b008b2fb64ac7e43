"""A rule set `complyroute new-rule-set` wrote, untouched, deploys and routes: its own label decides
(the sidecar topology of three generated services, all in the EU, under both engines)."""

import io

import pytest

from complyroute.authoring import newruleset
from complyroute.policy.ruleset import RuleSet
from complyroute.runtime.local import deployment
from complyroute.topology import manifest

from .helpers import ENGINES, post


@pytest.fixture(scope="module", params=ENGINES)
def deployed(request, tmp_path_factory):
    folder = newruleset.scaffold("geo", tmp_path_factory.mktemp("rule-sets"))
    if deployment.read_state():
        deployment.stop(out=io.StringIO())
    state = deployment.deploy(manifest.load("sidecar", services="3", engine=request.param), RuleSet.of(folder), out=io.StringIO())
    yield state, folder
    deployment.stop(out=io.StringIO())


def test_a_record_of_the_services_region_goes_the_whole_chain_allowed(deployed):
    state, folder = deployed
    _, answer = post(state, {"region": "EU"}, {"subject": "ann"}, policies=folder)
    assert answer.status == 200, answer.text[:300]
    assert [entry["instance"] for entry in answer.body["path"]] == ["svc-01", "svc-02", "svc-03"]


def test_a_record_of_another_region_goes_nowhere_denied(deployed):
    state, folder = deployed
    _, answer = post(state, {"region": "US"}, {"subject": "bob"}, policies=folder)
    assert answer.status == 451 and answer.body["code"] == "REGION_MISMATCH", answer.text[:300]
