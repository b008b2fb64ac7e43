"""make policy-diff: both rule sets asked by real OPA over the walkthrough's decision space (the naming of
what changed and the refusals, without OPA: tests/unit/authoring/test_policydiff.py)."""

import io
import itertools
import json
import shutil

import pytest

from complyroute import __main__ as cli
from complyroute.authoring import policydiff
from complyroute.engines import precompute
from complyroute.policy import policyfiles
from complyroute.proxy.contract import set_tiers
from complyroute.topology import manifest
from complyroute.topology.plan import place

from tests.walkthrough import rule_set_with_rule

# The walkthrough: 7 deciding listeners (the entry and the sidecars of the three ingest and three
# analyse instances), 16 regions, 3 categories, consent absent or one of 63 canonical values.
SPACE = 7 * 16 * 3 * 64
GDPR_REGIONS = ["EU", "IS", "LI", "NO"]


@pytest.fixture(scope="module")
def walkthrough():
    return manifest.load(policydiff.WALKTHROUGH)


@pytest.fixture(scope="module")
def head(tmp_path_factory):
    """policies/ as committed: what the tests compare with, whatever is being edited meanwhile.
    OPA is asked for its decisions once for every test that compares with it (a minute of CPU
    per ask here); the other side of each comparison, a copy of it too, is asked anew."""
    folder = policydiff.rule_set_at("HEAD", tmp_path_factory.mktemp("head"))
    asked = {}
    decisions = policydiff.decisions

    def once(points, policies, name, space):
        if policies != folder:
            return decisions(points, policies, name, space)
        key = (tuple(point.name for point in points), json.dumps(space))
        if key not in asked:
            asked[key] = decisions(points, policies, name, space)
        return asked[key]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(policydiff, "decisions", once)
        yield folder


def with_reference(folder, head, change):
    policies = folder / "policies"
    shutil.copytree(head, policies)
    reference = policies / "complyroute" / "reference" / "data.json"
    data = json.loads(reference.read_text())
    change(data)
    reference.write_text(json.dumps(data))
    return policies


@pytest.fixture(scope="module")
def us_adequate(tmp_path_factory, head):
    return with_reference(tmp_path_factory.mktemp("us"), head, lambda data: data["adequacy"].append("US"))


@pytest.fixture(scope="module")
def us_adequacy_diff(walkthrough, head, us_adequate):
    return policydiff.compare(walkthrough, head, us_adequate)


def files_of(folder):
    """{path under the folder: bytes} of every file in it."""
    return {path.relative_to(folder): path.read_bytes() for path in folder.rglob("*") if path.is_file()}


def labellings(result):
    """Every labelling the groups name: (point, listener, category, consent, region)."""
    return {(c["point"], c["listener"], *values)
            for c in result["changes"] for values in itertools.product(*c["values"].values())}


