"""Across topologies: one deployment at a time, and scale (a rule-set change seen identically by
every topology: test_reload_e2e.py)."""

import uuid

import pytest

from complyroute.client import send
from complyroute.runtime.local import deployment, supervision
from complyroute.topology import manifest

from tests.rulesets import of_manifest

from .helpers import ENFORCING, ENGINES, deploy_mixed_regions, mixed_regions


def path_of(state, labels):
    answer = send(state["entry_url"], labels, {"subject": "alice"}, request_id=f"e2e-{uuid.uuid4()}")
    assert answer.status == 200, answer.text
    return [hop["instance"] for hop in answer.body["path"]]


def test_second_deployment_is_refused_while_one_runs():
    state, _ = deploy_mixed_regions("sidecar")
    try:
        with pytest.raises(supervision.DeploymentError, match="already running"):
            deployment.deploy(other := mixed_regions("central-entity"), of_manifest(other))
        assert deployment.read_state()["run_dir"] == state["run_dir"]
        assert deployment.status(out=open("/dev/null", "w")) == 0  # the first one is untouched
    finally:
        deployment.stop()
    assert deployment.read_state() is None


# Each topology once at 50 services, the two engines in turn (both engines at every topology is
# test_engines_differential.py's, at 5 services): nine deployments of 50 took a quarter of make test.
FIFTY = [("baseline", None)] + [(topology, ENGINES[n % len(ENGINES)]) for n, topology in enumerate(ENFORCING)]


@pytest.mark.scale
@pytest.mark.parametrize("topology, engine", FIFTY)
def test_fifty_services_deploy_and_carry_a_record_through_all_of_them(topology, engine):
    if deployment.read_state():
        deployment.stop()
    loaded = manifest.load(topology, services=50, engine=engine)
    state = deployment.deploy(loaded, of_manifest(loaded))
    try:
        consent = "billing,analytics,care"  # the purposes generated instances process for
        path = path_of(state, {"region": "EU", "category": "personal", "consent": consent})
        assert path == [f"svc-{n:02d}" for n in range(1, 51)]
        print(f"{topology} ({engine}): 50 services, {len(state['parts'])} processes, up in {state['bring_up_seconds']} s, "
              f"memory {state['memory_mib']['total']:.0f} MiB")
    finally:
        pids = [p["pid"] for p in state["parts"]]
        deployment.stop()
    assert not [pid for pid in pids if supervision.alive(pid)]
