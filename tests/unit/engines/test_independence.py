"""Reading OPA's partial evaluation (independence.completely_evaluated), its dependency analysis
(may_read) and its plan (calls), and the copy it asks (asked_copy); what OPA itself answers is
tests/integration/engines/test_independence.py's."""

import shutil

import pytest

from complyroute.engines import independence
from complyroute.policy.policyfiles import POLICIES, RECORD_SHAPE

EQ = {"type": "ref", "value": [{"type": "var", "value": "eq"}]}


def var(name):
    return {"type": "var", "value": name}


def const(value):
    if isinstance(value, dict):
        return {"type": "object", "value": [[const(k), const(v)] for k, v in value.items()]}
    if isinstance(value, list):
        return {"type": "array", "value": [const(item) for item in value]}
    return {"type": {str: "string", bool: "boolean", int: "number"}[type(value)], "value": value}


def bound(name, term, swap=False):
    terms = [EQ, term, var(name)] if swap else [EQ, var(name), term]
    return {"index": 0, "terms": terms}


DECISION = const({"allowed": True, "destinations": [["svc-01"]]})
CANONICAL = const({"region": "EU"})
RECORD_REF = {"type": "ref", "value": [var("input"), {"type": "string", "value": "record"}]}


def test_both_values_constant_is_complete_allowed():
    assert independence.completely_evaluated({"queries": [[bound("decision", DECISION), bound("canonical", CANONICAL, swap=True)]]})


@pytest.mark.parametrize("result", [
    {},  # undefined: no query
    {"queries": [[bound("decision", DECISION)]]},  # canonical not bound
    {"queries": [[bound("decision", DECISION), bound("canonical", CANONICAL)]] * 2},  # alternatives
    {"queries": [[bound("decision", DECISION), bound("canonical", CANONICAL)]], "support": [{"package": {}}]},
    {"queries": [[bound("decision", {"type": "ref", "value": [var("data"), {"type": "string", "value": "x"}]}), bound("canonical", CANONICAL)]]},
    {"queries": [[bound("decision", {"type": "object", "value": [[const("record"), RECORD_REF]]}), bound("canonical", CANONICAL)]]},
    {"queries": [[bound("decision", DECISION), bound("canonical", CANONICAL), {"index": 2, "terms": RECORD_REF}]]},  # a saved read
    {"queries": [[bound("decision", DECISION), {**bound("canonical", CANONICAL), "negated": True}]]},
], ids=["undefined", "unbound", "alternatives", "support", "ref", "nested-ref", "saved", "negated"])
def test_anything_left_over_is_a_residual_denied(result):
    assert not independence.completely_evaluated(result)


def test_the_copy_asks_an_object_for_the_record_allowed():
    copy = independence.asked_copy(POLICIES)
    assert (copy / RECORD_SHAPE / "record.rego").read_bytes() == independence.OBJECT_RECORD.read_bytes()
    assert (copy / "complyroute" / "compliance" / "compliance.rego").read_bytes() == (POLICIES / "complyroute" / "compliance" / "compliance.rego").read_bytes()


def test_a_rule_set_with_a_record_shape_of_its_own_denied(tmp_path):
    policies = tmp_path / "policies"
    shutil.copytree(POLICIES, policies)
    shape = policies / RECORD_SHAPE / "record.rego"
    shape.write_text(shape.read_text().replace("is_json_object if is_object(input.record)",
                                               "is_json_object if {\n\tis_object(input.record)\n\tinput.record.ok\n}"))
    with pytest.raises(independence.RecordShapeChanged, match="differs from the platform's"):
        independence.asked_copy(policies)


def ref(*terms):
    """A reference as OPA's dependency analysis writes it: the root a variable, then its terms."""
    return [var(terms[0]), *({"type": "var", "value": term[1:]} if isinstance(term, str) and term.startswith("$")
                             else const(term) for term in terms[1:])]


@pytest.mark.parametrize("reference", [
    ref("input"),  # the whole input (a builtin over input, `some key, value in input`)
    ref("input", "record"), ref("input", "record", "diagnosis"),
    ref("input", "$key"),  # a variable key: input[key]
    ref("data"), ref("data", "complyroute"), ref("data", "complyroute", "$key", "kid"),
], ids=["input", "record", "in-record", "input-key", "data", "complyroute", "data-key"])
def test_a_reference_that_may_reach_an_unknown_reads_it_denied(reference):
    unknowns = [unknown for unknown in independence.UNKNOWNS if independence.may_read(reference, unknown)]
    assert unknowns, f"{reference} reads none of {independence.UNKNOWNS}"


@pytest.mark.parametrize("reference", [
    ref("input", "labels"), ref("input", "labels", "$name"), ref("input", "step"), ref("input", 0),
    ref("data", "complyroute", "index"), ref("data", "complyroute", "reference", "$name"), ref("data", "complyroute_quick_path", "keys"),
], ids=["labels", "a-label", "step", "number-key", "index", "reference", "keys"])
def test_a_reference_beside_every_unknown_reads_none_allowed(reference):
    assert not [unknown for unknown in independence.UNKNOWNS if independence.may_read(reference, unknown)]


def call(function):
    return {"type": "CallStmt", "stmt": {"func": function, "args": [], "result": 1}}


def nested(*statements):
    """Statements inside a block inside a block, as OPA plans a rule's body."""
    return {"type": "BlockStmt", "stmt": {"blocks": [{"stmts": [{"type": "NotStmt", "stmt": {"block": {"stmts": list(statements)}}}]}]}}


def planned(plans: dict, functions: dict) -> dict:
    return {"plans": {"plans": [{"name": name, "blocks": [{"stmts": body}]} for name, body in plans.items()]},
            "funcs": {"funcs": [{"name": name, "params": [0, 1], "return": 2, "blocks": [{"stmts": body}]} for name, body in functions.items()]}}


def test_a_plan_calls_the_builtins_its_entrypoints_reach_through_functions_allowed():
    plan = planned({"decision": [call("g0.decide")], "response": [call("g0.sign")]},
                   {"g0.decide": [nested(call("g0.helper"), call("count"))], "g0.helper": [call("g0.decide"), call("sprintf")],
                    "g0.sign": [call("time.now_ns")]})
    assert independence.calls(plan, ["decision"]) == ({"count", "sprintf"}, False)


def test_a_plan_that_reaches_a_builtin_or_a_dynamic_call_says_so_denied():
    plan = planned({"decision": [call("g0.decide")]},
                   {"g0.decide": [nested(call("g0.sign"))], "g0.sign": [nested(call("time.now_ns"), {"type": "CallDynamicStmt", "stmt": {}})]})
    assert independence.calls(plan, ["decision"]) == ({"time.now_ns"}, True)
