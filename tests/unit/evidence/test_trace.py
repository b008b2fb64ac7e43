"""trace: access log and decision log lines joined to audit lines by the record's id, on small run
folders written as Envoy, OPA and the services write them (the real ones: tests/e2e/test_trace_e2e.py)."""

import io
import json
import os

import pytest

from complyroute import __main__ as cli
from complyroute.evidence import trace
from complyroute.runtime.local import deployment

RID = "5a7ba5b4-3e9c-44e1-8860-96fdcd05523f"
OTHER = "4e76adab-a00d-4ede-92bd-65f8ced182e2"
REVISION = "a7ca0b0352722d1db7b83101539e644cb2dcb075"
LABELS = {"region": "EU", "category": "personal", "consent": "billing,care"}
DIGEST = "sha256:eb2f"
DENIAL = {
    "code": "CERTIFICATION_MISSING",
    "message": 'no instance of step "store" may receive this record',
    "reasons": [{"code": "CERTIFICATION_MISSING", "instance": "store-eu", "message": "store-eu holds none"}],
    "request_id": RID,
    "revision": REVISION,
}


def allowed(destination, **headers):
    return {"allowed": True, "headers": {"x-complyroute-destination": destination, **headers}}


def denied(body=DENIAL):
    return {"allowed": False, "http_status": 403, "headers": {"content-type": "application/json"}, "body": json.dumps(body)}


def decision_line(timestamp, sender, step, result, request_id=RID, bundles={"complyroute": {"revision": REVISION}}):
    """One line as OPA's console decision logger writes it (fields as in a real one, masked)."""
    headers = {":path": "/process", "x-request-id": request_id, "x-data-region": "EU", "x-data-category": "personal",
               "x-data-consent": "care,billing"}
    entry = {
        "decision_id": "eb31fa40", "erased": ["/input/attributes/request/http/body"], "level": "info",
        "input": {"attributes": {"contextExtensions": {"sender": sender, "step": step}, "request": {"http": {"headers": headers}}}},
        "msg": "Decision Log", "path": "complyroute/envoy/response", "result": result, "time": timestamp[:19] + "Z",
        "timestamp": timestamp, "type": "openpolicyagent.org/decision_logs",
        **({"bundles": bundles} if bundles else {}),
    }
    return json.dumps(entry)


def access_line(time, point, sender, step, status=200, destination=None, instance=None, revision=REVISION, denial_code=None,
                details="via_upstream", request_id=RID):
    """One line as a deciding listener's Envoy writes it (proxy/envoy.py ACCESS_LOG_FIELDS)."""
    denied = denial_code is not None
    return json.dumps({
        "denial_code": denial_code, "denial_revision": revision if denied else None, "destination": destination,
        "details": "ext_authz_denied" if denied else details, "duration_ms": 7, "flags": "UAEX" if denied else "-",
        "instance": instance, "listener": "egress", "method": "POST", "path": "/process", "peer": None, "point": point,
        "record_id": request_id, "revision": None if denied else revision, "sender": sender, "status": status, "step": step,
        "time": time,
    })


def audit_line(ts_ms, instance, step, sender, decided_by, request_id=RID, revision=REVISION):
    return json.dumps({"ts": ts_ms, "instance": instance, "step": step, "request_id": request_id, "labels": LABELS,
                       "digest": DIGEST, "sender": sender, "decided_by": decided_by, "revision": revision, "prev": "0" * 64})


# 2026-11-22T12:55:44Z is 1795352144 s since the epoch.
def at(seconds_after):
    return 1795352144_000 + seconds_after * 1000


def run_folder(tmp_path, logs: dict[str, list[str]], audit: dict[str, list[str]], engine="envoy-opa", decision_logs="file",
               access: dict[str, list[str]] | None = None):
    run = tmp_path / "mixed-regions-5-20261122-125542"
    (run / "logs").mkdir(parents=True)
    (run / "audit").mkdir()
    (run / "state.json").write_text(json.dumps({"topology": "mixed-regions", "engine": engine, "decision_logs": decision_logs}))
    for point, lines in logs.items():
        (run / "logs" / f"{point}.opa.log").write_text("".join(line + "\n" for line in lines))
    for point, lines in (access or {}).items():
        (run / "logs" / f"{point}.access.log").write_text("".join(line + "\n" for line in lines))
    for instance, lines in audit.items():
        (run / "audit" / f"{instance}.jsonl").write_text("".join(line + "\n" for line in lines))
    return run


