"""policies/README.md's "Write your own rule set", run as a policy author runs it: the rule
added to a copy of the rule set, its test, one decision, and the policy diff (the reload is
tests/e2e/test_reload_e2e.py's, on a running deployment)."""

import json
import shutil
import subprocess

from complyroute.__main__ import main
from complyroute.policy import policyfiles
from complyroute.topology.manifest import REPO

from tests.walkthrough import block, rule_set_with_rule

CATALOG = str(policyfiles.POLICIES / policyfiles.EXAMPLES / "catalog.json")


def decide(policies, input_file, capfd) -> dict:
    assert main(["decide", "--policies", str(policies), "--input", str(input_file), "--catalog", CATALOG]) == 0
    return json.loads(capfd.readouterr().out)


def policy_test(policies) -> subprocess.CompletedProcess:
    """`make policy-test policy=<folder>`, as the walkthrough tells its reader to run it: format,
    strict check and Regal lint of the folder, its tests with coverage, what its rules read, and
    the fast paths of its example catalog."""
    return subprocess.run(["make", "-C", str(REPO), "--no-print-directory", "policy-test", f"policy={policies}"],
                          capture_output=True, text=True)


def test_the_walkthrough_followed_literally_passes_make_policy_test_allowed(tmp_path):
    policies = rule_set_with_rule(tmp_path)
    (policies / "complyroute" / "compliance" / "swiss_test.rego").write_text(block("test"))
    run = policy_test(policies)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "fast paths:" in run.stdout  # it ran to its last check


def test_the_rule_put_apart_from_the_other_exclusions_fails_the_lint_denied(tmp_path):
    # The twin of "append it after the last exclusions rule": the same rule put first, apart from
    # the other exclusions, is refused by Regal's messy-rule.
    policies = tmp_path / "policies"
    shutil.copytree(policyfiles.POLICIES, policies)
    compliance = policies / "complyroute" / "compliance" / "compliance.rego"
    package = "package complyroute.compliance\n"
    compliance.write_text(compliance.read_text().replace(package, package + "\n" + block("rule"), 1))
    run = policy_test(policies)
    assert run.returncode != 0 and "messy-rule" in run.stdout


def test_a_syntax_error_names_the_authors_file_and_line_denied(tmp_path):
    policies = rule_set_with_rule(tmp_path)
    compliance = policies / "complyroute" / "compliance" / "compliance.rego"
    lines = compliance.read_text().splitlines()
    row = lines.index("\tlabel.region == \"CH\"") + 1
    lines[row - 1] = "\tlabel.region == == \"CH\""
    compliance.write_text("\n".join(lines) + "\n")
    run = policy_test(policies)
    assert run.returncode != 0 and f"{compliance}:{row}" in run.stdout + run.stderr, run.stdout[-2000:] + run.stderr[-2000:]


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
