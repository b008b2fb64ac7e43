"""The rule set as one value (complyroute/policy/ruleset.py): completed, dated and its labels read once."""

import shutil

import pytest

from complyroute.policy import bundles, labels, policyfiles
from complyroute.policy.ruleset import RuleSet


def test_the_shipped_rule_set_is_its_folder_its_revision_and_its_labels_allowed():
    shipped = RuleSet.of("policies")
    assert shipped.chosen == "policies" and shipped.folder == policyfiles.POLICIES
    assert shipped.revision == bundles.revision() and shipped.schema == labels.schema(policyfiles.POLICIES)
    assert shipped.service_setting == labels.service_setting(shipped.schema)


def test_a_rule_set_from_outside_the_repository_is_dated_by_its_content_completed_or_not_allowed(tmp_path):
    """Its own rules only, completed with the platform's parts under build/ (inside the
    repository): still no commit of the repository holds it, so its content names it."""
    own = tmp_path / "own"
    shutil.copytree(policyfiles.POLICIES, own)
    for part in policyfiles.PLATFORM:  # what an author's own folder leaves to the platform
        shutil.rmtree(own / part) if (own / part).is_dir() else (own / part).unlink()
    rule_set = RuleSet.of(own)
    assert rule_set.folder != own and rule_set.folder.is_relative_to(policyfiles.ASSEMBLED)
    assert rule_set.revision == f"content.{policyfiles.content_digest(bundles.rule_set_files(rule_set.folder))[:12]}"
    assert rule_set.chosen == str(own)


def test_a_rule_set_with_unusable_labels_is_refused_where_it_is_made_denied(tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(policyfiles.POLICIES, broken)
    reference = broken / "complyroute" / "reference" / "data.json"
    reference.write_text(reference.read_text().replace('"header": "x-data-region"', '"header": "x-complyroute-region"'))
    with pytest.raises(labels.LabelSchemaError, match="labels.region.header"):
        RuleSet.of(broken)
    with pytest.raises(policyfiles.RuleSetError, match="no folder holding"):
        RuleSet.of(tmp_path / "nothing")
