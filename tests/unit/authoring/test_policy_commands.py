"""`complyroute decide` and `complyroute policy-test`, the Makefile's policy targets: a real OPA
over policies/, loaded as policyfiles says."""

import json
import shutil

import pytest

from complyroute.__main__ import main
from complyroute.authoring import policytest
from complyroute.policy import policyfiles

EXAMPLES = policyfiles.POLICIES / policyfiles.EXAMPLES
CATALOG = str(EXAMPLES / "catalog.json")

pytestmark = pytest.mark.skipif(not policyfiles.OPA.exists(), reason="bin/opa is built by make setup")


@pytest.mark.parametrize("example, allowed, status", [
    ("eu-personal-allowed.json", True, 200),
    ("eu-health-denied.json", False, 451),
    ("unlabelled.json", False, 400),
])
def test_decide_allowed_and_denied(example, allowed, status, capfd):
    assert main(["decide", "--input", str(EXAMPLES / example), "--catalog", CATALOG]) == 0
    decision = json.loads(capfd.readouterr().out)
    assert (decision["allowed"], decision.get("status", 200)) == (allowed, status)


def test_decide_bad_input_denied(tmp_path, capfd):
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    assert main(["decide", "--input", str(broken), "--catalog", CATALOG]) != 0


def write_rule_set(folder, test_body: str, covered: bool = True) -> None:
    (folder / "m.rego").write_text("package m\n\nanswer := 42\n\nother := 1 if input.x\n" if not covered else "package m\n\nanswer := 42\n")
    (folder / "m_test.rego").write_text(f"package m_test\n\nimport data.m\n\ntest_answer if {{\n\t{test_body}\n}}\n")
    (folder / policyfiles.EXAMPLES).mkdir()
    (folder / policyfiles.EXAMPLES / "input.json").write_text("{}")  # left out, as in policies/


def test_policy_test_passing_allowed(tmp_path, capfd):
    write_rule_set(tmp_path, "m.answer == 42")
    assert main(["policy-test", str(tmp_path)]) == 0
    assert "policy coverage: 100.00%" in capfd.readouterr().out


@pytest.mark.parametrize("test_body, covered", [("m.answer == 41", True), ("m.answer == 42", False)])
def test_policy_test_failing_or_uncovered_denied(tmp_path, test_body, covered):
    write_rule_set(tmp_path, test_body, covered)
    assert main(["policy-test", "--threshold", "100", str(tmp_path)]) != 0


@pytest.mark.parametrize("coverage", [False, True])
def test_policy_tests_are_given_more_than_opas_five_seconds(coverage):
    # a loaded machine runs the coverage pass slower than OPA's default 5 s allow
    assert f"--timeout={policyfiles.TEST_TIMEOUT}" in policyfiles.test_args(["policies"], coverage=coverage)
    assert int(policyfiles.TEST_TIMEOUT.removesuffix("s")) > 5


def test_policy_test_names_the_uncovered_rule_denied(tmp_path, capfd):
    write_rule_set(tmp_path, "m.answer == 42", covered=False)
    assert main(["policy-test", "--threshold", "100", str(tmp_path)]) != 0
    assert "(not covered: lines 5-5; rules other)" in capfd.readouterr().out


def test_policy_test_checks_the_fast_paths_over_the_example_catalog_allowed(capfd):
    from complyroute.authoring.policytest import check_fast_paths

    assert check_fast_paths([str(policyfiles.POLICIES)]) == 0
    assert "catalog.json: the allowed table and the compiled routes agree with the rules" in capfd.readouterr().out


def test_policy_test_fails_on_a_fast_path_that_disagrees_denied(capfd, monkeypatch):
    from complyroute.authoring.policytest import check_fast_paths
    from complyroute.engines import envoy_compiled

    honest = envoy_compiled.listener_matcher
    # Every allowed labelling routed to the same instance: wherever the rules say otherwise.
    monkeypatch.setattr(envoy_compiled, "listener_matcher", lambda outcomes, timeout, headers: honest(
        {values: ("analyse-ch", revision) for values, (_, revision) in outcomes.items()}, timeout, headers))
    assert check_fast_paths([str(policyfiles.POLICIES)]) == 1
    assert "the fast paths disagree with the rules over" in capfd.readouterr().err


@pytest.mark.parametrize("spans, runs", [
    ([(5, 5), (5, 5), (6, 6)], [(5, 6)]),  # OPA's column spans, a rule's head and body apart, read as one run
    ([(5, 5), (8, 9)], [(5, 5), (8, 9)]),  # a covered line between them: two runs
])
def test_uncovered_spans_are_named_as_runs_of_lines_allowed(spans, runs):
    assert policytest.line_runs([{"start": {"row": first, "col": 1}, "end": {"row": last, "col": 9}} for first, last in spans]) == runs
