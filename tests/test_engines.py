"""Engines: the pieces of envoy-compiled that need no running process (the end-to-end and
differential tests run the real ones)."""

import itertools
import json
import re

import pytest

from complyroute import engines, labels, manifest
from complyroute.policyfiles import POLICIES
from complyroute.engines import envoy_compiled, precompute
from complyroute.plan import place


@pytest.mark.parametrize("limit", [0, 7, 10, 99, 100, 65536, 70000])
def test_digits_at_most_matches_exactly_the_numbers_up_to_the_limit_allowed(limit):
    pattern = re.compile(envoy_compiled.digits_at_most(limit))
    width = len(str(limit))
    for number in range(0, min(limit, 2000) + 1):
        assert pattern.fullmatch(str(number)), number
    assert pattern.fullmatch(str(limit))
    assert pattern.fullmatch(str(limit).zfill(width))


@pytest.mark.parametrize("limit", [0, 7, 10, 99, 100, 65536, 70000])
def test_digits_at_most_refuses_larger_numbers_and_other_text_denied(limit):
    pattern = re.compile(envoy_compiled.digits_at_most(limit))
    for text in [str(limit + 1), str(limit + 9), str(limit * 10 + 10), "1" * (len(str(limit)) + 1), "", "-1", "1e3", " 1", "0x10"]:
        assert not pattern.fullmatch(text), text


CONSENT = labels.Label("consent", "x-data-consent", "purposes", multiple=True)


def test_canonical_sets_are_every_sorted_non_empty_set_allowed():
    values = precompute.canonical_sets(CONSENT, ["care", "billing", "analytics"])
    assert values == ["analytics", "billing", "care", "analytics,billing", "analytics,care", "billing,care", "analytics,billing,care"]


def test_too_many_values_of_a_set_to_enumerate_are_refused_denied():
    with pytest.raises(precompute.SpaceTooLarge, match="label consent; there are 11 .* at most 10 values"):
        precompute.canonical_sets(CONSENT, [f"p{n}" for n in range(precompute.MAX_SET_VALUES + 1)])


def test_boxes_cover_exactly_the_labellings_allowed():
    labellings = [("personal", "care", "EU"), ("personal", "care", "NO"), ("personal", None, "EU"), ("personal", None, "NO"),
                  ("health", "care", "EU")]
    found = precompute.boxes(labellings)
    assert {values for box in found for values in itertools.product(*box)} == set(labellings)
    assert len(found) == 3  # merged label by label: {health, personal} x care x EU; personal x absent x EU; personal x {care, absent} x NO
    split = precompute.boxes(labellings, split_absent=True)
    assert all(values == {None} or None not in values for box in split for values in box)
    assert {values for box in split for values in itertools.product(*box)} == set(labellings)


def test_boxes_add_no_labelling_denied():
    # Two labellings differing in two labels are not one box: its corners would be added.
    found = precompute.boxes([("a", "x"), ("b", "y")])
    assert {values for box in found for values in itertools.product(*box)} == {("a", "x"), ("b", "y")}


def test_compiled_listener_sends_what_its_tree_misses_to_opa_denied():
    topology = manifest.load("central-entity", services=str(manifest.REPO / "topologies/examples/mixed-regions.yaml"), engine="envoy-compiled")
    plan = place(topology)
    configs = engines.configure("envoy-compiled", plan.points, topology.engine, POLICIES)
    listeners = {l["name"]: l for l in configs["central-entity"].envoy["static_resources"]["listeners"]}
    host = lambda name: listeners[name]["filter_chains"][0]["filters"][0]["typed_config"]["route_config"]["virtual_hosts"][0]
    # The entry takes records from clients: no tree, every record asks OPA.
    assert "matcher" not in host("entry") and host("entry")["routes"][0]["route"]["cluster_header"]
    tree = host("from-ingest-eu")["matcher"]
    # What is not a record is Envoy's to refuse, as the decision route's listener refuses it.
    record, query, method = tree["matcher_list"]["matchers"]
    assert tree["on_no_match"]["action"]["typed_config"]["direct_response"] == {"status": 404}
    assert [m["on_match"]["action"]["typed_config"]["direct_response"]["status"] for m in (query, method)] == [400, 405]
    inner = record["on_match"]["matcher"]
    ask_opa = inner["on_no_match"]["action"]["typed_config"]
    assert ask_opa["route"] == {"cluster_header": "x-complyroute-destination", "timeout": "60s"}
    assert "typed_per_filter_config" not in ask_opa  # ext_authz stays on: OPA decides
    first, record = inner["matcher_list"]["matchers"]
    assert first["predicate"]["single_predicate"]["input"]["typed_config"]["header_name"] == "x-complyroute-destination"
    assert first["on_match"]["action"]["typed_config"] == ask_opa
    categories = record["on_match"]["matcher"]["matcher_tree"]["exact_match_map"]["map"]
    assert set(categories) == {"anonymous", "personal", "health"}
    leaves = [m["on_match"]["action"]["typed_config"] for c in categories.values() for m in c["matcher"]["matcher_list"]["matchers"]]
    assert {leaf["route"]["cluster"] for leaf in leaves} == {"analyse-eu"}  # an EU sender: its region's replica
    assert all(leaf["typed_per_filter_config"]["envoy.filters.http.ext_authz"]["disabled"] for leaf in leaves)


def test_a_listener_with_nothing_decided_ahead_asks_opa_for_every_record_denied():
    # A rule set that reads the body has no allowed table: the tree has no leaves, and every
    # record takes the decision route (an empty matcher list would answer 404).
    matcher = envoy_compiled.listener_matcher({}, "1s", ["x-data-classification", "x-data-retention"])
    headers = {":method": "POST", ":path": "/process", "content-type": "application/json", "content-length": "2",
               "x-data-classification": "public"}
    assert envoy_compiled.matched_action(matcher, headers)["name"] == "decide"
    assert '"matchers": []' not in json.dumps(matcher)