def test_us_adequacy_moves_eu_records_to_us_instances_allowed(us_adequacy_diff):
    result = us_adequacy_diff
    assert result["listeners"] == 7 and result["compared"] == SPACE
    # Each group is every value of a set for each label (a box), none twice: 504 at the entry,
    # 376 at each ingest instance's sidecar.
    assert sum(c["labellings"] for c in result["changes"]) == len(labellings(result)) == result["changed"] == 504 + 3 * 376
    for change in result["changes"]:
        before, after = change["before"], change["after"]
        assert change["values"]["region"] == GDPR_REGIONS and set(change["values"]["category"]) <= {"personal", "health"}
        if after["allowed"]:  # the US twin joins the EU replicas' set
            eu_set = set_tiers(before["destination"])
            us_twin = eu_set[0][0].split("-eu")[0] + "-us"
            assert before["allowed"] and len(eu_set) == 1 and set_tiers(after["destination"]) in ([[us_twin], *eu_set], [*eu_set, [us_twin]])
            assert change["labels"]["consent"] == "with care" and len(change["values"]["consent"]) == 32
        else:  # a denial that no longer counts the US as a residency violation
            assert not before["allowed"] and after["reasons"] == [r for r in before["reasons"] if r[1] != "RESIDENCY_VIOLATION"]
            assert change["labels"]["consent"] == "without care" and len(change["values"]["consent"]) == 31
    moves = {(c["point"], category, c["before"].get("destination"), c["after"].get("destination"))
             for c in result["changes"] for category in c["values"]["category"]}
    # A US sender (the gateway, ingest-us) prefers the US instance; an EU sender keeps the EU
    # replicas first, the US instance after them.
    ingest_eu, analyse_eu = "ingest-eu-1,ingest-eu-2", "analyse-eu-1,analyse-eu-2"
    assert {("entry", category, ingest_eu, f"ingest-us|{ingest_eu}") for category in ("personal", "health")} <= moves
    assert ("sidecar-ingest-us", "personal", analyse_eu, f"analyse-us|{analyse_eu}") in moves
    assert {(f"sidecar-ingest-eu-{k}", "personal", analyse_eu, f"{analyse_eu}|analyse-us") for k in (1, 2)} <= moves
    # analyse-us holds no health-data certification: no health record's set gains it.
    assert not any(point.startswith("sidecar") and category == "health" and after for point, category, _, after in moves)

    text = io.StringIO()
    policydiff.report(result, "HEAD", out=text)
    lines = text.getvalue().splitlines()
    assert lines[0] == f"policy-diff HEAD -> policies/: {SPACE} decisions compared at 7 deciding listeners, 1632 would change"
    assert lines[1] == f"  {policydiff.RECORD_NOT_COMPARED}"  # said plainly, changes or none
    assert "  entry, listener entry (gateway -> ingest):" in lines
    assert ("    category health,personal, consent with care, region EU,IS,LI,NO (256 labellings): allowed to ingest-eu-1,ingest-eu-2 "
            "-> allowed to ingest-us|ingest-eu-1,ingest-eu-2" in lines)
    assert ("    category health,personal, consent without care, region EU,IS,LI,NO (248 labellings): 451 NO_COMPLIANT_INSTANCE "
            "(ingest-eu-1: PURPOSE_NOT_CONSENTED; ingest-eu-2: PURPOSE_NOT_CONSENTED; ingest-us: PURPOSE_NOT_CONSENTED, "
            "RESIDENCY_VIOLATION) -> 451 PURPOSE_NOT_CONSENTED" in lines)


def test_an_unchanged_rule_set_changes_no_decision_denied(walkthrough, head, tmp_path):
    # A copy byte for byte: its answers are the cached ones of HEAD's content (precompute's
    # cache goes by what the files hold, not where), so this twin costs no second ask.
    # Whether OPA answers a rule set alike each time shows in us_adequacy's exact changes.
    same = tmp_path / "policies"
    shutil.copytree(head, same)
    result = policydiff.compare(walkthrough, head, same)
    assert result == {"compared": SPACE, "listeners": 7, "changed": 0, "changes": []}
    text = io.StringIO()
    policydiff.report(result, "HEAD", out=text)
    assert text.getvalue() == (f"policy-diff HEAD -> policies/: {SPACE} decisions compared at 7 deciding listeners, 0 would change\n"
                               f"  {policydiff.RECORD_NOT_COMPARED}\n")


def asked_keys(monkeypatch, walkthrough, rule_sets) -> list[str]:
    """The key each rule set's answers are kept under (precompute.cached), nothing asked of OPA
    but the points' indexes."""
    keys = []
    monkeypatch.setattr(precompute, "evaluate_split", lambda query, document, policies: keys.append(
        precompute._cache_key(query, document, policies)) or [])
    points = [point for point in place(walkthrough).points if point.deciding]
    space = {"labels": [["region", "x-data-region"]], "labellings": [["EU"]]}
    for rules in rule_sets:
        policydiff.decisions(points, rules, str(rules), space)
    return keys


def test_the_checkout_s_rule_set_and_a_copy_of_it_are_asked_once_allowed(monkeypatch, walkthrough, tmp_path):
    # The checkout's policies/ has a commit as its revision, a copy outside git a digest of its
    # content (bundles.revision); the answers are asked under one revision, so kept under one key.
    copy = tmp_path / "policies"
    shutil.copytree(policyfiles.POLICIES, copy)
    checkout, copied = asked_keys(monkeypatch, walkthrough, [policyfiles.POLICIES, copy])
    assert checkout == copied


def test_a_copy_with_one_rule_changed_is_asked_again_denied(monkeypatch, walkthrough, tmp_path):
    changed = rule_set_with_rule(tmp_path)  # policies/README.md's walkthrough rule appended
    checkout, copied = asked_keys(monkeypatch, walkthrough, [policyfiles.POLICIES, changed])
    assert checkout != copied


