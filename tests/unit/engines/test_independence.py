"""Reading OPA's partial evaluation (independence.completely_evaluated) and the copy it asks
(asked_copy); what OPA itself answers is tests/integration/engines/test_independence.py's."""

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
