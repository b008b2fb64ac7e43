"""What the audit's re-check asks beyond a line's hop (complyroute/evidence/audit.py): a rule
reading the clock is asked at the time the line records (when the deciding point took the hop),
so a run gets one verdict whenever it is audited; a rule reading the record's content leaves its
lines not re-checkable. Real OPA."""

from datetime import datetime, timezone

from complyroute.evidence import audit
from complyroute.policy import policydata
from complyroute.policy.policyfiles import POLICIES

from tests.rulesets import shipped_with
from tests.integration.evidence.test_recheck import CATALOG, EU_PERSONAL, hop
from tests.unit.evidence.test_audit import EU_HOPS, chained, entry, write_log, write_run

RULE = '''
# METADATA
# title: Hidden
# description: Excludes every candidate while the condition holds.
# custom:
#   code: HIDDEN
#   message: hidden
exclusions contains exclusion(rego.metadata.rule(), id, "hidden") if {{
	{condition}
	some id, _ in candidates
}}
'''
BEFORE_2100 = 'time.date([time.now_ns(), "UTC"])[0] < 2100'  # true when the line was written; false from 2100 on
DIAGNOSIS = 'object.filter(input.record, {"diagnosis"}).diagnosis'


def with_rule(tmp_path, condition):
    return shipped_with(tmp_path, RULE.format(condition=condition))


def ns(year: int) -> int:
    return int(datetime(year, 6, 1, tzinfo=timezone.utc).timestamp() * 1e9)


def asked(policies, hops):
    points = {"entry": policydata.opa_data({"entry": CATALOG}, policies)["entry"]}
    return points, audit.allowed_hops(hops, points, policies)


IN_1999 = 'time.date([time.now_ns(), "UTC"])[0] == 1999'  # excludes every candidate in 1999 alone


def test_a_clock_rule_is_asked_at_the_lines_time_allowed(tmp_path):
    _, allowed = asked(with_rule(tmp_path, IN_1999), [{**hop("ingest-eu-1", EU_PERSONAL), "time_ns": ns(2026)}])
    assert allowed == {0}


def test_a_clock_rule_is_asked_at_the_lines_time_denied(tmp_path):
    # Forbidden at the line's time, though the same hop is allowed at the audit's.
    _, allowed = asked(with_rule(tmp_path, IN_1999), [{**hop("ingest-eu-1", EU_PERSONAL), "time_ns": ns(1999)}])
    assert allowed == set()


def test_what_decides_a_hop_allowed(tmp_path):
    points, _ = asked(POLICIES, [])
    assert audit.what_decides(POLICIES, points, [hop("ingest-eu-1", EU_PERSONAL)]) == ["nothing"]
    clock = with_rule(tmp_path, BEFORE_2100)
    points, _ = asked(clock, [])
    assert audit.what_decides(clock, points, [hop("ingest-eu-1", EU_PERSONAL)]) == ["clock"]


def test_a_rule_reading_the_record_leaves_the_line_not_re_checkable_denied(tmp_path):
    body = with_rule(tmp_path, DIAGNOSIS)
    points, _ = asked(body, [])
    assert audit.what_decides(body, points, [hop("ingest-eu-1", EU_PERSONAL)]) == ["record"]


def audited_at(tmp_path, received: int, decided: int | None) -> audit.Verdict:
    """The verdict on a run of one EU personal record into ingest-eu-1, received by the instance
    in year `received` and decided by the entry in year `decided` (None: a line from before
    points recorded it), under the rule that excludes every candidate in 1999."""
    run = write_run(tmp_path / "run")
    line = {**entry(*EU_HOPS[0]), "ts": ns(received) / 1e6, **({"decided_at": ns(decided) / 1e6} if decided else {})}
    write_log(run, "ingest-eu-1", chained([line]))
    return audit.audit_run(run, with_rule(tmp_path, IN_1999))


def test_a_clock_rule_is_asked_when_the_point_decided_not_when_the_instance_received_allowed(tmp_path):
    assert audited_at(tmp_path, received=1999, decided=2026).forbidden == 0


def test_a_clock_rule_is_asked_when_the_point_decided_not_when_the_instance_received_denied(tmp_path):
    assert audited_at(tmp_path, received=2026, decided=1999).forbidden == 1


def test_a_line_without_the_decision_s_time_is_asked_when_the_instance_received_it_denied(tmp_path):
    assert audited_at(tmp_path, received=1999, decided=None).forbidden == 1
