"""The audit verifier on run folders written here: real OPA and rule set, no process started.

The run is the mixed-regions example in the sidecar topology, with the points' data the
rule set derives (policydata) and audit lines written as the services write them (a JSON
object per line, "prev" the SHA-256 of the line before it, appended last). Every case that
passes has its failing twin.
"""

import hashlib
import io
import json

import pytest

from complyroute.evidence import audit, auditlog, paths
from complyroute.policy import policydata
from complyroute.proxy.opa import write_data
from complyroute.topology import manifest
from complyroute.topology.plan import GATEWAY_SENDER, place

MIXED_REGIONS = manifest.REPO / "topologies" / "examples" / "mixed-regions.yaml"
EU_PERSONAL = {"region": "EU", "category": "personal", "consent": "billing,care"}
US_PERSONAL = {**EU_PERSONAL, "region": "US"}
REVISION = "0123abc"
DIGEST = "sha256:" + "ab" * 32


def state_of(plan) -> dict:
    """state.json as deploy writes it, for what the audit reads of it."""
    return {
        "topology": plan.topology.name, "kind": plan.topology.kind, "enforces": plan.enforces, "engine": "envoy-opa",
        "points": [
            {"name": p.name, "node": p.node, "senders": [d.sender for d in p.deciding], "destinations": sorted(p.destinations)}
            for p in plan.points
        ],
        "parts": [{"name": s.instance.id, "env": s.environment({}, f"audit/{s.instance.id}.jsonl", {})} for s in plan.services],
    }


def write_run(folder, topology="sidecar"):
    """A run folder as deploy leaves it, without processes: state.json and each point's data."""
    plan = place(manifest.load(topology, services=str(MIXED_REGIONS)))
    deciding = {p.name: p.catalog for p in plan.points if p.deciding}
    for name, document in policydata.opa_data(deciding).items():
        write_data(folder / "points" / name / "data", document)
    (folder / "audit").mkdir(parents=True)
    (folder / "state.json").write_text(json.dumps(state_of(plan)))
    return folder


def entry(instance, step, sender, decided_by, labels=EU_PERSONAL, request_id="r-1", revision=REVISION, ts=1.5):
    return {
        "ts": ts, "instance": instance, "step": step, "request_id": request_id,
        "labels": {"consent": None, **labels}, "digest": DIGEST,
        "sender": sender, "decided_by": decided_by, "revision": revision,
    }


def chained(entries):
    """The lines of one log as the service writes them."""
    lines, prev = [], auditlog.GENESIS
    for item in entries:
        line = json.dumps(item, separators=(",", ":"))[:-1] + f',"prev":"{prev}"}}'
        prev = hashlib.sha256(line.encode()).hexdigest()
        lines.append(line)
    return lines


def write_log(run, instance, lines):
    (run / "audit" / f"{instance}.jsonl").write_text("".join(line + "\n" for line in lines))


# The hops of a record through the EU instances and through the US ones, each decided by the
# sender's sidecar (the entry for the first): (instance, step, sender, deciding point).
EU_HOPS = [("ingest-eu-1", "ingest", GATEWAY_SENDER, "entry"), ("analyse-eu-1", "analyse", "ingest-eu-1", "sidecar-ingest-eu-1"),
           ("store-eu-1", "store", "analyse-eu-1", "sidecar-analyse-eu-1")]
US_HOPS = [("ingest-us", "ingest", GATEWAY_SENDER, "entry"), ("analyse-us", "analyse", "ingest-us", "sidecar-ingest-us"),
           ("store-eu-1", "store", "analyse-us", "sidecar-analyse-us")]


def path(request_id, labels=EU_PERSONAL, hops=EU_HOPS, start=0.0):
    """The lines one record leaves on its way, one per hop, each received a millisecond after the last."""
    return [entry(*hop, labels=labels, request_id=request_id, ts=start + n) for n, hop in enumerate(hops)]


# Three EU records delivered through the EU instances.
RECORDS = [line for n in range(3) for line in path(f"r-{n}", start=10.0 * n)]


def write_lines(run, entries):
    """Each entry into the log of the instance it names, in the order given."""
    logs = {}
    for item in entries:
        logs.setdefault(item["instance"], []).append(item)
    for instance, items in logs.items():
        write_log(run, instance, chained(items))


