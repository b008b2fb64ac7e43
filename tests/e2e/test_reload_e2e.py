"""`make reload-policy` on a running deployment: every topology under both engines, with records
flowing while the rule set changes (the US joins the adequacy list, which moves an EU record's
path to the US instances), none lost, each hop named by the revision that decided it; then a
rule an author adds, of a shape the shipped rules do not have, reroutes the records it names
and no other (both engines' fast paths come from the rule set's own answers); then a label
added through the schema, with a rule reading it, reaches the services and the listeners of the
running deployment and reroutes the records it names, while records flow and none is lost."""

import io
import json
import shutil
import tarfile
import threading
import time
import urllib.parse
from collections import Counter
from pathlib import Path

import pytest

from complyroute.client import send
from complyroute.engines import envoy_compiled
from complyroute.evidence import audit
from complyroute.policy import bundles, policyfiles
from complyroute.policy.ruleset import RuleSet
from complyroute.runtime.local import deployment, reload, rendering, supervision
from complyroute.topology import localhttp
from experiments.design.changeability import add_us_to_adequacy, changed_rule_set

from tests.relabel import rule_set_with_label
from tests.walkthrough import rule_set_with_rule

from .helpers import EU_PERSONAL, RECORD, audit_lines, deploy_mixed_regions, entries, entry_of, matrix, wait_for_audit


# Paths by the example's entries (path_of): either EU replica of a step is in an EU record's set.
BEFORE = ("ingest-eu", "analyse-eu", "store-eu")
# With the US adequate, an EU record may take the US instances the US gateway prefers.
AFTER = ("ingest-us", "analyse-us", "store-eu")
INTERVAL = 0.02  # a record every 20 ms while the rule set changes


CH_PERSONAL = {**EU_PERSONAL, "region": "CH"}
US_PERSONAL = {**EU_PERSONAL, "region": "US"}
# The US gateway prefers US instances where the rules let it; store has only the store-eu replicas.
US_PATH = ("ingest-us", "analyse-us", "store-eu")


@pytest.fixture(scope="module")
def swiss_policies(tmp_path_factory):
    """The shipped rule set with the rule policies/README.md's walkthrough adds: Swiss
    residency, an exclusion of a shape the shipped rules do not have."""
    return rule_set_with_rule(tmp_path_factory.mktemp("swiss"))


@pytest.fixture(scope="module")
def sensitivity_policies(tmp_path_factory, swiss_policies):
    """The Swiss rule set with a label added to its schema, sensitivity (x-data-sensitivity), and
    a rule reading it: a record labelled high goes to GDPR or adequate regions only."""
    return rule_set_with_label(tmp_path_factory.mktemp("sensitivity"), base=swiss_policies)


@pytest.fixture(scope="module")
def us_adequate_policies(tmp_path_factory):
    """The rule set with one routing change: the US joins the adequacy list (the change the
    experiments' reload measurement applies)."""
    return changed_rule_set(tmp_path_factory.mktemp("policies"))


class Flow:
    """Records sent at a steady pace from a thread until stopped: every answer kept, in order."""

    def __init__(self, state):
        self.state, self.answers, self.stopped = state, [], threading.Event()
        self.thread = threading.Thread(target=self.run)

    def run(self):
        while not self.stopped.is_set():
            try:
                self.answers.append(send(self.state["entry_url"], EU_PERSONAL, RECORD, timeout=10))
            except OSError as error:  # no answer at all: lost
                self.answers.append(error)
            time.sleep(INTERVAL)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stopped.set()
        self.thread.join(15)


def route_reads(state) -> dict[str, int]:
    """How many times each deciding point's Envoy has read each of its route files (RDS from the
    filesystem: http.<listener>.rds.<route>.update_attempt), through its admin socket."""
    reads = {}
    query = urllib.parse.urlencode({"filter": r"\.rds\..*\.update_attempt$", "format": "json"})
    for point in rendering.deployed_record(Path(state["run_dir"])).plan.points:
        if point.deciding:
            status, body = localhttp.request(f"{point.admin.url}/stats?{query}", timeout=5)
            assert status == 200, body
            reads |= {f"{point.name} {stat['name']}": stat["value"] for stat in json.loads(body)["stats"]}
    return reads


def path_of(answer):
    """The entries of the instances a record went through: ingest-eu for ingest-eu-1 or -2."""
    return tuple(entries(hop["instance"] for hop in answer.body["path"]))


