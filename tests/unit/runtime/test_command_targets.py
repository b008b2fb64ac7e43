"""One command shape: every verb that deploys, shows, reloads, removes or reads a deployment
takes --target local|k8s (local unless told), asks that target, and refuses an unknown target,
an option of the other target and a verb the target cannot do with one line and exit code 2.
The allowed cases ask a recording target; the refusals go through the real ones (nothing they
refuse reaches a deployment or a cluster)."""

import shutil

import pytest

from complyroute import __main__ as cli
from complyroute.policy import policyfiles
from complyroute.runtime import targets

TARGET_NAMES = ("local", "k8s")
# Each verb, its arguments beside --target, and what it asks the target.
VERBS = {
    "deploy": (["--topology", "sidecar"], ["deploy"]),
    "status": ([], ["status"]),
    "reload-policy": ([], ["deployed_rule_set", "reload_policy"]),  # told no rule set: the one deployed
    "undeploy": ([], ["undeploy_all"]),
    "audit": ([], ["run_folders"]),
    "trace": (["some-record-id"], ["run_folders"]),
}
RECORDED = "classification"  # the rule set the recording target says it was deployed with


class RecordingTarget:
    """A target that records what it was made with and asked."""

    def __init__(self, name, options, folder):
        self.name, self.options, self.folder, self.asked = name, options, folder, []

    def deploy(self, topology, rule_set, out=None):
        self.asked.append(("deploy", topology.name, rule_set.chosen))
        return {}

    def status(self, topology, out=None):
        self.asked.append(("status", topology and topology.name))
        return 0

    def deployed_rule_set(self, topology):
        self.asked.append(("deployed_rule_set", topology and topology.name))
        return RECORDED

    def reload_policy(self, topology, rule_set, out=None):
        self.asked.append(("reload_policy", topology and topology.name, rule_set.chosen))
        return {}

    def undeploy_all(self, out=None):
        self.asked.append(("undeploy_all",))
        return 0

    def run_folders(self, verb):
        self.asked.append(("run_folders", verb))
        return self.folder


@pytest.fixture
def made(monkeypatch, tmp_path):
    """targets.make recording every target it makes; audit and trace answering 0 without reading runs."""
    found = []

    def make(name, **options):
        found.append(RecordingTarget(name, options, tmp_path))
        return found[-1]

    monkeypatch.setattr(cli.targets, "make", make)
    monkeypatch.setattr(cli.audit, "main", lambda runs: 0)
    monkeypatch.setattr(cli.trace, "main", lambda request_id, run_dir: 0)
    return found


def refused(capsys, argv) -> str:
    """The one line the command printed when it refused argv with exit code 2, never a traceback."""
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err
    return err


@pytest.mark.parametrize("verb", VERBS)
@pytest.mark.parametrize("name", TARGET_NAMES)
def test_each_verb_asks_the_target_named_allowed(made, verb, name):
    arguments, asked = VERBS[verb]
    assert cli.main([verb, "--target", name, *arguments]) == 0
    assert [(target.name, target.options) for target in made] == [(name, {})]
    assert [entry[0] for entry in made[0].asked] == asked


@pytest.mark.parametrize("verb", VERBS)
def test_each_verb_is_local_unless_told_allowed(made, verb):
    arguments, _ = VERBS[verb]
    assert cli.main([verb, *arguments]) == 0
    assert [target.name for target in made] == [targets.DEFAULT] == ["local"]


@pytest.mark.parametrize("verb", VERBS)
def test_each_verb_refuses_an_unknown_target_denied(made, capsys, verb):
    arguments, _ = VERBS[verb]
    with pytest.raises(SystemExit) as exited:
        cli.main([verb, "--target", "cloud", *arguments])
    assert exited.value.code == 2 and made == []
    assert "argument --target: invalid choice: 'cloud' (choose from 'local', 'k8s')" in capsys.readouterr().err


def test_the_k8s_verbs_of_old_are_gone_denied(capsys):
    for verb in ("k8s-deploy", "k8s-status", "k8s-reload-policy", "k8s-undeploy"):
        with pytest.raises(SystemExit):
            cli.main([verb])
        assert "invalid choice" in capsys.readouterr().err


# ---- the options of one target ------------------------------------------------------------------------

