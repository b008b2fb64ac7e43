"""policies/README.md's "Write your own rule set", run as a policy author runs it: the rule
added to a copy of the rule set, its test, one decision, and the policy diff (the reload is
tests/e2e/test_reload_e2e.py's, on a running deployment)."""

import json
import shutil
import subprocess

from complyroute.__main__ import main
from complyroute.policy import policyfiles

from tests.walkthrough import block, rule_set_with_rule

CATALOG = str(policyfiles.POLICIES / policyfiles.EXAMPLES / "catalog.json")


def decide(policies, input_file, capfd) -> dict:
    assert main(["decide", "--policies", str(policies), "--input", str(input_file), "--catalog", CATALOG]) == 0
    return json.loads(capfd.readouterr().out)


def test_the_walkthrough_s_rule_passes_its_tests_allowed(tmp_path):
    policies = rule_set_with_rule(tmp_path)
    (policies / "complyroute" / "compliance" / "swiss_test.rego").write_text(block("test"))
    tests = subprocess.run([str(policyfiles.OPA), *policyfiles.test_args([str(policies)])], capture_output=True, text=True)
    assert tests.returncode == 0, tests.stdout + tests.stderr
    assert "test_swiss_residency_allowed" not in tests.stdout  # opa test names failures only


def test_the_walkthrough_s_test_fails_without_the_rule_denied(tmp_path):
    policies = tmp_path / "policies"
    policies.mkdir()
    shutil.copytree(policyfiles.POLICIES / "complyroute", policies / "complyroute")
    (policies / "complyroute" / "compliance" / "swiss_test.rego").write_text(block("test"))
    tests = subprocess.run([str(policyfiles.OPA), *policyfiles.test_args([str(policies)])], capture_output=True, text=True)
    assert tests.returncode != 0 and "test_swiss_residency_denied" in tests.stdout


def test_the_walkthrough_s_decision_moves_to_the_ch_instance_allowed(tmp_path, capfd):
    input_file = tmp_path / "ch-personal.json"
    input_file.write_text(block("input"))
    assert decide(policyfiles.POLICIES, input_file, capfd)["destinations"] == [["analyse-us"], ["analyse-ch", "analyse-eu"]]
    assert decide(rule_set_with_rule(tmp_path), input_file, capfd)["destinations"] == [["analyse-ch", "analyse-eu"]]


def test_the_walkthrough_s_policy_diff_names_the_ch_records_allowed(tmp_path, capfd):
    policies = rule_set_with_rule(tmp_path)
    assert main(["policy-diff", "--base", "HEAD", "--policies", str(policies), "--format", "json"]) == 0
    changes = json.loads(capfd.readouterr().out)["changes"]
    moves = {(c["point"], category, c["before"].get("destination"), c["after"].get("destination"))
             for c in changes for category in c["values"]["category"]}
    # The US instances leave the CH records' sets; the EU ones stay.
    assert ("entry", "personal", "ingest-us|ingest-eu-1,ingest-eu-2", "ingest-eu-1,ingest-eu-2") in moves
    assert ("sidecar-ingest-us", "personal", "analyse-us|analyse-eu-1,analyse-eu-2", "analyse-eu-1,analyse-eu-2") in moves
    assert {region for c in changes for region in c["values"]["region"]} == {"CH"}