def traced(run, request_id=RID) -> list[str]:
    """What trace prints, by hop (the header line first)."""
    out = io.StringIO()
    assert trace.trace(run, request_id, out=out) == 0
    return out.getvalue().split("\nhop ")


def walkthrough_envoy_opa(tmp_path, last=allowed("store-eu")):
    """The walkthrough's EU record under envoy-opa: three points decide, three instances receive
    (the last only if the last decision allows). Another record's lines are interleaved, and
    the OPA logs hold other lines too."""
    return run_folder(tmp_path, {
        "entry": ['{"level":"error","msg":"Bundle load failed"}',
                  decision_line("2026-11-22T12:55:44.1Z", "gateway", "ingest", allowed("ingest-eu"))],
        "sidecar-ingest-eu": [decision_line("2026-11-22T12:55:44.15Z", "ingest-eu", "analyse", allowed("analyse-eu")),
                              decision_line("2026-11-22T12:55:44.16Z", "ingest-eu", "analyse", allowed("analyse-eu"), OTHER)],
        "sidecar-analyse-eu": [decision_line("2026-11-22T12:55:44.2Z", "analyse-eu", "store", last)],
    }, {
        "ingest-eu": [audit_line(at(0.11), "ingest-eu", "ingest", "gateway", "entry")],
        "analyse-eu": [audit_line(at(0.155), "analyse-eu", "analyse", "ingest-eu", "sidecar-ingest-eu"),
                       audit_line(at(0.165), "analyse-eu", "analyse", "ingest-eu", "sidecar-ingest-eu", OTHER)],
        "store-eu": [audit_line(at(0.21), "store-eu", "store", "analyse-eu", "sidecar-analyse-eu")] if last["allowed"] else [],
    })


def test_each_hop_its_point_labels_decision_revision_and_audit_line_allowed(tmp_path):
    header, *hops = traced(walkthrough_envoy_opa(tmp_path))
    assert header.startswith(f"record {RID} in run mixed-regions-5-20261122-125542 (mixed-regions, engine envoy-opa)")
    assert [hop.splitlines()[0] for hop in hops] == [
        "1: entry decides gateway -> ingest",
        "2: sidecar-ingest-eu decides ingest-eu -> analyse",
        "3: sidecar-analyse-eu decides analyse-eu -> store",
    ]
    for hop, instance, step in zip(hops, ["ingest-eu", "analyse-eu", "store-eu"], ["ingest", "analyse", "store"]):
        assert "  labels    category personal, consent care,billing, region EU\n" in hop
        assert f"  decision  allowed -> {instance}\n" in hop
        assert f"  revision  {REVISION}\n" in hop
        assert (f"  received  by {instance} ({step}): category personal, consent billing,care, region EU, "
                f"digest {DIGEST}, revision {REVISION}") in hop
    assert OTHER not in "".join(hops)


def test_a_denied_hop_names_its_status_code_message_and_reasons_denied(tmp_path):
    *_, last = traced(walkthrough_envoy_opa(tmp_path, last=denied()))
    assert last.splitlines()[1:] == [
        "  labels    category personal, consent care,billing, region EU",
        '  decision  denied 451 CERTIFICATION_MISSING: no instance of step "store" may receive this record',
        "            reason CERTIFICATION_MISSING (store-eu): store-eu holds none",
        f"  revision  {REVISION}",
    ]


def test_hops_the_compiled_engine_decided_ahead_of_time_are_told_by_their_audit_line_allowed(tmp_path):
    """Entry and denial asked OPA; the hop between them was an Envoy route. Its time comes from
    its audit line, which puts it between them."""
    run = run_folder(tmp_path, {
        "entry": [decision_line("2026-11-22T12:55:44.1Z", "gateway", "ingest", allowed("ingest-eu"))],
        "sidecar-analyse-eu": [decision_line("2026-11-22T12:55:44.2Z", "analyse-eu", "store", denied())],
    }, {
        "ingest-eu": [audit_line(at(0.11), "ingest-eu", "ingest", "gateway", "entry")],
        "analyse-eu": [audit_line(at(0.15), "analyse-eu", "analyse", "ingest-eu", "sidecar-ingest-eu", revision="r-audit")],
    }, engine="envoy-compiled")
    _, first, route, denial = traced(run)
    assert "allowed -> ingest-eu" in first and "received  by ingest-eu" in first
    assert route.splitlines() == [
        "2: sidecar-ingest-eu decides ingest-eu -> analyse",
        "  decision  allowed -> analyse-eu, decided ahead of time by sidecar-ingest-eu: a route of the compiled engine, no decision log line",
        "  revision  r-audit (the audit line's)",
        f"  received  by analyse-eu (analyse): category personal, consent billing,care, region EU, digest {DIGEST}, revision r-audit",
    ]
    assert denial.startswith("3: sidecar-analyse-eu decides analyse-eu -> store") and "denied 451" in denial


