import pytest

from complyroute.runtime.local import deployment


@pytest.fixture
def no_deployment():
    """One deployment at a time on this machine: replace a running one, as the other e2e tests do."""
    if deployment.read_state():
        deployment.stop()
    yield
    assert deployment.read_state() is None, "the test left its deployment running"
