"""Engines: the pieces of envoy-compiled that need no running process (the end-to-end and
differential tests run the real ones)."""

import re

import pytest

from complyroute import engines, manifest
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


def test_canonical_consents_are_every_sorted_non_empty_set_allowed():
    values = precompute.canonical_consents(["care", "billing", "analytics"])
    assert values == ["analytics", "billing", "care", "analytics,billing", "analytics,care", "billing,care", "analytics,billing,care"]


def test_too_many_purposes_to_enumerate_are_refused_denied():
    with pytest.raises(precompute.SpaceTooLarge, match="at most 10 purposes"):
        precompute.canonical_consents([f"p{n}" for n in range(precompute.MAX_PURPOSES + 1)])


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
