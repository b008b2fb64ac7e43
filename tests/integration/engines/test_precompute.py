"""The allowed table: the rule set's own answers, whatever rules it holds, and the guard that
keeps every fast path to them. Real OPA over the walkthrough's decision space."""

import copy

import pytest

from complyroute import engines
from complyroute.authoring import policydiff
from complyroute.engines import envoy_compiled, envoy_opa, precompute
from complyroute.policy.policyfiles import POLICIES
from complyroute.policy.ruleset import RuleSet
from complyroute.topology import manifest
from complyroute.topology.plan import place

from tests.rulesets import shipped_with
from tests.walkthrough import rule_set_with_rule

# A rule that reads the record's body: no table can enumerate it.
MINORS = '''
# METADATA
# title: Minors
# description: A record whose subject is a minor never goes to a US instance.
# custom:
#   code: MINOR_EXPORT
#   message: records of minors stay out of the US
exclusions contains exclusion(rego.metadata.rule(), id, "minor") if {
	input.record.age < 18
	some id, candidate in candidates
	candidate.region == "US"
}
'''


def with_rule(folder, rule: str):
    return shipped_with(folder, rule)


@pytest.fixture(scope="module")
def walkthrough():
    topology = manifest.load(policydiff.WALKTHROUGH)
    return topology, place(topology).points


@pytest.fixture(scope="module")
def shipped(walkthrough):
    _, points = walkthrough
    return envoy_opa.decided_data(points, POLICIES)


@pytest.fixture(scope="module")
def swiss(walkthrough, tmp_path_factory):
    _, points = walkthrough
    policies = rule_set_with_rule(tmp_path_factory.mktemp("swiss"))  # policies/README.md's walkthrough
    return policies, envoy_opa.decided_data(points, policies)


ENTRY = ("entry", "entry")  # the walkthrough's entry: gateway (US) -> ingest


def test_an_added_rule_reroutes_in_the_table_allowed(shipped, swiss):
    (_, before), (_, (data, after)) = shipped, swiss
    # A CH personal record from the US gateway: the shipped rules prefer ingest-us (then
    # the ingest-eu replicas), the Swiss rule excludes it; both engines' tables follow the rule set.
    assert before.outcomes[(*ENTRY, ("personal", "care", "CH"))][0] == "ingest-us|ingest-eu-1,ingest-eu-2"
    assert after.outcomes[(*ENTRY, ("personal", "care", "CH"))][0] == "ingest-eu-1,ingest-eu-2"
    # The table: a level per label, in the schema's order (category, consent, region).
    assert data["entry"][precompute.QUICK_PATH_DOCUMENT]["table"]["gateway"]["ingest"]["personal"]["care"]["CH"] == {"destination": "ingest-eu-1,ingest-eu-2"}


def test_an_added_rule_leaves_its_twin_alone_denied(shipped, swiss):
    (_, before), (_, (_, after)) = shipped, swiss
    # Its allowed twins: a US personal record, a CH anonymous one (not personal).
    for labels in [("personal", "care", "US"), ("anonymous", None, "CH")]:
        assert before.outcomes[(*ENTRY, labels)][0] == after.outcomes[(*ENTRY, labels)][0] == "ingest-us|ingest-eu-1,ingest-eu-2"
    changed = {key for key in before.outcomes.keys() | after.outcomes.keys() if before.outcomes.get(key, (None,))[0] != after.outcomes.get(key, (None,))[0]}
    assert changed and all(region == "CH" and category in ("personal", "health") for _, _, (category, _, region) in changed)


def test_the_compiled_routes_follow_an_added_rule_allowed(walkthrough, swiss):
    topology, points = walkthrough
    policies, _ = swiss
    configs = engines.configure("envoy-compiled", points, {**topology.engine, "kind": "envoy-compiled"}, RuleSet.of(policies))
    sidecar = next(point for point in points if point.name == "sidecar-ingest-us")
    listener = envoy_compiled.compiled_listeners(sidecar)[0]
    routes = {l["name"]: l for l in configs[sidecar.name].envoy["static_resources"]["listeners"]}
    tree = routes[listener.name]["filter_chains"][0]["filters"][0]["typed_config"]["route_config"]["virtual_hosts"][0]["matcher"]
    headers = {":method": "POST", ":path": "/process", "content-length": "2", "x-data-category": "personal", "x-data-consent": "care"}
    # From ingest-us, a CH personal record may not go to analyse-us any more: the analyse-eu replicas only.
    assert envoy_compiled.routed_outcome(envoy_compiled.tree_walk(tree)({**headers, "x-data-region": "CH"}))[0] == "analyse-eu-1,analyse-eu-2"
    assert envoy_compiled.routed_outcome(envoy_compiled.tree_walk(tree)({**headers, "x-data-region": "US"}))[0] == "analyse-us|analyse-eu-1,analyse-eu-2"