@pytest.mark.parametrize("cell", matrix())
def test_reload_moves_paths_while_records_flow_and_loses_none_allowed(cell, us_adequate_policies, swiss_policies,
                                                                     sensitivity_policies, tmp_path):
    topology, engine = cell
    state, _ = deploy_mixed_regions(topology, engine=engine)
    try:
        old_revision = bundles.revision()
        reads_before = route_reads(state)
        with Flow(state) as flow:
            time.sleep(0.5)
            result = reload.reload_policy(RuleSet.of(us_adequate_policies), out=open("/dev/null", "w"))
            reloaded_at = len(flow.answers)
            time.sleep(0.5)
        # Each route file is read once in each of the reload's two steps, however many change: a
        # point's files are moved together (files.write_folder), and Envoy reads every file of
        # the folder again on each move (one by one, n files cost n x n reads).
        reads = {name: count - reads_before.get(name, 0) for name, count in route_reads(state).items()}
        assert engine == "envoy-opa" or (len(reads) >= 2 and set(reads.values()) == {2}), reads
        answers = flow.answers
        lost = [a if isinstance(a, Exception) else f"{a.status} {a.text[:200]}" for a in answers
                if isinstance(a, Exception) or a.status != 200]
        assert lost == [] and len(answers) > 5  # about 1.2 s of records every 20 ms, each answered in tens of ms
        paths = [path_of(a) for a in answers]
        assert paths[0] == BEFORE and paths[-1] == AFTER
        # Once reload_policy returns, every point decides with the new revision.
        assert set(paths[reloaded_at + 1:]) == {AFTER}
        # Each path entry names the revision that decided the hop into its instance. While the
        # points switch one after another, a record may take a path of both rule sets
        # (ingest-us by the new, analyse-eu by the old): its entries say so.
        new_revision = bundles.revision(us_adequate_policies)
        revisions = [tuple(hop["revision"] for hop in a.body["path"]) for a in answers]
        assert revisions[0] == (old_revision,) * 3 and revisions[-1] == (new_revision,) * 3
        assert {BEFORE, AFTER} <= set(paths)
        assert all(len(set(rev)) == 2 for path, rev in zip(paths, revisions) if path not in (BEFORE, AFTER))
        assert result["revision"] == new_revision != old_revision
        assert set(result["points"]) == {p["name"] for p in state["points"]}
        # Each hop's audit line names the revision that decided it; the hops of the old path
        # the old one, the moved path's first hop the new one.
        time.sleep(0.3)  # the last audit lines are written through a stream
        by_id = {}
        for line in audit_lines(state):
            by_id.setdefault(line["request_id"], []).append(line)
        first = answers[0].request_id, answers[-1].request_id
        assert {line["revision"] for line in by_id[first[0]]} == {old_revision}
        assert {line["revision"] for line in by_id[first[1]]} == {result["revision"]}
        assert set(Counter(line["revision"] for lines in by_id.values() for line in lines)) == {old_revision, result["revision"]}
        assert (Path(state["run_dir"]) / "reloads.jsonl").read_text().count(result["revision"]) == 1
        # make audit re-checks each line with the rules of the revision that decided it: the
        # moved hops are allowed under the new rules, the old ones under the old.
        verdict = audit.audit_run(Path(state["run_dir"]))
        assert (verdict.forbidden, verdict.undecided, verdict.broken_chains) == (0, 0, 0), verdict.problems[:3]
        assert set(verdict.revisions) == {old_revision, result["revision"]}
        # Its twin: the same lines re-checked as if the new revision had the old rules.
        forged = tmp_path / "run"
        shutil.copytree(state["run_dir"], forged, ignore=shutil.ignore_patterns(supervision.SUPERVISOR_SOCKET))  # a live socket copies not
        archive = forged / bundles.REVISIONS
        shutil.rmtree(archive / result["revision"])
        shutil.copytree(archive / old_revision, archive / result["revision"])
        verdict = audit.audit_run(forged)
        # The old rules send no EU record to a US instance: every hop the new revision decided into one.
        moved = sum(1 for a in answers for hop in a.body["path"] if hop["revision"] == new_revision and hop["instance"].endswith("-us"))
        assert verdict.forbidden == moved > 0 and verdict.undecided == 0

        # An added rule: back to the shipped rules plus Swiss residency. A CH personal record
        # leaves the US replicas; a US one, its allowed twin, keeps them.
        for labels, path in ((CH_PERSONAL, US_PATH), (US_PERSONAL, US_PATH)):
            assert path_of(send(state["entry_url"], labels, RECORD)) == path
        reload.reload_policy(RuleSet.of(swiss_policies), out=open("/dev/null", "w"))
        assert path_of(send(state["entry_url"], CH_PERSONAL, RECORD)) == BEFORE
        assert path_of(send(state["entry_url"], US_PERSONAL, RECORD)) == US_PATH
        assert path_of(send(state["entry_url"], EU_PERSONAL, RECORD)) == BEFORE  # the US is no longer adequate

        # A label added through the schema: before, no service sends it on and no rule reads it.
        high, low = {**US_PERSONAL, "sensitivity": "high"}, {**US_PERSONAL, "sensitivity": "low"}
        assert path_of(send(state["entry_url"], high, RECORD, policies=sensitivity_policies)) == US_PATH
        with Flow(state) as flow:
            time.sleep(0.3)
            result = reload.reload_policy(RuleSet.of(sensitivity_policies), out=open("/dev/null", "w"))
            time.sleep(0.3)
        # Records flowed while the services and the listeners took the label: none lost, none moved.
        assert len(flow.answers) > 5 and all(not isinstance(a, Exception) and a.status == 200 and path_of(a) == BEFORE
                                             for a in flow.answers), [getattr(a, "text", a) for a in flow.answers][:3]
        assert set(result["labels"]) == {"services", "listeners"}
        # A record labelled high leaves the US instances; its twin labelled low keeps them, as one without the label.
        rerouted = send(state["entry_url"], high, RECORD, policies=sensitivity_policies)
        kept = send(state["entry_url"], low, RECORD, policies=sensitivity_policies)
        assert (path_of(rerouted), path_of(kept)) == (BEFORE, US_PATH)
        assert path_of(send(state["entry_url"], US_PERSONAL, RECORD)) == US_PATH
        unknown = send(state["entry_url"], {**US_PERSONAL, "sensitivity": "secret"}, RECORD, policies=sensitivity_policies)
        assert unknown.status == 400 and unknown.body["code"] == "LABEL_UNKNOWN" and "sensitivity" in unknown.body["message"]
        # Each hop's audit line holds the label as the record carried it, the run records the label,
        # and make audit re-checks every line clean under the revision that decided it.
        for answer, value in ((rerouted, "high"), (kept, "low")):
            lines = wait_for_audit(state, answer.request_id, 3)
            assert [line["labels"]["sensitivity"] for line in lines] == [value] * 3
        assert "sensitivity" in {label.name for label in rendering.run_labels(Path(state["run_dir"]))}
        verdict = audit.audit_run(Path(state["run_dir"]))
        assert (verdict.forbidden, verdict.undecided, verdict.broken_chains) == (0, 0, 0), verdict.problems[:3]
        # Its refused twin: a rule set without the label (the Swiss one again) is not applied, nothing changes.
        with pytest.raises(reload.ReloadError, match="removes sensitivity: .*nothing was changed, deploy again"):
            reload.reload_policy(RuleSet.of(swiss_policies), out=open("/dev/null", "w"))
        assert path_of(send(state["entry_url"], high, RECORD, policies=sensitivity_policies)) == BEFORE
    finally:
        deployment.stop(out=open("/dev/null", "w"))