def lines_of(instance, entries=RECORDS):
    return [item for item in entries if item["instance"] == instance]


@pytest.fixture
def run(tmp_path):
    return write_run(tmp_path / "sidecar-mixed-regions-5-20261122-060000")


def kinds(verdict):
    return [(p.kind, p.where) for p in verdict.problems]


def test_records_decided_and_allowed_at_every_hop_clean(run):
    write_lines(run, RECORDS)
    verdict = audit.audit_run(run)
    assert (verdict.lines, verdict.chains, verdict.broken_chains, verdict.forbidden, verdict.undecided) == (9, 3, 0, 0, 0)
    assert (verdict.records, verdict.paths.total()) == (3, 0)
    assert verdict.clean and dict(verdict.revisions) == {REVISION: 9}


def test_an_inserted_line_breaks_the_chain_at_the_next_denied(run):
    write_lines(run, RECORDS)
    lines = chained(lines_of("store-eu-1"))
    # Linked to the line before it, as a forger would: the line after it no longer holds.
    forged = chained([lines_of("store-eu-1")[0], entry("store-eu-1", "store", "analyse-eu-1", "sidecar-analyse-eu-1", request_id="r-x")])[1]
    write_log(run, "store-eu-1", [lines[0], forged, *lines[1:]])
    verdict = audit.audit_run(run)
    assert verdict.broken_chains == 1
    # The record it names reached no instance before it: the join tells too.
    assert kinds(verdict) == [("chain", "audit/store-eu-1.jsonl:3"), ("entry", "audit/store-eu-1.jsonl:2")]
    assert not verdict.clean


def test_an_edited_line_breaks_the_chain_at_the_next_denied(run):
    write_lines(run, RECORDS)
    lines = chained(lines_of("store-eu-1"))
    lines[0] = lines[0].replace('"ts":20.0', '"ts":20.5').replace('"ts":2.0', '"ts":2.5')  # still allowed, the path whole: only the chain tells
    assert lines[0] != chained(lines_of("store-eu-1"))[0]
    write_log(run, "store-eu-1", lines)
    verdict = audit.audit_run(run)
    assert kinds(verdict) == [("chain", "audit/store-eu-1.jsonl:2")]
    assert verdict.forbidden == verdict.undecided == 0 and not verdict.clean


def test_a_removed_line_breaks_the_chain_denied(run):
    write_lines(run, RECORDS)
    write_log(run, "store-eu-1", [line for n, line in enumerate(chained(lines_of("store-eu-1"))) if n != 1])
    verdict = audit.audit_run(run)
    # r-1 now ends at analyse-eu-1: a path cut short is whole as far as it goes.
    assert kinds(verdict) == [("chain", "audit/store-eu-1.jsonl:2")]
    assert verdict.lines == 8


def test_a_first_line_not_from_the_genesis_and_a_line_not_json_break_the_chain_denied(run):
    write_lines(run, RECORDS)
    before = entry("analyse-eu-1", "analyse", "ingest-eu-1", "sidecar-ingest-eu-1", request_id="r-gone")  # linked to, then cut off
    (run / "audit" / "analyse-eu-1.jsonl").write_text("\n".join(chained([before, *lines_of("analyse-eu-1")])[1:]) + "\nnot json\n")
    verdict = audit.audit_run(run)
    assert [(p.where, p.detail) for p in verdict.problems] == [
        ("audit/analyse-eu-1.jsonl:1", "the first line does not start from the genesis"),
        ("audit/analyse-eu-1.jsonl:4", "not a JSON object"),
    ]
    assert verdict.broken_chains == 1


def test_a_reception_the_rules_forbid_denied(run):
    # Consent to care only: store-eu-1 processes for billing.
    write_lines(run, path("r-0") + path("r-1", {**EU_PERSONAL, "consent": "care"}))
    verdict = audit.audit_run(run)
    assert (verdict.broken_chains, verdict.forbidden, verdict.undecided, verdict.paths.total()) == (0, 1, 0, 0)
    assert kinds(verdict) == [("forbidden", "audit/store-eu-1.jsonl:2")]
    assert "the rules do not allow analyse-eu-1 -> store-eu-1" in verdict.problems[0].detail