def test_policy_diff_shows_the_added_rule_at_the_entry_allowed(walkthrough, swiss):
    topology, _ = walkthrough
    policies, _ = swiss
    result = policydiff.compare(topology, POLICIES, policies)
    moves = {(c["point"], category, tuple(c["values"]["region"]), c["before"].get("destination"), c["after"].get("destination"))
             for c in result["changes"] for category in c["values"]["category"]}
    assert ("entry", "personal", ("CH",), "ingest-us|ingest-eu-1,ingest-eu-2", "ingest-eu-1,ingest-eu-2") in moves
    assert all(c["values"]["region"] == ["CH"] for c in result["changes"])


def test_a_rule_reading_the_body_gets_no_table_denied(walkthrough, shipped, tmp_path):
    _, points = walkthrough
    policies = with_rule(tmp_path, MINORS)
    data, precomputed = envoy_opa.decided_data(points, policies)
    assert precomputed.outcomes == {} and "allowed answers depend on what no table holds" in precomputed.skipped
    assert all(document[precompute.QUICK_PATH_DOCUMENT]["table"] == {} for document in data.values())
    # Decided in full, its answers still name the compliant sets, and every point's Envoy has their clusters.
    shipped_data, _ = shipped
    assert any(shipped_data[point][precompute.QUICK_PATH_DOCUMENT]["set_clusters"] for point in shipped_data)
    for point, document in data.items():
        assert document[precompute.QUICK_PATH_DOCUMENT]["set_clusters"] == shipped_data[point][precompute.QUICK_PATH_DOCUMENT]["set_clusters"]


def test_the_shipped_rules_are_tabled_allowed(shipped):
    # input.record only through the platform's record package: whether it is an object, which the quick path checks.
    _, precomputed = shipped
    assert precomputed.outcomes and precomputed.skipped == ""


def test_the_guard_refuses_a_divergent_quick_path_denied(shipped):
    data, precomputed = shipped
    tables = {point: copy.deepcopy(document[precompute.QUICK_PATH_DOCUMENT]["table"]) for point, document in data.items()}
    tables["entry"]["gateway"]["ingest"]["personal"]["care"]["EU"] = {"destination": "ingest-us"}
    with pytest.raises(engines.EngineError, match=r"point entry: the quick path differs .* listener entry .* labels category=personal "
                                                  r"consent=care region=EU: the rule set answers allowed to ingest-eu-1,ingest-eu-2"):
        precompute.check_quick_path(precomputed, tables)


def test_the_guard_refuses_a_quick_path_answering_a_denial_denied(shipped):
    data, precomputed = shipped
    tables = {point: copy.deepcopy(document[precompute.QUICK_PATH_DOCUMENT]["table"]) for point, document in data.items()}
    # EU health data may not reach store-eu-1 (not certified): no entry, and none may be added.
    tables["sidecar-analyse-eu-1"]["analyse-eu-1"]["store"]["health"] = {precompute.ABSENT: {"EU": {"destination": "store-eu-1"}}}
    with pytest.raises(engines.EngineError, match="point sidecar-analyse-eu-1: .*category=health consent=absent region=EU: the rule set answers nothing ahead"):
        precompute.check_quick_path(precomputed, tables)


def test_the_guard_lets_the_tables_the_rule_set_gave_through_allowed(shipped):
    data, precomputed = shipped
    precompute.check_quick_path(precomputed, {point: document[precompute.QUICK_PATH_DOCUMENT]["table"] for point, document in data.items()})


def test_every_point_holds_its_tables_keys_beside_it_allowed(shipped):
    data, precomputed = shipped
    keys = {"headers": ["x-data-category", "x-data-consent", "x-data-region"], "absent": precompute.ABSENT}  # the shipped schema's order
    assert all(document[precompute.QUICK_PATH_DOCUMENT]["keys"] == keys for document in data.values())


def test_the_guard_refuses_tables_keyed_otherwise_than_the_adapter_says_denied(shipped, monkeypatch):
    # The quick path reads its keys from data (envoy.rego quick_answer): keys in another order
    # than the adapter's table_keys would look labellings up under the wrong labels.
    data, precomputed = shipped
    tables = {point: document[precompute.QUICK_PATH_DOCUMENT]["table"] for point, document in data.items()}
    monkeypatch.setattr(precompute.Precomputed, "table_keys",
                        lambda self: {"headers": ["x-data-region", "x-data-consent", "x-data-category"], "absent": precompute.ABSENT})
    with pytest.raises(engines.EngineError, match="the quick path would not answer as the rule set does"):
        precompute.check_quick_path(precomputed, tables)