def repacked(content: bytes, change) -> bytes:
    """A bundle's members, `change`d ({name: bytes} -> {name: bytes}), in a tarball of their own:
    what an attacker writing into the bundle folder could put there."""
    with tarfile.open(fileobj=io.BytesIO(content), mode="r:gz") as tar:
        members = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, data in change(members).items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def test_a_rule_set_that_does_not_compile_is_not_applied_denied(tmp_path, monkeypatch, us_adequate_policies):
    state, _ = deploy_mixed_regions("sidecar", engine="envoy-compiled")
    try:
        # A fast path that would differ from the rules (compiled routes sending EU records to
        # the US twins) is refused by the guard, naming the point and the labelling; the points
        # are given back what they ran (the reload's first step had given them the rule set
        # without precomputed answers).
        points = rendering.deployed_record(Path(state["run_dir"])).points
        routes_before = {point.name: reload.envoy_revisions(point) for point in points}
        honest = envoy_compiled.listener_matcher
        with monkeypatch.context() as divergent:
            divergent.setattr(envoy_compiled, "listener_matcher", lambda outcomes, timeout, headers: honest(
                {values: (destination.replace("-eu", "-us"), revision) for values, (destination, revision) in outcomes.items()},
                timeout, headers))
            with pytest.raises(reload.ReloadError, match=r"taken back .* decides with revision \S+ again: .*point sidecar-[a-z]+-[a-z]+(-[0-9])?: "
                                                         r"the compiled route differs"):
                reload.reload_policy(RuleSet.of(reload.deployed_rule_set()), out=open("/dev/null", "w"))
        assert path_of(send(state["entry_url"], EU_PERSONAL, RECORD)) == BEFORE
        assert {point.name: reload.envoy_revisions(point) for point in points} == routes_before  # the compiled routes are back
        broken = tmp_path / "policies"
        shutil.copytree(policyfiles.POLICIES, broken)
        (broken / "complyroute" / "compliance" / "compliance.rego").write_text("package complyroute.compliance\n\nallow if {\n")
        with Flow(state) as flow:
            time.sleep(0.3)
            with pytest.raises(reload.ReloadError, match="cannot be applied; nothing was changed"):
                reload.reload_policy(RuleSet.of(broken), out=open("/dev/null", "w"))
            time.sleep(0.3)
        assert all(not isinstance(a, Exception) and a.status == 200 and path_of(a) == BEFORE for a in flow.answers)
        assert not (Path(state["run_dir"]) / "reloads.jsonl").exists()
        assert {p.name for p in Path(state["run_dir"], rendering.BUNDLES).iterdir()} == {
            f"{p['name']}.tar.gz" for p in state["points"] if p["senders"]}

        # Bundles changed after the control plane signed them, before the bundle server serves
        # them: one point's data altered (the revision it would decide with), another's the same
        # bundle unsigned. Their OPAs refuse them and keep deciding with the revision they verified;
        # every other point takes the new one (the US adequate); the reload names both and OPA's reasons.
        old_revision = state["revision"]
        changes = {"sidecar-ingest-us": lambda m: {**m, "/data.json": m["/data.json"].replace(b"content.", b"forged.")},
                   "sidecar-analyse-us": lambda m: {n: c for n, c in m.items() if n != "/.signatures.json"}}
        honest_write = bundles.write
        with monkeypatch.context() as tampering:
            tampering.setattr(bundles, "write", lambda folder, point_bundles, *args, **kwargs: honest_write(
                folder, {point: repacked(content, changes[point]) if point in changes else content for point, content in point_bundles.items()},
                *args, **kwargs))
            with pytest.raises(reload.ReloadError, match=r"the OPA of sidecar-analyse-us, sidecar-ingest-us refused the bundle of revision "
                                                         rf"\S+ and keeps deciding with the last one it verified \({old_revision}\).*"
                                                         r"sidecar-analyse-us: bundle missing .signatures.json file; "
                                                         r"sidecar-ingest-us: data.json: digest mismatch"):
                reload.reload_policy(RuleSet.of(us_adequate_policies), out=open("/dev/null", "w"))
        # An EU record now goes to ingest-us (the entry took the new rules); the hop out of
        # ingest-us is still decided by the old ones, which keep it in the EU.
        answer = send(state["entry_url"], EU_PERSONAL, RECORD)
        assert answer.status == 200, answer.text
        new_revision = bundles.revision(us_adequate_policies)
        assert [(entry_of(hop["instance"]), hop["revision"]) for hop in answer.body["path"]] == [
            ("ingest-us", new_revision), ("analyse-eu", old_revision), ("store-eu", new_revision)]
    finally:
        deployment.stop(out=open("/dev/null", "w"))


