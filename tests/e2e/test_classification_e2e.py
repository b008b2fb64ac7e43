"""A second rule set, of another kind, through every topology under both engines: the
classification regime of rule-sets/classification (labels classification and retention,
declared in its schema only; instances' clearance, retains, quarantined attributes from the
manifest; a rule that reads the record's body; a rule that needs no label).

One deployment per topology and engine (module-scoped), shared by every check: enforcement
(each path the manifest's comment names, and its denied twins), the label cases of the
hostile suite under the rule set's own headers, trace, and the audit's re-check of every
line against the rule set that decided it. Nothing in complyroute's code names these labels:
the rule set's schema does.
"""

import dataclasses
import io
import json
from pathlib import Path

import pytest

from complyroute.evidence import audit, trace
from complyroute.policy import policyfiles
from complyroute.runtime.local import deployment
from complyroute.topology import manifest

from tests.rulesets import of_manifest

from .helpers import matrix, post, wait_for_audit


CLASSIFICATION = manifest.REPO / "topologies" / "examples" / "classification.yaml"
RULES = policyfiles.source_of("classification")  # the client reads the headers from its schema
ADULT = {"subject": "ann", "subject_age": 40}
MINOR = {"subject": "tim", "subject_age": 15}


@pytest.fixture(scope="module", params=matrix())
def deployed(request):
    topology, engine = request.param
    if deployment.read_state():
        deployment.stop(out=io.StringIO())
    loaded = manifest.load(topology, services=str(CLASSIFICATION), engine=engine)
    assert loaded.policy == "classification"  # borrowed with the services
    # Decision logs on: trace names each hop's decision.
    state = deployment.deploy(dataclasses.replace(loaded, engine={**loaded.engine, "decision_logs": "file"}), of_manifest(loaded),
                              out=io.StringIO())
    yield state
    deployment.stop(out=io.StringIO())


def send(state, labels, record=ADULT, **kwargs):
    return post(state, labels, record, policies=RULES, **kwargs)


def path_of(answer) -> list[str]:
    return [entry["instance"] for entry in answer.body["path"]]


@pytest.mark.parametrize(("labels", "path"), [
    ({"classification": "internal"}, ["ingest-eu", "analyse-eu", "store-eu"]),
    # Its twins, each rerouted by one label: analyse-eu is cleared confidential only; store-eu
    # keeps nothing short; analyse-eu keeps nothing long.
    ({"classification": "secret"}, ["ingest-eu", "analyse-us", "store-eu"]),
    ({"classification": "internal", "retention": "short"}, ["ingest-eu", "analyse-eu", "store-us"]),
    ({"classification": "confidential", "retention": "long"}, ["ingest-eu", "analyse-us", "store-eu"]),
])
def test_records_take_the_path_their_labels_allow_allowed(deployed, labels, path):
    request_id, answer = send(deployed, labels)
    assert answer.status == 200, answer.text
    assert path_of(answer) == path
    lines = wait_for_audit(deployed, request_id, 3)
    # The audit lines hold the rule set's labels by name, null where absent.
    assert {json.dumps(line["labels"], sort_keys=True) for line in lines} == {
        json.dumps({"classification": labels["classification"], "retention": labels.get("retention")}, sort_keys=True)}


@pytest.mark.parametrize(("labels", "record", "code"), [
    # secret and short: store-eu keeps nothing short, store-us is cleared internal only.
    ({"classification": "secret", "retention": "short"}, ADULT, "NO_COMPLIANT_INSTANCE"),
    # The rule that reads the body: a minor's secret record, analyse-eu not cleared, analyse-us markets.
    ({"classification": "secret"}, MINOR, "NO_COMPLIANT_INSTANCE"),
])
def test_records_no_instance_may_receive_are_refused_denied(deployed, labels, record, code):
    _, answer = send(deployed, labels, record)
    assert answer.status == 451 and answer.body["code"] == code, answer.text
    reasons = {reason["code"] for reason in answer.body["reasons"]}
    assert reasons & {"RETENTION_UNSUPPORTED", "CLEARANCE_INSUFFICIENT", "MINOR_TO_MARKETING"}, answer.text


def test_a_minor_s_record_goes_where_no_marketing_is_allowed(deployed):
    # The body rule's allowed twin: a minor's internal record, which analyse-eu may take.
    _, answer = send(deployed, {"classification": "internal"}, MINOR)
    assert answer.status == 200 and path_of(answer) == ["ingest-eu", "analyse-eu", "store-eu"], answer.text


def test_the_quarantined_instance_receives_nothing_denied(deployed):
    # The label-free rule: ingest-us is quarantined; nothing reaches it, whatever the labels.
    for labels in ({"classification": "public"}, {"classification": "secret", "retention": "long"}):
        request_id, answer = send(deployed, labels)
        assert answer.status == 200 and "ingest-us" not in path_of(answer), answer.text


@pytest.mark.parametrize(("labels", "status", "code"), [
    ({}, 400, "LABEL_MISSING"),
    ({"classification": "top-secret"}, 400, "LABEL_UNKNOWN"),
    ({"classification": "secret,public"}, 400, "LABELS_CONTRADICTORY"),
    ({"classification": "internal", "retention": "forever"}, 400, "LABEL_UNKNOWN"),
    ({"classification": "x" * 1025}, 431, "LABEL_TOO_LARGE"),  # the Lua bound, over the schema's header
])
def test_hostile_labels_under_the_rule_set_s_headers_denied(deployed, labels, status, code):
    _, answer = send(deployed, labels)
    assert answer.status == status and answer.body["code"] == code, answer.text


def test_the_shipped_rule_set_s_labels_mean_nothing_here_denied(deployed):
    # x-data-region and friends are not this rule set's labels: a record carrying only them is unlabelled.
    _, answer = post(deployed, {"region": "EU", "category": "personal"}, ADULT)
    assert answer.status == 400 and answer.body["code"] == "LABEL_MISSING", answer.text


def test_trace_and_audit_follow_the_rule_set(deployed):
    request_id, answer = send(deployed, {"classification": "secret"})
    assert answer.status == 200
    wait_for_audit(deployed, request_id, 3)
    out = io.StringIO()
    assert trace.main(request_id, Path(deployed["run_dir"]), out=out) == 0
    assert "classification secret, retention (none)" in out.getvalue()
    verdict = audit.audit_run(Path(deployed["run_dir"]))
    assert verdict.forbidden == 0 and verdict.undecided == 0 and verdict.lines >= 3, verdict.problems[:3]
    # Its minors rule reads the record's content, which a line holds as a digest: every line is
    # counted apart as not re-checkable, by name, and the verdict is not clean.
    assert verdict.unverifiable == verdict.lines and not verdict.clean
    assert {problem.kind for problem in verdict.problems} == {"unverifiable"}
    assert f"not re-checkable {verdict.lines}" in verdict.summary() and verdict.summary().endswith("FAILED")