def test_a_reception_allowed_to_another_instance_is_forbidden_to_this_one_denied(run):
    # An EU subject's personal record in a US instance: allowed into ingest-eu-1, not ingest-us.
    write_lines(run, RECORDS + [entry("ingest-us", "ingest", GATEWAY_SENDER, "entry", request_id="r-us")])
    verdict = audit.audit_run(run)
    assert (verdict.forbidden, kinds(verdict)) == (1, [("forbidden", "audit/ingest-us.jsonl:1")])


def test_a_us_record_in_a_us_instance_allowed(run):
    write_lines(run, RECORDS + path("r-us", US_PERSONAL, US_HOPS, start=50))
    verdict = audit.audit_run(run)
    assert verdict.clean and verdict.records == 4


# ---- whole paths: every instance's lines of a record, joined by its id ----------------------

# The attack of issue 25 as the lines show it. Record x, a US subject's, is delivered through
# the US instances. Then a process holding ingest-eu-1's key hands x (its id, its body) with a
# token forged for AU/anonymous to ingest-eu-1's deciding point, which sends it to the EU replica
# of the next step: that replica never saw x, so accepts it; the store step did, and refuses it
# as a replay (no line). Each line is allowed under the labels it was written with.
AU_ANONYMOUS = {"region": "AU", "category": "anonymous"}
DELIVERED = path("x", US_PERSONAL, US_HOPS)
RELABELLED = DELIVERED + [entry("analyse-eu-1", "analyse", "ingest-eu-1", "sidecar-ingest-eu-1", AU_ANONYMOUS, request_id="x", ts=9)]


def replaced(entries, request_id, instance, **fields):
    """`entries` with the line of `request_id` at `instance` changed."""
    return [{**item, **fields} if (item["request_id"], item["instance"]) == (request_id, instance) else item for item in entries]


def test_a_record_relabelled_under_its_real_id_denied(run):
    write_lines(run, RELABELLED)
    verdict = audit.audit_run(run)
    assert (verdict.broken_chains, verdict.forbidden, verdict.undecided) == (0, 0, 0)  # each line holds on its own
    assert (verdict.records, dict(verdict.paths)) == (1, {"labels": 1, "twice": 1, "sender": 1})
    assert kinds(verdict) == [
        ("labels", "audit/ingest-us.jsonl:1, audit/analyse-us.jsonl:1, audit/store-eu-1.jsonl:1, audit/analyse-eu-1.jsonl:1"),
        ("twice", "audit/analyse-us.jsonl:1, audit/analyse-eu-1.jsonl:1"),
        ("sender", "audit/analyse-eu-1.jsonl:1"),
    ]
    assert verdict.problems[0].detail == (
        'request x: its lines disagree on the labels: {"category": "personal", "consent": "billing,care", "region": "US"} at '
        'audit/ingest-us.jsonl:1, audit/analyse-us.jsonl:1, audit/store-eu-1.jsonl:1; '
        '{"category": "anonymous", "consent": null, "region": "AU"} at audit/analyse-eu-1.jsonl:1')
    assert verdict.summary().endswith("path findings 3 in 1 records (labels 1, twice 1, sender 1): FAILED")


def test_the_record_delivered_once_allowed(run):
    write_lines(run, DELIVERED)
    verdict = audit.audit_run(run)
    assert verdict.clean and (verdict.records, verdict.lines) == (1, 3)


