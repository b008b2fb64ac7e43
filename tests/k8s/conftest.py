"""The local cluster every k8s end-to-end test shares: the control plane, kwok's fake nodes
(placement of 5 and 50 services) and one real node (traffic through real pods)."""

import pytest

from complyroute.localcluster import LocalCluster
from complyroute.manifest import REPO


@pytest.fixture(scope="session")
def cluster():
    local = LocalCluster(REPO / "runs" / "k8s-e2e", real_node=True)
    local.start()
    yield local
    local.stop()
