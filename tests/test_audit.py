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

from complyroute import audit, enforcement, manifest, policydata
from complyroute.plan import GATEWAY_SENDER, place

MIXED_REGIONS = manifest.REPO / "topologies" / "examples" / "mixed-regions.yaml"
EU_PERSONAL = {"region": "EU", "category": "personal", "consent": "billing,care"}
REVISION = "0123abc"


def write_run(folder, topology="sidecar"):
    """A run folder as deploy leaves it, without processes: state.json and each point's data."""
    plan = place(manifest.load(topology, services=str(MIXED_REGIONS)))
    deciding = {p.name: p.catalog for p in plan.points if p.deciding}
    for name, document in policydata.opa_data(deciding).items():
        enforcement.write_data(folder / "points" / name / "data", document)
    state = {
        "topology": plan.topology.name, "kind": plan.topology.kind, "enforces": plan.enforces, "engine": "envoy-opa",
        "points": [
            {"name": p.name, "node": p.node, "senders": [d.sender for d in p.deciding], "destinations": sorted(p.destinations)}
            for p in plan.points
        ],
    }
    (folder / "audit").mkdir(parents=True)
    (folder / "state.json").write_text(json.dumps(state))
    return folder


def entry(instance, step, sender, decided_by, labels=EU_PERSONAL, request_id="r-1", revision=REVISION):
    return {
        "ts": 1.5, "instance": instance, "step": step, "request_id": request_id,
        "labels": {"consent": None, **labels}, "digest": "sha256:" + "ab" * 32,
        "sender": sender, "decided_by": decided_by, "revision": revision,
    }


def chained(entries):
    """The lines of one log as the service writes them."""
    lines, prev = [], audit.GENESIS
    for item in entries:
        line = json.dumps(item, separators=(",", ":"))[:-1] + f',"prev":"{prev}"}}'
        prev = hashlib.sha256(line.encode()).hexdigest()
        lines.append(line)
    return lines


def write_log(run, instance, lines):
    (run / "audit" / f"{instance}.jsonl").write_text("".join(line + "\n" for line in lines))


# One EU record through the EU instances, each hop decided by the point in front of it.
EU_CHAIN = {
    "ingest-eu": [entry("ingest-eu", "ingest", GATEWAY_SENDER, "entry")],
    "analyse-eu": [entry("analyse-eu", "analyse", "ingest-eu", "sidecar-ingest-eu")],
    "store-eu": [entry("store-eu", "store", "analyse-eu", "sidecar-analyse-eu", request_id=f"r-{n}") for n in range(3)],
}


@pytest.fixture
def run(tmp_path):
    return write_run(tmp_path / "sidecar-mixed-regions-5-20261122-060000")


def write_chain(run, **replaced):
    for instance, entries in {**EU_CHAIN, **replaced}.items():
        write_log(run, instance, chained(entries))


def test_records_decided_and_allowed_at_every_hop_clean(run):
    write_chain(run)
    verdict = audit.audit_run(run)
    assert (verdict.lines, verdict.chains, verdict.broken_chains, verdict.forbidden, verdict.undecided) == (5, 3, 0, 0, 0)
    assert verdict.clean and dict(verdict.revisions) == {REVISION: 5}


def test_an_inserted_line_breaks_the_chain_at_the_next_denied(run):
    write_chain(run)
    lines = chained(EU_CHAIN["store-eu"])
    # Linked to the line before it, as a forger would: the line after it no longer holds.
    forged = chained([EU_CHAIN["store-eu"][0], entry("store-eu", "store", "analyse-eu", "sidecar-analyse-eu", request_id="r-x")])[1]
    write_log(run, "store-eu", [lines[0], forged, *lines[1:]])
    verdict = audit.audit_run(run)
    assert (verdict.broken_chains, [p.where for p in verdict.problems]) == (1, ["audit/store-eu.jsonl:3"])
    assert not verdict.clean


def test_an_edited_line_breaks_the_chain_at_the_next_denied(run):
    write_chain(run)
    lines = chained(EU_CHAIN["store-eu"])
    lines[0] = lines[0].replace('"request_id":"r-0"', '"request_id":"r-9"')  # still allowed: only the chain tells
    write_log(run, "store-eu", lines)
    verdict = audit.audit_run(run)
    assert [(p.kind, p.where) for p in verdict.problems] == [("chain", "audit/store-eu.jsonl:2")]
    assert verdict.forbidden == verdict.undecided == 0 and not verdict.clean


def test_a_removed_line_breaks_the_chain_denied(run):
    write_chain(run)
    write_log(run, "store-eu", [line for n, line in enumerate(chained(EU_CHAIN["store-eu"])) if n != 1])
    verdict = audit.audit_run(run)
    assert [(p.kind, p.where) for p in verdict.problems] == [("chain", "audit/store-eu.jsonl:2")]
    assert verdict.lines == 4


def test_a_first_line_not_from_the_genesis_and_a_line_not_json_break_the_chain_denied(run):
    write_chain(run)
    (run / "audit" / "analyse-eu.jsonl").write_text("\n".join(chained(EU_CHAIN["analyse-eu"] * 2)[1:]) + "\nnot json\n")
    verdict = audit.audit_run(run)
    assert [(p.where, p.detail) for p in verdict.problems] == [
        ("audit/analyse-eu.jsonl:1", "the first line does not start from the genesis"),
        ("audit/analyse-eu.jsonl:2", "not a JSON object"),
    ]
    assert verdict.broken_chains == 1


