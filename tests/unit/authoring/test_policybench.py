"""`make policy-bench` times the decision of the point that decides the last hop, on a record and its denied twin."""

import pytest

from complyroute.authoring import policybench


@pytest.mark.parametrize("topology_name, services, point, catalog_size", [
    ("sidecar", 5, "sidecar-svc-04", 2),  # the sender and the next step's instance
    ("central-entity", 50, "central-entity", 50),  # everything
    ("dynamic-router-3", 50, "router-node-1-1", 34),  # node-1's 17 services and their next steps
])
def test_policy_bench_times_the_point_that_decides_the_last_hop_allowed_and_denied(topology_name, services, point, catalog_size):
    deciding, allowed, denied = policybench.cases(topology_name, services)
    catalog = deciding.catalog
    last = f"svc-{services:02d}"
    assert (deciding.name, len(catalog["instances"])) == (point, catalog_size) and last in catalog["instances"]
    purposes = catalog["instances"][last]["purposes"]
    consent = {kind: set(request["attributes"]["request"]["http"]["headers"]["x-data-consent"].split(","))
               for kind, request in (("allowed", allowed), ("denied", denied))}
    assert set(purposes) <= consent["allowed"] and not set(purposes) & consent["denied"]  # the twin differs only there
    for request in (allowed, denied):
        del request["attributes"]["request"]["http"]["headers"]["x-data-consent"]
    assert allowed == denied


def test_this_rule_set_and_the_baseline_decide_alike_allowed(tmp_path):
    point, allowed, denied = policybench.cases("central-entity", 5)
    said = {}
    for rule_set in (policybench.baseline(tmp_path / "baseline"), policybench.current()):
        document = rule_set.data({point.name: point})[point.name]
        answers = policybench.decisions(rule_set, {"allowed": (document, allowed), "denied": (document, denied)}, tmp_path)
        said[rule_set.name] = {record: policybench.outcome(answer) for record, answer in answers.items()}
    assert said[policybench.BASELINE_COMMIT] == said["current"] == {
        "allowed": "allowed -> svc-05", "denied": "denied 403 PURPOSE_NOT_CONSENTED"}


def test_a_missing_baseline_commit_is_said_denied(tmp_path, monkeypatch):
    monkeypatch.setattr(policybench, "BASELINE_COMMIT", "0000000")
    with pytest.raises(policybench.BaselineUnavailable, match="0000000 is not available"):
        policybench.baseline(tmp_path)
