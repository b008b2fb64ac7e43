"""`complyroute new-rule-set`: the rule set it writes passes `make policy-test` as written, and it
refuses a name or a folder it cannot write."""

import subprocess
import sys

import pytest

from complyroute.authoring import newruleset
from complyroute.topology.manifest import REPO


def policy_test(folder):
    return subprocess.run(["make", "-C", str(REPO), "--no-print-directory", "policy-test", f"policy={folder}"],
                          capture_output=True, text=True)


def test_a_new_rule_set_passes_make_policy_test_as_written_allowed(tmp_path):
    made = subprocess.run([sys.executable, "-m", "complyroute", "new-rule-set", "geo", str(tmp_path)], capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    folder = tmp_path / "geo"
    assert (folder / "complyroute" / "compliance" / "compliance.rego").is_file()
    assert not (folder / "complyroute" / "compliance" / "platform.rego").exists()  # the platform's, added where it is loaded
    run = policy_test(folder)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "fast paths:" in run.stdout and "100.00%" in run.stdout


def test_a_new_rule_set_whose_rule_is_turned_round_fails_its_own_test_denied(tmp_path):
    # The rule with its condition turned round excludes the right candidates: its test fails.
    folder = newruleset.scaffold("geo", tmp_path)
    compliance = folder / "complyroute" / "compliance" / "compliance.rego"
    text = compliance.read_text()
    assert text.count("\twhere != label.region\n") == 1
    compliance.write_text(text.replace("\twhere != label.region\n", "\twhere == label.region\n"))
    run = policy_test(folder)
    assert run.returncode != 0 and "test_residency_allowed: FAIL" in run.stdout, run.stdout[-2000:] + run.stderr[-2000:]


@pytest.mark.parametrize("name", ["Geo", "1geo", "geo/../x", ""])
def test_a_name_that_is_no_folder_name_is_refused_denied(tmp_path, name):
    with pytest.raises(newruleset.NewRuleSetError, match="lowercase letters"):
        newruleset.scaffold(name, tmp_path)
    assert not any(tmp_path.iterdir())


def test_a_folder_that_holds_something_is_refused_denied(tmp_path):
    newruleset.scaffold("geo", tmp_path)
    made = subprocess.run([sys.executable, "-m", "complyroute", "new-rule-set", "geo", str(tmp_path)], capture_output=True, text=True)
    assert made.returncode == 2 and "is not empty" in made.stderr