def test_a_reception_the_rules_forbid_denied(run):
    # Consent to care only: store-eu processes for billing.
    write_chain(run, **{"store-eu": [entry("store-eu", "store", "analyse-eu", "sidecar-analyse-eu", {**EU_PERSONAL, "consent": "care"})]})
    verdict = audit.audit_run(run)
    assert (verdict.broken_chains, verdict.forbidden, verdict.undecided) == (0, 1, 0)
    assert "the rules do not allow analyse-eu -> store-eu" in verdict.problems[0].detail


def test_a_reception_allowed_to_another_instance_is_forbidden_to_this_one_denied(run):
    # An EU subject's personal record in a US instance: allowed into ingest-eu, not ingest-us.
    write_chain(run, **{"ingest-us": [entry("ingest-us", "ingest", GATEWAY_SENDER, "entry")]})
    verdict = audit.audit_run(run)
    assert (verdict.forbidden, [p.where for p in verdict.problems]) == (1, ["audit/ingest-us.jsonl:1"])


def test_a_us_record_in_a_us_instance_allowed(run):
    write_chain(run, **{"ingest-us": [entry("ingest-us", "ingest", GATEWAY_SENDER, "entry", {**EU_PERSONAL, "region": "US"})]})
    assert audit.audit_run(run).clean


@pytest.mark.parametrize("claimed, reason", [
    ({"decided_by": None}, "no decided_by"),
    ({"decided_by": None, "sender": None, "revision": None}, "no sender, decided_by, revision"),
    ({"revision": ""}, "no revision"),
    ({"decided_by": "router-9"}, "'router-9' is no enforcement point of this run"),
    ({"decided_by": "sidecar-ingest-eu"}, "sidecar-ingest-eu decides no hop from analyse-eu into store-eu"),
    ({"sender": "ingest-eu"}, "sidecar-analyse-eu decides no hop from ingest-eu into store-eu"),
    ({"instance": "store-us"}, "the line names 'store-us' in the log of store-eu"),
])
def test_a_reception_without_a_decision_denied(run, claimed, reason):
    write_chain(run, **{"store-eu": [{**entry("store-eu", "store", "analyse-eu", "sidecar-analyse-eu"), **claimed}]})
    verdict = audit.audit_run(run)
    assert (verdict.broken_chains, verdict.forbidden, verdict.undecided) == (0, 0, 1)
    suffix = ": no enforcement point decided this hop" if reason.startswith("no ") else ""
    assert verdict.problems[0].detail == f"request r-1: {reason}{suffix}"


def test_a_baseline_run_has_no_policy_allowed(tmp_path):
    run = write_run(tmp_path / "baseline-5", topology="baseline")
    write_log(run, "store-eu", chained([entry("store-eu", "store", None, None, revision=None)]))
    verdict = audit.audit_run(run)
    assert not verdict.policy and verdict.clean
    assert verdict.summary() == "1 lines checked, chains intact 1/1: no policy (nothing decided its receptions)"


def test_a_baseline_run_recorded_before_the_state_said_whether_it_enforces_has_no_policy_allowed(tmp_path):
    run = write_run(tmp_path / "baseline-5", topology="baseline")
    state = json.loads((run / "state.json").read_text())
    del state["enforces"]
    (run / "state.json").write_text(json.dumps(state))
    write_log(run, "store-eu", chained([entry("store-eu", "store", None, None, revision=None)]))
    assert not audit.audit_run(run).policy


def test_a_baseline_run_with_a_broken_chain_denied(tmp_path):
    run = write_run(tmp_path / "baseline-5", topology="baseline")
    write_log(run, "store-eu", chained([entry("store-eu", "store", None, None, revision=None)] * 2)[1:])
    assert not audit.audit_run(run).clean


def test_cli_prints_a_verdict_per_run_and_in_total_exit_0_allowed(run, tmp_path):
    write_chain(run)
    out = io.StringIO()
    assert audit.main([run], out=out, err=io.StringIO()) == 0
    assert f"{run.name} (sidecar-mixed-regions, envoy-opa; rule set {REVISION}): 5 lines checked, chains intact 3/3, " \
           "forbidden receptions 0, receptions without a decision 0: clean" in out.getvalue()
    assert out.getvalue().splitlines()[-1].startswith("audit: 1 runs (0 without policy): 5 lines checked")


def test_cli_exit_1_when_any_run_fails_denied(run, tmp_path):
    write_chain(run, **{"store-eu": [entry("store-eu", "store", "analyse-eu", None)]})
    clean = write_run(tmp_path / "another")
    write_chain(clean)
    out = io.StringIO()
    assert audit.main([clean, run], out=out, err=io.StringIO()) == 1
    assert "undecided: audit/store-eu.jsonl:1: request r-1: no decided_by" in out.getvalue()
    assert out.getvalue().splitlines()[-1].endswith("receptions without a decision 1: FAILED (1 runs)")


def test_a_folder_without_state_is_not_a_run_denied(tmp_path):
    with pytest.raises(audit.AuditError, match="not a run folder"):
        audit.audit_run(tmp_path)


def test_a_run_without_the_data_its_point_decided_with_cannot_be_audited_denied(run):
    write_chain(run)
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