def test_deploy_hands_each_target_its_options_allowed(made):
    assert cli.main(["deploy", "--target", "k8s", "--topology", "sidecar", "--image", "registry.example/service:2", "--one-node",
                     "--timeout", "60s", "--policies", "classification"]) == 0
    assert cli.main(["deploy", "--topology", "sidecar", "--no-restart"]) == 0
    assert [(target.name, target.options) for target in made] == [
        ("k8s", {"image": "registry.example/service:2", "one_node": True, "ready_timeout": "60s"}), ("local", {"restart": False})]
    assert made[0].asked == [("deploy", "sidecar", "classification")]
    assert made[1].asked == [("deploy", "sidecar", "policies")]  # told none: the manifest's


def test_deploy_refuses_an_option_of_the_other_target_denied(capsys):
    assert "--image applies to --target k8s only" in refused(capsys, ["deploy", "--topology", "sidecar", "--image", "x"])
    assert "--one-node and --timeout apply to --target k8s only" in refused(
        capsys, ["deploy", "--topology", "sidecar", "--one-node", "--timeout", "5s"])
    assert "--no-restart applies to --target local only" in refused(capsys, ["deploy", "--target", "k8s", "--topology", "sidecar",
                                                                            "--no-restart"])


def test_reload_policy_hands_each_target_its_options_allowed(made):
    assert cli.main(["reload-policy", "--timeout", "5"]) == 0
    assert cli.main(["reload-policy", "--target", "k8s", "--topology", "sidecar", "--policies", "classification"]) == 0
    assert [(target.name, target.options) for target in made] == [("local", {"reload_timeout": 5.0}), ("k8s", {})]
    assert made[0].asked == [("deployed_rule_set", None), ("reload_policy", None, RECORDED)]  # told none: the one deployed
    assert made[1].asked == [("reload_policy", "sidecar", "classification")]  # told one: the record is not asked


def test_a_rule_set_whose_labels_are_unusable_is_refused_before_any_target_is_asked_denied(made, capsys, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(policyfiles.POLICIES, broken)
    reference = broken / "complyroute" / "reference" / "data.json"
    reference.write_text(reference.read_text().replace('"header": "x-data-region"', '"header": "x-complyroute-region"'))
    for argv in (["deploy", "--topology", "sidecar", "--policies", str(broken)], ["reload-policy", "--policies", str(broken)]):
        error = refused(capsys, argv)
        assert f"the rule set {broken} cannot be used; nothing was deployed or changed: " in error and "labels.region.header" in error
    assert all(target.asked == [] for target in made)


def test_reload_policy_refuses_what_its_target_does_not_take_denied(capsys):
    assert "--timeout applies to --target local only" in refused(
        capsys, ["reload-policy", "--target", "k8s", "--topology", "sidecar", "--timeout", "5"])
    assert "reload-policy --target k8s needs --topology" in refused(capsys, ["reload-policy", "--target", "k8s"])
    assert "--topology applies to --target k8s only" in refused(capsys, ["reload-policy", "--topology", "sidecar"])


def test_status_of_one_k8s_topology_allowed(made):
    assert cli.main(["status", "--target", "k8s", "--topology", "sidecar"]) == 0
    assert made[0].asked == [("status", "sidecar")]


def test_status_of_one_local_topology_denied(capsys):
    assert "--topology applies to --target k8s only" in refused(capsys, ["status", "--topology", "sidecar"])


# ---- a verb a target cannot do ---------------------------------------------------------------------------

@pytest.mark.parametrize("verb, arguments", [("audit", []), ("trace", ["some-record-id"])])
def test_audit_and_trace_read_local_runs_allowed(made, verb, arguments):
    assert cli.main([verb, *arguments]) == 0
    assert made[0].asked == [("run_folders", verb)]


@pytest.mark.parametrize("verb, arguments", [("audit", []), ("trace", ["some-record-id"])])
def test_audit_and_trace_on_k8s_are_refused_denied(capsys, verb, arguments):
    err = refused(capsys, [verb, "--target", "k8s", *arguments])
    assert err.startswith(f"error: {verb} --target k8s is not supported: a Kubernetes deployment's audit lines and decision logs "
                          "stay in its pods")
