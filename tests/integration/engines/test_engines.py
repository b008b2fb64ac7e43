"""envoy-compiled's configure step over a whole topology, with real OPA asking the rule set
(the pieces that need no process: tests/unit/engines/test_engines.py)."""

from complyroute import engines
from complyroute.policy.policyfiles import POLICIES
from complyroute.policy.ruleset import RuleSet
from complyroute.topology import manifest
from complyroute.topology.plan import place


def test_compiled_listener_sends_what_its_tree_misses_to_opa_denied():
    topology = manifest.load("central-entity", services=str(manifest.REPO / "topologies/examples/mixed-regions.yaml"), engine="envoy-compiled")
    plan = place(topology)
    configs = engines.configure("envoy-compiled", plan.points, topology.engine, RuleSet.of(POLICIES))
    listeners = {l["name"]: l for l in configs["central-entity"].envoy["static_resources"]["listeners"]}
    host = lambda name: listeners[name]["filter_chains"][0]["filters"][0]["typed_config"]["route_config"]["virtual_hosts"][0]
    # The entry takes records from clients: no tree, every record asks OPA.
    assert "matcher" not in host("entry") and host("entry")["routes"][0]["route"]["cluster_header"]
    tree = host("from-ingest-eu-1")["matcher"]
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
    # An EU sender: its region's two replicas, alone where the rules keep the record in the EU,
    # and first, before the US instance, where they let it go there too (anonymous data).
    assert {leaf["route"]["cluster"] for leaf in leaves} == {"analyse-eu-1,analyse-eu-2", "analyse-eu-1,analyse-eu-2|analyse-us"}
    clusters = {c["name"]: c for c in configs["central-entity"].envoy["static_resources"]["clusters"]}
    tiers = clusters["analyse-eu-1,analyse-eu-2|analyse-us"]["load_assignment"]["endpoints"]
    assert [(tier["priority"], len(tier["lb_endpoints"])) for tier in tiers] == [(0, 2), (1, 1)]
    assert [len(tier["lb_endpoints"]) for tier in clusters["analyse-eu-1,analyse-eu-2"]["load_assignment"]["endpoints"]] == [2]
    assert all(leaf["typed_per_filter_config"]["envoy.filters.http.ext_authz"]["disabled"] for leaf in leaves)
