"""The record of what was deployed (runtime/deployed.py), which both targets' reloads read: what a
deploy writes reads back whole, a reload's revision and labels replace the deploy's, and a record
that is missing or another version's, or that another user owns or could write, is refused,
saying to deploy again."""

from __future__ import annotations

import dataclasses
import os
import pickle

import pytest

from complyroute.engines.configuration import Configuration
from complyroute.policy.labels import Label
from complyroute.policy.ruleset import RuleSet
from complyroute.policy.policyfiles import POLICIES
from complyroute.runtime.deployed import Deployed
from complyroute.runtime.target import ReloadError
from complyroute.topology import manifest
from complyroute.topology.plan import place

SCHEMA = (Label("region", "x-data-region", "regions", required=True),)
DEPLOY_AGAIN = "make deploy"


def record() -> Deployed:
    plan = place(manifest.load("sidecar", services=3))
    return Deployed.of(plan, plan.points, {}, Configuration(RuleSet("classification", POLICIES, "r1", SCHEMA), {}))


def test_a_record_reads_back_as_it_was_written_allowed(tmp_path):
    written = record()
    written.write(tmp_path / "deployed.pickle")
    read = Deployed.read(tmp_path / "deployed.pickle", DEPLOY_AGAIN)
    assert read == written
    assert (read.rule_set, read.revision, read.schema, read.set_clusters) == ("classification", "r1", SCHEMA, {})
    assert (tmp_path / "deployed.pickle").stat().st_mode & 0o777 == 0o600


def test_a_reload_records_its_revision_and_keeps_the_labels_unless_it_changed_them_allowed():
    deployed = record()
    assert deployed.reloaded("r2") == dataclasses.replace(deployed, revision="r2")
    added = SCHEMA + (Label("sensitivity", "x-data-sensitivity", "sensitivities"),)
    assert deployed.reloaded("r2", added).schema == added
    assert deployed.reloaded("r2").rule_set == "classification"  # what a reload applies again unless told


@pytest.mark.parametrize("written", [None, b"not a pickle", pickle.dumps({"plan": "an older record"}),
                                     pickle.dumps(object.__new__(Deployed))])  # None: no record; no fields: a record from before a field
def test_a_record_missing_or_of_another_version_is_refused_saying_deploy_again_denied(tmp_path, written):
    path = tmp_path / "deployed.pickle"
    if written is not None:
        path.write_bytes(written)
    with pytest.raises(ReloadError, match=rf"{path}.* deploy again \(make deploy\), then reload"):
        Deployed.read(path, DEPLOY_AGAIN)


@pytest.mark.parametrize("change", ["writable by its group", "writable by anyone", "another user's"])
def test_a_record_another_user_owns_or_could_write_is_refused_unread_denied(tmp_path, monkeypatch, change):
    path = tmp_path / "deployed.pickle"
    record().write(path)
    if change == "another user's":
        owner = path.stat().st_uid
        monkeypatch.setattr(os, "getuid", lambda: owner + 1)
    else:
        path.chmod(0o620 if change == "writable by its group" else 0o602)
    monkeypatch.setattr(pickle, "loads", lambda data: pytest.fail("unpickled a record it should not read"))
    with pytest.raises(ReloadError, match=rf"{path} is not this user's own file, writable by no one else .* deploy again \(make deploy\)"):
        Deployed.read(path, DEPLOY_AGAIN)
