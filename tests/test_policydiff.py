"""make policy-diff: both rule sets asked by real OPA over the walkthrough's decision space."""

import io
import json
import shutil

import pytest

from complyroute import __main__ as cli, deployment, manifest, policydiff


@pytest.fixture(scope="module")
def walkthrough():
    return manifest.load(policydiff.WALKTHROUGH)


def with_reference(tmp_path, change):
    policies = tmp_path / "policies"
    shutil.copytree(deployment.POLICIES, policies)
    reference = policies / "complyroute" / "reference" / "data.json"
    data = json.loads(reference.read_text())
    change(data)
    reference.write_text(json.dumps(data))
    return policies


def test_us_adequacy_moves_eu_records_to_us_instances_allowed(walkthrough, tmp_path):
    new = with_reference(tmp_path, lambda data: data["adequacy"].append("US"))
    result = policydiff.compare(walkthrough, deployment.POLICIES, new)
    assert result["listeners"] == 5 and result["compared"] > 500
    changed = result["changed"]
    moves = {(c["point"], c["category"], c["region"], c["before"]["destination"], c["after"]["destination"])
             for c in changed if c["before"]["allowed"] and c["after"]["allowed"]}
    # An EU personal record with consent to care may now take the US replicas at the entry.
    assert ("entry", "personal", "EU", "ingest-eu", "ingest-us") in moves
    # Nothing moves anywhere but to a US instance, and only subjects the adequacy list concerns.
    assert all(after.endswith("-us") for *_, after in moves)
    assert {c["region"] for c in changed} <= {"EU", "IS", "LI", "NO"}
    text = io.StringIO()
    policydiff.report(result, "HEAD", text)
    assert f"{len(changed)} would change" in text.getvalue()
    assert "entry: gateway -> ingest, personal, consent care" in text.getvalue() and "allowed to ingest-eu -> allowed to ingest-us" in text.getvalue()


def test_an_unchanged_rule_set_changes_no_decision_denied(walkthrough, tmp_path):
    same = with_reference(tmp_path, lambda data: None)
    result = policydiff.compare(walkthrough, deployment.POLICIES, same)
    assert result["changed"] == [] and result["compared"] > 500


def test_a_ref_against_the_working_tree_and_an_unknown_ref(capsys):
    assert cli.main(["policy-diff", "--base", "HEAD", "--format", "json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["listeners"] == 5 and set(answer) == {"compared", "listeners", "changed"}
    assert cli.main(["policy-diff", "--base", "no-such-ref-anywhere"]) == 2
    assert "no rule set at 'no-such-ref-anywhere'" in capsys.readouterr().err
