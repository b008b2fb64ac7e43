"""OPA's partial evaluation decides which answers may be tabled (engines/independence.py): a rule
that reads the record, the request id, the clock or another non-deterministic built-in, written in
any form, leaves its labellings to OPA in full; the same form over a constant does not. Real OPA
over a central entity of two services (256 allowed labellings)."""


import pytest

from complyroute.engines import envoy_opa, independence, precompute
from complyroute.policy.policyfiles import POLICIES
from complyroute.topology import manifest
from complyroute.topology.plan import place

from tests.rulesets import shipped_with

# An exclusion of every candidate whenever `condition` holds: if the table were built without
# seeing the condition, it would route records the rules deny.
HIDDEN = '''
# METADATA
# title: Hidden
# description: A rule written in a form a syntax walk could miss.
# custom:
#   code: HIDDEN
#   message: hidden
exclusions contains exclusion(rego.metadata.rule(), id, "hidden") if {{
	{condition}
	some id, _ in candidates
}}
'''

READS = {
    "object.filter": 'object.filter(input.record, {"diagnosis"}).diagnosis',
    "comprehension": 'count([key | some key, _ in input.record; key == "diagnosis"]) > 0',
    "walk": 'walk(input.record, [["diagnosis"], _])',
    "json.filter": 'json.filter(input.record, ["diagnosis"]) != {}',
    "object.get": 'object.get(input, ["record", "diagnosis"], null) != null',
    # The record reached through a variable over input's keys: OPA 1.14's partial evaluation bound
    # the variable to the keys it knew (labels, sender, step) and evaluated these completely.
    "input[key]": 'some key\n\tinput[key].diagnosis',
    "some key, value in input": 'some key, value in input\n\tkey == "record"\n\tvalue.diagnosis',
    "input's keys": 'count({key | some key; input[key]}) > 4',  # labels, sender, step, record, request_id
    "request id": 'startswith(input.request_id, "x")',
    # Each false when the table is built (a condition true then would deny every labelling, and leave
    # nothing to table), and all but the first true some day at run time: a table that froze the
    # answer of its own minute would route against the rule from then on.
    "time.clock": 'time.clock([time.now_ns(), "UTC"])[1] > 59',
    "time.date": 'time.date([time.now_ns(), "UTC"])[0] >= 2100',
    "time.now_ns": 'time.now_ns() > 4102444800000000000',  # 2100-01-01
    "rand.intn": 'rand.intn("hidden", 1000000) == 7',
    "the table": 'data.complyroute_quick_path.table.gateway',
}
# The same forms over constants: nothing to depend on, the whole table.
CONSTANTS = {
    "object.filter": 'object.filter({"a": 1}, {"diagnosis"}).diagnosis',
    "comprehension": 'count([key | some key, _ in {"a": 1}; key == "diagnosis"]) > 0',
    "walk": 'walk({"a": 1}, [["diagnosis"], _])',
    "input[key]": 'some key\n\t{"a": {"b": 1}}[key].b == 2',
    "time.date": 'time.date([0, "UTC"])[0] >= 2100',
    # The clock replaced by a constant: OPA's plan calls no clock (partial evaluation leaves any `with` over).
    "time.now_ns replaced": 'time.now_ns() > 4102444800000000000 with time.now_ns as 0',
}
# What OPA's static view (independence.beyond_the_space) names for each form: the unknown it can
# read, or the non-deterministic built-in it can call.
REACHED = {form: "input.record" for form in READS} | {
    "request id": "input.request_id", "time.clock": "time.now_ns", "time.date": "time.now_ns", "time.now_ns": "time.now_ns",
    "rand.intn": "rand.intn", "the table": "data.complyroute_quick_path.table"}


def decided(tmp_path, condition: str | None):
    policies = shipped_with(tmp_path, HIDDEN.format(condition=condition) if condition else "")
    points = place(manifest.load("central-entity", services="2")).points
    _, precomputed = envoy_opa.decided_data(points, policies)
    return precomputed


@pytest.fixture(scope="module")
def whole(tmp_path_factory):
    return decided(tmp_path_factory.mktemp("shipped"), None)


def test_the_shipped_rules_are_tabled_whole_allowed(whole):
    assert len(whole.outcomes) == 256 and whole.skipped == ""


@pytest.mark.parametrize("form", READS)
def test_a_rule_reading_beyond_the_space_is_never_tabled_denied(tmp_path, form):
    precomputed = decided(tmp_path, READS[form])
    assert precomputed.outcomes == {}
    assert "256 of 256 allowed answers depend on what no table holds" in precomputed.skipped


@pytest.mark.parametrize("form", CONSTANTS)
def test_the_same_form_over_constants_is_tabled_allowed(tmp_path, whole, form):
    precomputed = decided(tmp_path, CONSTANTS[form])
    destinations = {labelling: destination for labelling, (destination, _) in precomputed.outcomes.items()}
    assert destinations == {labelling: destination for labelling, (destination, _) in whole.outcomes.items()}  # the revision differs
    assert precomputed.skipped == ""


@pytest.mark.parametrize("form", READS)
def test_the_static_view_names_what_a_reading_rule_can_reach_denied(tmp_path, form):
    policies = shipped_with(tmp_path, HIDDEN.format(condition=READS[form]))
    assert REACHED[form] in independence.beyond_the_space(independence.asked_copy(policies))


@pytest.mark.parametrize("form", CONSTANTS)
def test_the_static_view_finds_nothing_in_the_same_form_over_constants_allowed(tmp_path, form):
    policies = shipped_with(tmp_path, HIDDEN.format(condition=CONSTANTS[form]))
    assert independence.beyond_the_space(independence.asked_copy(policies)) is None


ASKS = [({"complyroute": {}}, {"labels": {"region": region}, "sender": "gateway", "step": "step-01"}) for region in ("EU", "US")]


def test_the_shipped_rules_have_no_labelling_asked_allowed(monkeypatch):
    asked = []
    monkeypatch.setattr(independence, "_residuals", lambda copy, asks: asked.extend(asks) or [])
    assert independence.residuals(POLICIES, ASKS) == [False, False] and asked == []


def test_a_rule_reading_the_record_has_every_labelling_asked_denied(tmp_path, monkeypatch):
    asked = []
    monkeypatch.setattr(independence, "_residuals", lambda copy, asks: asked.extend(asks) or [number for number, _ in asks])
    policies = shipped_with(tmp_path, HIDDEN.format(condition=READS["object.get"]))
    assert independence.residuals(policies, ASKS) == [True, True] and len(asked) == 2
