"""The label schema (complyroute/policy/labels.py) and the rule sets chosen by name (policyfiles.rule_set)."""

import json

import pytest

from complyroute.policy import labels, policyfiles
from complyroute.policy.policyfiles import POLICIES

SHIPPED = labels.reference_of(POLICIES)


def with_labels(declared: dict) -> dict:
    return {**SHIPPED, "labels": declared}


def test_the_shipped_schema_is_its_three_labels_in_name_order_allowed():
    schema = labels.schema(POLICIES)
    assert [(label.name, label.header, label.multiple, label.required) for label in schema] == [
        ("category", "x-data-category", False, True),
        ("consent", "x-data-consent", True, False),
        ("region", "x-data-region", False, True),
    ]
    assert json.loads(labels.service_setting(schema)) == [
        {"name": "category", "header": "x-data-category", "required": True},
        {"name": "consent", "header": "x-data-consent", "required": False},
        {"name": "region", "header": "x-data-region", "required": True},
    ]
    # A rule set from before the schema (an older commit policy-diff compares with) has these.
    assert labels.schema_of({key: value for key, value in SHIPPED.items() if key != "labels"}) == schema


@pytest.mark.parametrize(("declared", "problem"), [
    ({}, "at least one label"),
    ({"aud": {"header": "x-data-aud", "values": "regions"}}, "label token's own claims"),
    ({"Region": {"header": "x-data-region", "values": "regions"}}, "lowercase"),
    ({"region": {"header": "x-complyroute-region", "values": "regions"}}, "outside x-complyroute-"),
    ({"region": {"header": "x-request-id", "values": "regions"}}, "x-request-id"),
    ({"region": {"header": "X-Data-Region", "values": "regions"}}, "lowercase x- header"),
    ({"a": {"header": "x-data-a", "values": "regions"}, "b": {"header": "x-data-a", "values": "regions"}}, "labels.a's header too"),
    ({"region": {"header": "x-data-region", "values": "nowhere"}}, "names no object"),
    ({"region": {"header": "x-data-region", "values": "regions", "multiple": "yes"}}, "true or false"),
    ({"region": {"header": "x-data-region", "values": "regions", "subsets_of": "purposes"}}, "multiple label only"),
    ({"region": {"header": "x-data-region", "values": "regions", "colour": "red"}}, "labels.region.colour: is not a field of a label"),
    ({"region": {"header": "x-data-region", "values": "regions", "requird": True}}, "labels.region.requird: .* did you mean 'required'"),
    ({"region": {"values": "regions"}}, "labels.region: a label is an object with the fields"),
])
def test_an_unusable_schema_is_refused_naming_the_field_denied(declared, problem):
    with pytest.raises(labels.LabelSchemaError, match=problem):
        labels.schema_of(with_labels(declared))


def test_a_label_added_through_the_schema_is_read_allowed():
    declared = {**SHIPPED["labels"], "tier": {"header": "x-data-tier", "values": "regions"}}
    schema = labels.schema_of(with_labels(declared))
    assert [label.name for label in schema] == ["category", "consent", "region", "tier"]
    assert not schema[-1].required and schema[-1].known(SHIPPED)[:2] == ["AU", "BR"]


def test_rule_sets_are_chosen_by_name_or_folder_allowed():
    assert policyfiles.rule_set("policies") == POLICIES  # the shipped one holds the platform's parts
    classification = policyfiles.rule_set("classification")
    assert classification.parent == policyfiles.ASSEMBLED
    # Its own rules, the adapter and system policies from policies/, not the adapter's tests.
    assert (classification / "complyroute" / "compliance" / "compliance.rego").read_bytes() == (
        policyfiles.RULE_SETS / "classification" / "complyroute" / "compliance" / "compliance.rego").read_bytes()
    assert (classification / "complyroute" / "envoy" / "envoy.rego").is_file()
    assert not (classification / "complyroute" / "envoy" / "envoy_test.rego").exists()
    assert (classification / "system" / "authz" / "authz.rego").is_file()
    assert policyfiles.rule_set(policyfiles.RULE_SETS / "classification") == classification  # the same content, once


def test_a_rule_set_that_is_none_is_refused_denied(tmp_path):
    with pytest.raises(policyfiles.RuleSetError, match="name one of policies, classification"):
        policyfiles.rule_set("nope")
    with pytest.raises(policyfiles.RuleSetError, match="no folder holding complyroute/compliance"):
        policyfiles.rule_set(tmp_path)
