"""What the audit's re-check asks beyond a line's hop (complyroute/evidence/audit.py): a rule
reading the clock is asked at the time the line records, so a run gets one verdict whenever it is
audited; a rule reading the record's content leaves its lines not re-checkable. Real OPA."""

from datetime import datetime, timezone

from complyroute.evidence import audit
from complyroute.policy import policydata
from complyroute.policy.policyfiles import POLICIES

from tests.rulesets import shipped_with
from tests.integration.evidence.test_recheck import CATALOG, EU_PERSONAL, hop

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