@pytest.mark.parametrize("entries, finding", [
    # analyse-eu-1 wrote r-1 under consent to care only (allowed there; the token said billing too)
    (replaced(RECORDS, "r-1", "analyse-eu-1", labels={**EU_PERSONAL, "consent": "care"}),
     ("labels", "audit/ingest-eu-1.jsonl:2, audit/analyse-eu-1.jsonl:2, audit/store-eu-1.jsonl:2")),
    (replaced(RECORDS, "r-1", "store-eu-1", digest="sha256:" + "cd" * 32),
     ("digest", "audit/ingest-eu-1.jsonl:2, audit/analyse-eu-1.jsonl:2, audit/store-eu-1.jsonl:2")),
    # store-eu-1 took r-1 a second time (a replay its guard no longer remembered)
    (RECORDS + [{**lines_of("store-eu-1")[1], "ts": 25.0}], ("twice", "audit/store-eu-1.jsonl:2, audit/store-eu-1.jsonl:4")),
    # r-1 came into analyse-eu-1 through ingest-us's point, which may send there, but ingest-us never had it
    (replaced(RECORDS, "r-1", "analyse-eu-1", sender="ingest-us", decided_by="sidecar-ingest-us"), ("sender", "audit/analyse-eu-1.jsonl:2")),
    # r-1 starts at analyse-eu-1: put in past the entry by whoever holds ingest-eu-1's key (and a token)
    ([item for item in RECORDS if (item["request_id"], item["instance"]) != ("r-1", "ingest-eu-1")], ("entry", "audit/analyse-eu-1.jsonl:2")),
    # the same, with store-eu-1's clock behind analyse-eu-1's: the path still starts where its sender holds no line
    (replaced([item for item in RECORDS if (item["request_id"], item["instance"]) != ("r-1", "ingest-eu-1")], "r-1", "store-eu-1", ts=0.0),
     ("entry", "audit/analyse-eu-1.jsonl:2")),
], ids=["labels", "digest", "twice", "sender", "entry", "entry-later-hop-earlier-clock"])
def test_a_path_its_lines_do_not_join_into_denied(run, entries, finding):
    write_lines(run, entries)
    verdict = audit.audit_run(run)
    assert (verdict.broken_chains, verdict.forbidden, verdict.undecided) == (0, 0, 0)
    assert (dict(verdict.paths), kinds(verdict)) == ({finding[0]: 1}, [finding])
    assert verdict.problems[0].detail.startswith("request r-1: ") and not verdict.clean


def test_a_sender_that_sends_to_another_step_is_not_the_previous_hops_receiver_denied(tmp_path):
    """The central entity decides every hop, so its state lists every sender beside every
    instance: a line at store-eu-1 from ingest-eu-1, a record ingest-eu-1 did have, passes as decided
    and allowed. ingest-eu-1 sends records on to the analyse step only."""
    run = write_run(tmp_path / "central-entity-5", topology="central-entity")
    hops = [(instance, step, sender, "central-entity") for instance, step, sender, _ in EU_HOPS]
    write_lines(run, path("r-1", hops=hops[:2]) + [entry("store-eu-1", "store", "ingest-eu-1", "central-entity", ts=2)])
    verdict = audit.audit_run(run)
    assert (verdict.broken_chains, verdict.forbidden, verdict.undecided) == (0, 0, 0)
    assert kinds(verdict) == [("sender", "audit/store-eu-1.jsonl:1")]
    assert verdict.problems[0].detail == ("request r-1: store-eu-1 received it at step store from ingest-eu-1, which sends records on "
                                          "to step analyse: not the previous hop's receiver")


def test_the_same_path_through_the_central_entity_allowed(tmp_path):
    run = write_run(tmp_path / "central-entity-5", topology="central-entity")
    write_lines(run, path("r-1", hops=[(instance, step, sender, "central-entity") for instance, step, sender, _ in EU_HOPS]))
    assert audit.audit_run(run).clean


def test_a_path_cut_short_is_whole_as_far_as_it_goes_allowed(run):
    """Denied at the second hop (one line), or its next hop failed under it (502): nothing
    is asked of the lines that are not there."""
    write_lines(run, RECORDS + path("denied", hops=EU_HOPS[:1], start=40) + path("failed", hops=EU_HOPS[:2], start=50))
    verdict = audit.audit_run(run)
    assert verdict.clean and verdict.records == 5


def test_a_line_of_no_strings_is_reported_not_a_crash_denied(run):
    forged = {**lines_of("store-eu-1")[0], "request_id": "r-0", "step": ["store"], "sender": {"x": 1}, "labels": ["EU"], "ts": "late"}
    write_lines(run, RECORDS[:2] + [forged] + [{**forged, "request_id": ["r-9"]}])
    verdict = audit.audit_run(run)
    assert verdict.undecided == 2  # no sender
    # r-0's: its labels differ from the rest, and its sender is no receiver; r-9's names no record
    assert (verdict.records, dict(verdict.paths)) == (1, {"labels": 1, "sender": 1})


