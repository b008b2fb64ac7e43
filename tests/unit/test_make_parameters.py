"""A make target refuses a parameter it does not take (make/params.mk, takes.<target>): `make
experiment topology=nosuch` ran the whole matrix. Each refusal beside its allowed twin, with
`make -n`, which parses the Makefile and prints the recipes without running them."""

import subprocess

import pytest

from complyroute.topology.manifest import REPO


def make_n(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "-n", "-C", str(REPO), "--no-print-directory", *args], capture_output=True, text=True)


@pytest.mark.parametrize("args, refused", [
    (["experiment", "topology=nosuch"], "make experiment takes no topology= (experiment: no parameter)"),
    (["bench", "engine=envoy-opa"], "make bench takes no engine= (bench: no parameter)"),
    (["decide", "base=HEAD"], "make decide takes no base= (decide: policy= input= catalog=)"),
    (["undeploy", "services=5", "topology=ce"], "make undeploy takes no topology= services= (undeploy: target=)"),
    (["test", "policy=classification"], "make test takes no policy="),
])
def test_a_parameter_the_target_does_not_take_is_refused_denied(args, refused):
    result = make_n(*args)
    assert result.returncode != 0 and refused in result.stderr, result.stderr


@pytest.mark.parametrize("args", [
    ["decide", "policy=classification", "input=policies/examples/eu-health-denied.json"],
    ["undeploy", "target=local"],
    ["policy-test", "policy=classification"],
    ["lock", "upgrade=1"],
    ["audit", "runs=runs/a"],
    # Two goals take what either takes.
    ["undeploy", "decide", "input=policies/examples/eu-health-denied.json"],
])
def test_the_parameters_a_target_takes_are_taken_allowed(args):
    result = make_n(*args)
    assert "takes no" not in result.stderr, result.stderr