def test_the_guard_refuses_divergent_compiled_routes_denied(walkthrough, monkeypatch):
    topology, points = walkthrough
    honest = envoy_compiled.listener_matcher

    def drops_a_destination(outcomes, hop_timeout, headers):  # routes EU personal records to the US twin
        moved = {values: (destination.replace("-eu", "-us"), revision) if (values[0], values[2]) == ("personal", "EU") else (destination, revision)
                 for values, (destination, revision) in outcomes.items()}
        return honest(moved, hop_timeout, headers)

    monkeypatch.setattr(envoy_compiled, "listener_matcher", drops_a_destination)
    with pytest.raises(engines.EngineError, match=r"the compiled route differs .* labels category=personal consent=\S+ region=EU"):
        engines.configure("envoy-compiled", points, {**topology.engine, "kind": "envoy-compiled"}, RuleSet.of(POLICIES))


def compiled_tree(configs, point, listener):
    routes = {l["name"]: l for l in configs[point.name].envoy["static_resources"]["listeners"]}
    return routes[listener.name]["filter_chains"][0]["filters"][0]["typed_config"]["route_config"]["virtual_hosts"][0]["matcher"]


@pytest.mark.parametrize("ahead", [True, False], ids=["answers-ahead-allowed", "without-answers-denied"])
def test_a_reloads_first_step_holds_no_answer_ahead_of_time(walkthrough, ahead):
    """reload.py's first step (ahead=False): empty tables named by an empty digest, and compiled
    routes that route no record themselves; its twin, a deploy's (or the second step's)
    configuration, holds both."""
    topology, points = walkthrough
    configs = engines.configure("envoy-compiled", points, {**topology.engine, "kind": "envoy-compiled"}, RuleSet.of(POLICIES), ahead=ahead)
    deciding = [config.data[precompute.QUICK_PATH_DOCUMENT] for config in configs.values() if config.opa is not None]
    sidecar = next(point for point in points if point.name == "sidecar-ingest-us")
    tree = compiled_tree(configs, sidecar, envoy_compiled.compiled_listeners(sidecar)[0])
    headers = {":method": "POST", ":path": "/process", "content-length": "2", "x-data-category": "personal",
               "x-data-consent": "care", "x-data-region": "US"}
    routed = envoy_compiled.routed_outcome(envoy_compiled.tree_walk(tree)(headers))
    if ahead:
        assert all(document["table"] and document["digest"] for document in deciding if document["table"])
        assert len({document["digest"] for document in deciding}) > 1  # each point's own table
        assert routed[0] == "analyse-us|analyse-eu-1,analyse-eu-2"
    else:
        assert all(document["table"] == {} and document["digest"] == "" for document in deciding)
        assert routed is None  # the decision route: OPA decides


@pytest.mark.parametrize("deployed", [None, {}], ids=["a-deploy-makes-every-set-s-cluster-allowed", "a-reload-keeps-the-deployed-clusters-denied"])
def test_the_compliant_sets_follow_the_clusters_a_point_has(walkthrough, deployed):
    """A deploy gives each point a cluster per compliant set its answers route to, and routes
    there; a reload cannot add clusters to a running Envoy, so a set without one (here, all: the
    deployment had none) goes to the first instance of its first tier, inside the set still."""
    topology, points = walkthrough
    configs = engines.configure("envoy-compiled", points, {**topology.engine, "kind": "envoy-compiled"}, RuleSet.of(POLICIES), set_clusters=deployed)
    sidecar = next(point for point in points if point.name == "sidecar-ingest-us")
    tree = compiled_tree(configs, sidecar, envoy_compiled.compiled_listeners(sidecar)[0])
    headers = {":method": "POST", ":path": "/process", "content-length": "2", "x-data-category": "personal",
               "x-data-consent": "care", "x-data-region": "US"}
    routed = envoy_compiled.routed_outcome(envoy_compiled.tree_walk(tree)(headers))[0]
    listed = configs[sidecar.name].data[precompute.QUICK_PATH_DOCUMENT]["set_clusters"]
    clusters = {c["name"] for c in configs[sidecar.name].envoy["static_resources"]["clusters"]}
    table = configs[sidecar.name].data[precompute.QUICK_PATH_DOCUMENT]["table"]["ingest-us"]["analyse"]["personal"]["care"]["US"]
    if deployed is None:
        assert routed == table["destination"] == "analyse-us|analyse-eu-1,analyse-eu-2" and "analyse-us|analyse-eu-1,analyse-eu-2" in listed
        assert set(listed) <= clusters
    else:
        assert routed == table["destination"] == "analyse-us" and listed == []
