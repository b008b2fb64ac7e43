"""make policy-diff without OPA: how changed consent values and denials are named, and the
refusals of a ref or folder that holds no rule set. Both rule sets asked by real OPA:
tests/integration/authoring/test_policydiff.py."""

import subprocess

import pytest

from complyroute import __main__ as cli
from complyroute.authoring import policydiff
from complyroute.topology import manifest


@pytest.mark.parametrize(("chosen", "parts"), [
    ({None, "a", "b", "a,b"}, [("any or absent", [None, "a", "a,b", "b"])]),
    ({"a", "b", "a,b"}, [("any", ["a", "a,b", "b"])]),
    ({None, "a", "a,b"}, [("absent", [None]), ("with a", ["a", "a,b"])]),
    ({"b"}, [("without a", ["b"])]),
    ({"a,b,c", "a,c"}, [("with a,c", ["a,b,c", "a,c"])]),
    ({"a,b", "a,c"}, [("with a,b, without c", ["a,b"]), ("with a,c, without b", ["a,c"])]),
])
def test_consent_values_are_named_by_the_purposes_they_turn_on(chosen, parts):
    every = [None, "a", "a,b", "a,b,c", "a,c", "b", "b,c", "c"] if any("c" in (v or "") for v in chosen) else [None, "a", "a,b", "b"]
    assert policydiff.consent_parts(chosen, every) == parts


def test_values_alike_in_no_single_purpose_are_named_each_by_all_they_turn_on():
    every = [None, "a", "a,b", "a,b,c", "a,c", "b", "b,c", "c"]
    assert policydiff.consent_parts({"a,b", "c"}, every) == [("with a,b, without c", ["a,b"]), ("with c, without a,b", ["c"])]


def test_a_denial_shows_each_instance_s_reasons_where_its_code_does_not_say_them():
    shared = {"allowed": False, "status": 451, "code": "PURPOSE_NOT_CONSENTED",
              "reasons": [["a", "PURPOSE_NOT_CONSENTED"], ["b", "PURPOSE_NOT_CONSENTED"]]}
    mixed = {"allowed": False, "status": 451, "code": "NO_COMPLIANT_INSTANCE",
             "reasons": [["a", "PURPOSE_NOT_CONSENTED"], ["b", "CERTIFICATION_MISSING"], ["b", "PURPOSE_NOT_CONSENTED"]]}
    assert policydiff.describe(shared) == "451 PURPOSE_NOT_CONSENTED"
    assert policydiff.describe(mixed) == "451 NO_COMPLIANT_INSTANCE (a: PURPOSE_NOT_CONSENTED; b: CERTIFICATION_MISSING, PURPOSE_NOT_CONSENTED)"
    # Same code, other reasons: the reasons are what moved.
    fewer = {**mixed, "reasons": mixed["reasons"][:1] + mixed["reasons"][2:]}
    assert policydiff.move(mixed, fewer).endswith("-> 451 NO_COMPLIANT_INSTANCE (a: PURPOSE_NOT_CONSENTED; b: PURPOSE_NOT_CONSENTED)")
    assert policydiff.move(None, {"allowed": True, "destination": "x"}) == "no answer -> allowed to x"


def test_a_ref_that_is_no_commit_or_has_no_rule_set_is_refused(capsys):
    assert cli.main(["policy-diff", "--base", "no-such-ref-anywhere"]) == 2
    assert capsys.readouterr().err == (
        "error: base 'no-such-ref-anywhere' names no commit of this repository: name a commit, branch or tag (base=HEAD, base=main)\n")
    assert cli.main(["policy-diff", "--base=--output=/tmp/x"]) == 2
    assert "is not a git ref" in capsys.readouterr().err
    root = subprocess.run(["git", "-C", str(manifest.REPO), "rev-list", "--max-parents=0", "HEAD"],
                          capture_output=True, text=True, check=True).stdout.split()[-1]
    assert cli.main(["policy-diff", "--base", root]) == 2
    assert "has no policies/ folder" in capsys.readouterr().err


def test_a_folder_that_is_no_rule_set_is_refused(capsys, tmp_path):
    with pytest.raises(SystemExit) as refused:  # argparse: usage and the error, status 2
        cli.main(["policy-diff", "--base", "HEAD", "--policies", str(tmp_path)])
    assert refused.value.code == 2
    assert "is no folder holding complyroute/compliance/" in capsys.readouterr().err