def test_a_purpose_no_instance_processes_for_is_asked_too(walkthrough, head, tmp_path):
    # No instance of the walkthrough processes for marketing: the compiled engine's consent
    # groups would try none of its values. Dropping it from the reference data makes every
    # value naming it unknown (400), at every listener, whatever the region and category.
    dropped = with_reference(tmp_path, head, lambda data: data["purposes"].pop("marketing"))
    result = policydiff.compare(walkthrough, head, dropped)
    assert result["compared"] == SPACE  # the labels either rule set knows
    assert result["changed"] == len(labellings(result)) == 7 * 16 * 3 * 32
    # Split by what each value was answered before; each part named as holding marketing.
    assert all("marketing" in c["labels"]["consent"].split(", ")[0].removeprefix("with ").split(",") for c in result["changes"])
    assert all("marketing" in consent.split(",") for *_, consent, _ in labellings(result))
    assert {(c["after"]["status"], c["after"]["code"]) for c in result["changes"]} == {(400, "LABEL_UNKNOWN")}


def test_head_against_a_working_tree_by_the_command(capsys, monkeypatch, walkthrough, head, us_adequate, us_adequacy_diff):
    # A report: exit 0 with changes too, the same as compare() gives and report() prints. The
    # command compares what us_adequacy_diff compared (the walkthrough, policies/ at HEAD, the
    # working tree): that comparison's result, not a second one of the same rule sets.
    def same_comparison(topology, old, new, base):
        assert (topology.name, base, new) == (walkthrough.name, "'HEAD'", us_adequate)
        assert files_of(old) == files_of(head)  # HEAD's rule set, exported by the command
        return us_adequacy_diff
    monkeypatch.setattr(policydiff, "compare", same_comparison)
    assert cli.main(["policy-diff", "--base", "HEAD", "--policies", str(us_adequate)]) == 0
    text = io.StringIO()
    policydiff.report(us_adequacy_diff, "HEAD", str(us_adequate), out=text)
    assert capsys.readouterr().out == text.getvalue()


def test_the_command_answers_json_for_tools(capsys, monkeypatch, us_adequacy_diff):
    monkeypatch.setattr(policydiff, "compare", lambda *args: us_adequacy_diff)
    assert cli.main(["policy-diff", "--base", "HEAD", "--format", "json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer == {"base": "HEAD", "policies": str(policyfiles.POLICIES), "topology": "mixed-regions", **us_adequacy_diff}


def test_a_second_rule_set_s_change_is_named_by_its_own_labels_allowed(tmp_path):
    # rule-sets/classification with confidential and secret swapped in rank: analyse-eu (cleared
    # confidential) may now take secret records, so its EU twin joins analyse-us in ingest-eu's
    # set for them (first: ingest-eu is in the EU); confidential records now outrank what
    # store-eu is cleared for, and analyse-us's (secret) clearance no longer covers them.
    topology = manifest.load(str(manifest.REPO / "topologies" / "examples" / "classification.yaml"))
    changed = tmp_path / "classification"
    shutil.copytree(policyfiles.source_of("classification"), changed)
    reference = changed / "complyroute" / "reference" / "data.json"
    data = json.loads(reference.read_text())
    data["classifications"]["confidential"]["level"], data["classifications"]["secret"]["level"] = 3, 2
    reference.write_text(json.dumps(data))
    result = policydiff.compare(topology, policyfiles.rule_set("classification"), policyfiles.rule_set(changed))
    moves = {(c["point"], c["labels"]["classification"], c["before"].get("destination"), c["after"].get("destination"))
             for c in result["changes"]}
    assert ("sidecar-ingest-eu", "secret", "analyse-us", "analyse-eu|analyse-us") in moves
    assert ("sidecar-ingest-eu", "confidential", "analyse-eu|analyse-us", "analyse-eu") in moves
    assert ("sidecar-analyse-eu", "confidential", "store-eu", None) in moves
    assert {c["labels"]["classification"] for c in result["changes"]} == {"secret", "confidential"}
    assert set(result["changes"][0]["labels"]) == {"classification", "retention"}


def test_a_second_rule_set_unchanged_changes_nothing_denied():
    topology = manifest.load(str(manifest.REPO / "topologies" / "examples" / "classification.yaml"))
    rules = policyfiles.rule_set("classification")
    assert policydiff.compare(topology, rules, rules)["changed"] == 0
