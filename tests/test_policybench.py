"""`make policy-bench` times the decision of the point that decides the last hop, on a record and its denied twin."""

import pytest

from complyroute import policybench


@pytest.mark.parametrize("topology_name, services, point, catalog_size", [
    ("sidecar", 5, "sidecar-svc-04", 2),  # the sender and the next step's instance
    ("central-entity", 50, "central-entity", 50),  # everything
    ("dynamic-router-3", 50, "router-node-1-1", 34),  # node-1's 17 services and their next steps
])
def test_policy_bench_times_the_point_that_decides_the_last_hop_allowed_and_denied(topology_name, services, point, catalog_size):
    name, catalog, allowed, denied = policybench.cases(topology_name, services)
    last = f"svc-{services:02d}"
    assert (name, len(catalog["instances"])) == (point, catalog_size) and last in catalog["instances"]
    purposes = catalog["instances"][last]["purposes"]
    consent = {kind: set(request["attributes"]["request"]["http"]["headers"]["x-data-consent"].split(","))
               for kind, request in (("allowed", allowed), ("denied", denied))}
    assert set(purposes) <= consent["allowed"] and not set(purposes) & consent["denied"]  # the twin differs only there
    for request in (allowed, denied):
        del request["attributes"]["request"]["http"]["headers"]["x-data-consent"]
    assert allowed == denied
