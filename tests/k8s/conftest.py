"""The local cluster every k8s end-to-end test shares: the control plane, kwok's fake nodes
(placement of 5 and 50 services) and one real node (traffic through real pods)."""

import os

import pytest

from complyroute.topology.manifest import REPO
from tests.k8s.harness.localcluster import LocalCluster


@pytest.fixture(scope="session")
def cluster():
    # COMPLYROUTE_REAL_NODE=0 (make k8s-e2e real_node=0): kwok's nodes only, the real node's tests skipped.
    local = LocalCluster(REPO / "runs" / "k8s-e2e", real_node=os.environ.get("COMPLYROUTE_REAL_NODE", "1") != "0")
    local.start()
    yield local
    local.stop()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed real-node test's report carries its namespace's state (Running.state)."""
    report = yield
    running = getattr(item, "funcargs", {}).get("running")
    if report.failed and call.when == "call" and hasattr(running, "state"):
        try:
            report.sections.append(("the namespace when the test failed", running.state()))
        except Exception as error:  # the report must not be lost to a cluster that no longer answers
            report.sections.append(("the namespace when the test failed", f"not read: {error!r}"))
    return report
