"""`make deploy watch=1` (reload.watch): what it reloads as a rule set's files are saved. No
deployment: reload_policy is replaced by a recorder, and the watch's clock by a script of saves
(one per wait), so that what happens between two looks at the folder is exact, not timed."""

import io
import json
import shutil

from complyroute.policy import policyfiles
from complyroute.runtime.local import reload


class Saves:
    """A stand-in for the watch's stop event: each wait makes the next save of the script (a
    callable, or None for none) and returns False; when the script is done, True (stop)."""

    def __init__(self, *script):
        self.script = list(script)

    def wait(self, _interval):
        if not self.script:
            return True
        save = self.script.pop(0)
        if save:
            save()
        return False


def watched(tmp_path, monkeypatch):
    """A copy of the shipped rule set, its reference data's path, the text of that data with the
    US adequate, and the adequacy lists the recorder saw, one per reload."""
    policies = tmp_path / "policies"
    shutil.copytree(policyfiles.POLICIES, policies)
    reference = policies / "complyroute" / "reference" / "data.json"
    data = json.loads(reference.read_text())
    data["adequacy"].append("US")
    reloaded = []
    monkeypatch.setattr(reload, "reload_policy", lambda rules, out: reloaded.append(
        json.loads((rules.folder / "complyroute" / "reference" / "data.json").read_text())["adequacy"]))
    return policies, reference, json.dumps(data), reloaded


def test_a_save_is_reloaded_once_the_folder_holds_still_allowed(tmp_path, monkeypatch):
    policies, reference, saved, reloaded = watched(tmp_path, monkeypatch)
    half = lambda: reference.write_text(saved[: len(saved) // 2])  # an editor's save, truncated and partly written
    whole = lambda: reference.write_text(saved)
    printed = io.StringIO()
    reload.watch(policies, 0.1, printed, Saves(half, whole, None, None))
    assert reloaded == [json.loads(saved)["adequacy"]]  # the whole save, once; the half never read
    assert "cannot be applied" not in printed.getvalue()


def test_a_save_that_is_not_json_is_reported_and_the_watch_goes_on_denied(tmp_path, monkeypatch):
    policies, reference, saved, reloaded = watched(tmp_path, monkeypatch)
    broken = lambda: reference.write_text(saved[: len(saved) // 2])
    whole = lambda: reference.write_text(saved)
    printed = io.StringIO()
    reload.watch(policies, 0.1, printed, Saves(broken, None, whole, None))
    assert f"cannot be applied; nothing was changed: {reference}:1:" in printed.getvalue()
    assert "not JSON" in printed.getvalue()
    assert reloaded == [json.loads(saved)["adequacy"]]  # the next save is applied