@pytest.mark.parametrize("topology", ["sidecar", "central-entity", "dynamic-router-3", "dynamic-router-6"])
def test_the_gateways_are_the_senders_no_point_delivers_to(topology):
    """Where one point decides every hop (the central entity), its senders are instances too."""
    plan = place(manifest.load(topology, services=str(MIXED_REGIONS)))
    points = {p["name"]: p for p in state_of(plan)["points"] if p["senders"]}
    assert paths.gateways_of(points) == {GATEWAY_SENDER}


@pytest.mark.parametrize("claimed, reason", [
    ({"decided_by": None}, "no decided_by"),
    ({"decided_by": None, "sender": None, "revision": None}, "no sender, decided_by, revision"),
    ({"revision": ""}, "no revision"),
    ({"decided_by": "router-9"}, "'router-9' is no enforcement point of this run"),
    ({"decided_by": "sidecar-ingest-eu-1"}, "sidecar-ingest-eu-1 decides no hop from analyse-eu-1 into store-eu-1"),
    ({"sender": "ingest-eu-1"}, "sidecar-analyse-eu-1 decides no hop from ingest-eu-1 into store-eu-1"),
    ({"instance": "store-us"}, "the line names 'store-us' in the log of store-eu-1"),
])
def test_a_reception_without_a_decision_denied(run, claimed, reason):
    write_lines(run, RECORDS)
    write_log(run, "store-eu-1", chained([{**item, **claimed} if item["request_id"] == "r-1" else item for item in lines_of("store-eu-1")]))
    verdict = audit.audit_run(run)
    assert (verdict.broken_chains, verdict.forbidden, verdict.undecided) == (0, 0, 1)
    suffix = ": no enforcement point decided this hop" if reason.startswith("no ") else ""
    assert verdict.problems[0].detail == f"request r-1: {reason}{suffix}"


def test_a_baseline_run_has_no_policy_allowed(tmp_path):
    run = write_run(tmp_path / "baseline-5", topology="baseline")
    write_log(run, "store-eu-1", chained([entry("store-eu-1", "store", None, None, revision=None)]))
    verdict = audit.audit_run(run)
    assert not verdict.policy and verdict.clean
    assert verdict.summary() == "1 lines checked, chains intact 1/1: no policy (nothing decided its receptions)"


def test_a_baseline_run_recorded_before_the_state_said_whether_it_enforces_has_no_policy_allowed(tmp_path):
    run = write_run(tmp_path / "baseline-5", topology="baseline")
    state = json.loads((run / "state.json").read_text())
    del state["enforces"]
    (run / "state.json").write_text(json.dumps(state))
    write_log(run, "store-eu-1", chained([entry("store-eu-1", "store", None, None, revision=None)]))
    assert not audit.audit_run(run).policy


def test_a_baseline_run_has_no_paths_joined_allowed(tmp_path):
    """Nothing stamps a sender in the baseline, and its entry keeps a client's record id."""
    run = write_run(tmp_path / "baseline-5", topology="baseline")
    unstamped = [{**item, "sender": None, "decided_by": None, "revision": None} for item in RECORDS]
    write_lines(run, unstamped + [{**unstamped[1], "labels": {**EU_PERSONAL, "region": "US"}}])
    verdict = audit.audit_run(run)
    assert verdict.clean and (verdict.records, verdict.paths.total()) == (0, 0)


def test_a_baseline_run_with_a_broken_chain_denied(tmp_path):
    run = write_run(tmp_path / "baseline-5", topology="baseline")
    write_log(run, "store-eu-1", chained([entry("store-eu-1", "store", None, None, revision=None)] * 2)[1:])
    assert not audit.audit_run(run).clean


def test_cli_prints_a_verdict_per_run_and_in_total_exit_0_allowed(run, tmp_path):
    write_lines(run, RECORDS)
    out = io.StringIO()
    assert audit.main([run], out=out, err=io.StringIO()) == 0
    assert f"{run.name} (sidecar-mixed-regions, envoy-opa; rule set {REVISION}): 9 lines checked, chains intact 3/3, " \
           "forbidden receptions 0, receptions without a decision 0, path findings 0 in 3 records: clean" in out.getvalue()
    assert out.getvalue().splitlines()[-1] == "audit: 1 runs (0 without policy): 9 lines checked, chains intact 3/3, " \
        "forbidden receptions 0, receptions without a decision 0, path findings 0 in 3 records: clean"