def test_reload_without_a_deployment_says_what_to_do_denied():
    if deployment.read_state():
        deployment.stop(out=open("/dev/null", "w"))
    with pytest.raises(reload.ReloadError, match="nothing is deployed here"):
        reload.deployed_rule_set()
    with pytest.raises(reload.ReloadError, match="nothing is deployed here"):
        reload.reload_policy(RuleSet.of("policies"), out=open("/dev/null", "w"))


def test_watch_reloads_on_save_and_reports_a_broken_save_denied(tmp_path):
    """`make deploy watch=1`: a save reloads; a save that does not compile is reported and the
    deployment keeps deciding with what it had."""
    policies = tmp_path / "policies"
    shutil.copytree(policyfiles.POLICIES, policies)
    state, _ = deploy_mixed_regions("central-entity", engine="envoy-opa")
    stop, printed = threading.Event(), io.StringIO()
    watching = threading.Thread(target=reload.watch, args=(policies, 0.1, printed, stop))
    try:
        watching.start()
        time.sleep(0.3)
        add_us_to_adequacy(policies)
        reloads = Path(state["run_dir"]) / "reloads.jsonl"
        deadline = time.monotonic() + 30
        while not reloads.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert path_of(send(state["entry_url"], EU_PERSONAL, RECORD)) == AFTER
        (policies / "complyroute" / "compliance" / "compliance.rego").write_text("package complyroute.compliance\n\nallow if {\n")
        deadline = time.monotonic() + 30
        while "cannot be applied" not in printed.getvalue() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert "cannot be applied; nothing was changed" in printed.getvalue()
        assert path_of(send(state["entry_url"], EU_PERSONAL, RECORD)) == AFTER
        assert len(reloads.read_text().splitlines()) == 1
    finally:
        stop.set()
        watching.join(10)
        deployment.stop(out=open("/dev/null", "w"))
