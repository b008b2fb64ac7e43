"""Fixtures the Kubernetes tests share: a second rule set to reload into."""

import json
import shutil

import pytest

from complyroute.policy.policyfiles import POLICIES


@pytest.fixture(scope="module")
def us_adequate(tmp_path_factory):
    """policies/ with one routing change: the US joins the adequacy list."""
    policies = tmp_path_factory.mktemp("us-adequate") / "policies"
    shutil.copytree(POLICIES, policies)
    reference = policies / "complyroute" / "reference" / "data.json"
    reference.write_text(json.dumps({**(data := json.loads(reference.read_text())), "adequacy": [*data["adequacy"], "US"]}))
    return policies