def test_cli_exit_1_when_any_run_fails_denied(run, tmp_path):
    write_lines(run, RECORDS[:2] + [entry("store-eu-1", "store", "analyse-eu-1", None, request_id="r-0", ts=2)])
    clean = write_run(tmp_path / "another")
    write_lines(clean, RECORDS)
    out = io.StringIO()
    assert audit.main([clean, run], out=out, err=io.StringIO()) == 1
    assert "undecided: audit/store-eu-1.jsonl:1: request r-0: no decided_by" in out.getvalue()
    assert out.getvalue().splitlines()[-1].endswith(
        "receptions without a decision 1, path findings 0 in 4 records: FAILED (1 runs)")


def test_cli_prints_path_findings_by_kind_with_the_lines_they_name_denied(run, tmp_path):
    write_lines(run, RELABELLED)
    clean = write_run(tmp_path / "another")
    write_lines(clean, RECORDS)
    out = io.StringIO()
    assert audit.main([clean, run], out=out, err=io.StringIO()) == 1
    printed = out.getvalue()
    assert "path findings 3 in 1 records (labels 1, twice 1, sender 1): FAILED" in printed
    assert "  twice: audit/analyse-us.jsonl:1, audit/analyse-eu-1.jsonl:1: request x: received 2 times at step analyse: analyse-us, analyse-eu-1" in printed
    assert "  sender: audit/analyse-eu-1.jsonl:1: request x: analyse-eu-1 received it from ingest-eu-1, which holds no line of it" in printed
    assert printed.splitlines()[-1].endswith("path findings 3 in 4 records (labels 1, twice 1, sender 1): FAILED (1 runs)")


def test_a_folder_without_state_is_not_a_run_denied(tmp_path):
    with pytest.raises(audit.AuditError, match="not a run folder"):
        audit.audit_run(tmp_path)


def test_a_run_without_the_data_its_point_decided_with_cannot_be_audited_denied(run):
    write_lines(run, RECORDS)
    (run / "points" / "entry" / "data" / "data.json").unlink()
    out = io.StringIO()
    assert audit.main([run], out=out, err=io.StringIO()) == 1
    assert "cannot be audited: " in out.getvalue() and "points/entry/data/data.json" in out.getvalue()
    assert out.getvalue().splitlines()[-1].endswith("FAILED (1 runs)")


def test_default_folders_skip_runs_current_allowed(tmp_path):
    first = write_run(tmp_path / "a")
    (tmp_path / "current").symlink_to("a")
    (tmp_path / "k8s").mkdir()
    assert audit.run_folders(tmp_path) == [first]


def test_an_instance_s_second_chain_in_a_file_of_its_own_is_that_instance_s_allowed(run):
    """A pod that replaced a deleted one (Kubernetes) writes a new chain into a new emptyDir:
    analyse-eu-1's r-0 in analyse-eu-1.jsonl, r-1 and r-2 in analyse-eu-1.pod-2.jsonl, each chain from
    the genesis, both analyse-eu-1's."""
    write_lines(run, [item for item in RECORDS if item["instance"] != "analyse-eu-1"])
    write_log(run, "analyse-eu-1", chained(lines_of("analyse-eu-1")[:1]))
    write_log(run, "analyse-eu-1.pod-2", chained(lines_of("analyse-eu-1")[1:]))
    verdict = audit.audit_run(run)
    assert (verdict.lines, verdict.chains, verdict.records) == (9, 4, 3)
    assert verdict.clean, verdict.summary()


def test_a_second_chain_is_the_instance_its_file_names_not_its_lines_denied(run):
    """The same lines of analyse-eu-1 in a file named for analyse-us: receptions in analyse-us,
    which no point that decides ingest-eu-1's hops sends to, and store-eu-1's lines of r-1 and r-2
    name a sender (analyse-eu-1) that holds none."""
    write_lines(run, [item for item in RECORDS if item["instance"] != "analyse-eu-1"])
    write_log(run, "analyse-eu-1", chained(lines_of("analyse-eu-1")[:1]))
    write_log(run, "analyse-us.pod-2", chained(lines_of("analyse-eu-1")[1:]))
    verdict = audit.audit_run(run)
    assert (verdict.undecided, dict(verdict.paths)) == (2, {"sender": 2}) and not verdict.clean, verdict.summary()
