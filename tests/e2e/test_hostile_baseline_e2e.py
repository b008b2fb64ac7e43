"""End to end, hostile, the baseline: it decides nothing, but its parts are as authenticated.

Apart from test_hostile_e2e.py, whose compromised service holds ingest-eu-1's port until that
module ends.
"""

import pytest

from complyroute.runtime.local import deployment

from .helpers import EU_PERSONAL, deploy_mixed_regions, post
from .test_hostile_e2e import test_local_process_without_credentials_reaches_no_service_denied as reaches_no_service


@pytest.fixture(scope="module")
def baseline():
    state, _ = deploy_mixed_regions("baseline")
    yield state
    deployment.stop()


def test_baseline_local_process_without_credentials_reaches_no_service_denied(baseline, tmp_path):
    """The baseline decides nothing, but its parts are as authenticated: services admit only their callers."""
    reaches_no_service(baseline, tmp_path)
    _, answer = post(baseline, EU_PERSONAL)
    assert answer.status == 200, answer.text  # the allowed twin: through the entry