def test_decisions_are_ordered_by_time_not_by_their_timestamps_text_allowed():
    # OPA trims trailing zeros: ".1Z" is after ".15Z" as text, before it in time.
    assert trace.epoch_seconds("2026-11-22T12:55:44.1Z") < trace.epoch_seconds("2026-11-22T12:55:44.15Z")
    assert trace.epoch_seconds("2026-11-22T12:55:44.281175957Z") == pytest.approx(1795352144.281175957)
    assert trace.epoch_seconds("2026-11-22T13:55:44+01:00") == trace.epoch_seconds("2026-11-22T12:55:44Z")


def test_a_timestamp_that_is_not_rfc_3339_denied():
    with pytest.raises(ValueError, match="not an RFC 3339 timestamp"):
        trace.epoch_seconds("12:55:44")


@pytest.mark.parametrize("entry, revision", [
    ({"bundles": {"complyroute": {"revision": "from-bundle"}}, "result": allowed("x", **{"x-complyroute-revision": "from-header"})}, "from-bundle"),
    ({"result": allowed("x", **{"x-complyroute-revision": "from-header"})}, "from-header"),
    ({"bundles": {}, "result": denied({**DENIAL, "revision": "from-denial"})}, "from-denial"),
])
def test_the_revision_is_the_bundles_else_the_answers_allowed(entry, revision):
    assert trace.revision_of(entry) == revision


def test_a_decision_that_names_no_revision_says_so_denied(tmp_path):
    run = run_folder(tmp_path, {"entry": [decision_line("2026-11-22T12:55:44.1Z", "gateway", "ingest", allowed("ingest-eu"), bundles=None)]}, {})
    _, hop = traced(run)
    assert "  revision  (not named)\n" in hop and "  received  no audit line of the destination" in hop


def test_a_line_that_only_mentions_the_id_is_not_the_records_denied(tmp_path):
    """The id in a denial body or another header is not the record's id: only x-request-id
    (or x-complyroute-record-id) is."""
    stray = json.loads(decision_line("2026-11-22T12:55:44.1Z", "gateway", "ingest", denied(), request_id=OTHER))
    stray["input"]["attributes"]["request"]["http"]["headers"]["x-note"] = RID
    run = run_folder(tmp_path, {"entry": [json.dumps(stray)]}, {})
    with pytest.raises(trace.TraceError, match=f"no decision and no audit line of record {RID}"):
        trace.trace(run, RID)


def test_an_unknown_id_is_an_error_denied(tmp_path):
    with pytest.raises(trace.TraceError, match="no decision and no audit line of record nope .*x-request-id of the entry's answer"):
        trace.trace(walkthrough_envoy_opa(tmp_path), "nope")


def walkthrough_access_lines(last_status=200, last_code=None):
    """The walkthrough's EU record as the deciding listeners' access lines tell it; another
    record's line and a forwarding listener's (no sender) beside them."""
    last = ({"destination": "store-eu", "instance": "store-eu"} if last_code is None else {"denial_code": last_code})
    return {
        "entry": [access_line("2026-11-22T12:55:44.100Z", "entry", "gateway", "ingest", destination="ingest-eu-1,ingest-eu-2",
                              instance="ingest-eu-2")],
        "sidecar-ingest-eu": [access_line("2026-11-22T12:55:44.150Z", "sidecar-ingest-eu", "ingest-eu", "analyse",
                                          destination="analyse-eu", instance="analyse-eu"),
                              access_line("2026-11-22T12:55:44.160Z", "sidecar-ingest-eu", "ingest-eu", "analyse",
                                          destination="analyse-eu", instance="analyse-eu", request_id=OTHER),
                              json.dumps({"point": "sidecar-ingest-eu", "listener": "ingress", "record_id": RID, "status": 200,
                                          "time": "2026-11-22T12:55:44.105Z"})],
        "sidecar-analyse-eu": [access_line("2026-11-22T12:55:44.200Z", "sidecar-analyse-eu", "analyse-eu", "store", status=last_status,
                                           **last)],
    }


def test_without_decision_logs_the_access_lines_tell_each_hop_allowed(tmp_path):
    run = run_folder(tmp_path, {}, {
        "ingest-eu-2": [audit_line(at(0.11), "ingest-eu-2", "ingest", "gateway", "entry")],
        "analyse-eu": [audit_line(at(0.155), "analyse-eu", "analyse", "ingest-eu", "sidecar-ingest-eu")],
        "store-eu": [audit_line(at(0.21), "store-eu", "store", "analyse-eu", "sidecar-analyse-eu")],
    }, decision_logs="off", access=walkthrough_access_lines())
    _, first, second, third = traced(run)
    assert first.splitlines() == [
        "1: entry decides gateway -> ingest",
        "  decision  allowed -> ingest-eu-1,ingest-eu-2, decision logs off (engine.decision_logs): no labels as the point read them",
        "  sent to   ingest-eu-2: 200 via_upstream, 7 ms at the point",
        f"  revision  {REVISION}",
        f"  received  by ingest-eu-2 (ingest): category personal, consent billing,care, region EU, digest {DIGEST}, revision {REVISION}",
    ]
    assert second.startswith("2: sidecar-ingest-eu decides ingest-eu -> analyse") and "received  by analyse-eu" in second
    assert third.startswith("3: sidecar-analyse-eu decides analyse-eu -> store") and "received  by store-eu" in third


def test_without_decision_logs_a_denial_is_told_by_its_code_and_revision_denied(tmp_path):
    run = run_folder(tmp_path, {}, {}, decision_logs="off", access=walkthrough_access_lines(451, "CERTIFICATION_MISSING"))
    *_, last = traced(run)
    assert last.splitlines() == [
        "3: sidecar-analyse-eu decides analyse-eu -> store",
        "  decision  denied 451 CERTIFICATION_MISSING (its reasons are in the decision log)",
        f"  revision  {REVISION}",
    ]


def test_a_refusal_by_the_points_envoy_names_its_check_denied(tmp_path):
    refused = access_line("2026-11-22T12:55:44.100Z", "entry", "gateway", "ingest", status=431, revision=None, details="lua_response")
    run = run_folder(tmp_path, {}, {}, decision_logs="off", access={"entry": [refused]})
    _, hop = traced(run)
    assert "  decision  refused 431 by the point's Envoy (lua_response)\n" in hop and "received" not in hop


def test_access_and_decision_lines_of_one_hop_are_one_hop_allowed(tmp_path):
    run = walkthrough_envoy_opa(tmp_path)
    for point, lines in walkthrough_access_lines().items():
        (run / "logs" / f"{point}.access.log").write_text("".join(line + "\n" for line in lines))
    _, first, *rest = traced(run)
    assert len(rest) == 2
    assert "  labels    category personal, consent care,billing, region EU\n" in first
    assert "  decision  allowed -> ingest-eu\n" in first  # the decision log's answer
    assert "  sent to   ingest-eu-2: 200 via_upstream, 7 ms at the point\n" in first


def test_a_run_without_decision_logs_or_access_logs_says_how_to_turn_them_on_denied(tmp_path):
    run = run_folder(tmp_path, {}, {"ingest-eu": [audit_line(at(0.1), "ingest-eu", "ingest", "gateway", "entry")]}, decision_logs="off")
    with pytest.raises(trace.TraceError, match="has no decision logs .* and no access logs .*set engine.decision_logs: file in the manifest"):
        trace.trace(run, RID)


def test_a_folder_that_is_not_a_run_denied(tmp_path):
    with pytest.raises(trace.TraceError, match="is not a run folder"):
        trace.trace(tmp_path, RID)


def test_the_command_traces_runs_current_else_the_newest_allowed(tmp_path, monkeypatch, capsys):
    run = walkthrough_envoy_opa(tmp_path)
    older = tmp_path / "older"
    older.mkdir()
    (older / "state.json").write_text("{}")
    os.utime(older / "state.json", (0, 0))
    monkeypatch.setenv("COMPLYROUTE_RUNS", str(tmp_path))
    assert cli.main(["trace", RID]) == 0  # no runs/current: the newest
    assert "3: sidecar-analyse-eu decides" in capsys.readouterr().out
    (tmp_path / "current").symlink_to(older)
    assert cli.main(["trace", RID]) == 2  # runs/current, whose decision logs are off
    assert "run older has no decision logs" in capsys.readouterr().err
    assert cli.main(["trace", RID, "--run", str(run)]) == 0


def test_the_command_without_any_run_denied(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("COMPLYROUTE_RUNS", str(tmp_path))
    assert cli.main(["trace", RID]) == 2
    assert "no run folder under runs/: deploy first, or name one with --run" in capsys.readouterr().err
