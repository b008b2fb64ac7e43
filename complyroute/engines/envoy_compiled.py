"""envoy-compiled: OPA decides each point's hops ahead of time; Envoy routes the allowed ones itself.

The rule set's allowed answers over each deciding listener's decision space (precompute.py:
the known values of every label of the rule set's label schema, the listener's sender and
step) become, for every listener whose records come from a service, a leaf of an Envoy matcher
tree on its route configuration: an exact map on the first label every allowed labelling
carries (the shipped rule set's category), then one predicate per destination and box of
labellings (each remaining label one of a set of values, or absent), routing straight to the
chosen instance with ext_authz disabled. Everything else misses the tree and takes the decision route,
which asks OPA exactly as envoy-opa does (its OPA holds the same allowed table for its quick
path): unknown, malformed, non-canonical, repeated (Envoy's matcher input joins repeated headers
with ",") or contradictory labels, denials (so every refusal keeps its status, code and
message), a record (POST /process) with a content-length above MAX_RECORD_BYTES or none, a
record OPA already decided (the routing header is present), and every record of a rule set that
reads what the space does not enumerate (it has no allowed table). A request that is not a
record is refused by Envoy (404, 405, 400) as the decision route's listener refuses it.
Listeners whose records come from a client keep asking OPA for every record: the body is
checked there, and nothing before has canonicalised the labels.

The tree's leaves come from OPA's answers only. Before a point takes its routes, check_routes
walks each listener's tree over the whole space as Envoy would and refuses (EngineError, naming
the point and the first labelling) unless it routes exactly the allowed labellings, each to the
rule set's destination; a differential test (tests/e2e/test_engines_differential.py) checks
that both engines answer every point of the space and thousands of hostile labellings alike.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable

from complyroute.engines import envoy_opa, precompute
from complyroute.engines.contract import EngineError, PointConfig
from complyroute.policy.ruleset import RuleSet
from complyroute.proxy.contract import MAX_RECORD_BYTES, RECORD_PATH, REVISION_HEADER, ROUTING_HEADER, hop_timeout_of
from complyroute.proxy.routes import A_RECORD, REQUEST_FORMS, decided_route, decision_route, refusal_route
from complyroute.topology.plan import EnforcementPoint

HEADER_INPUT = "type.googleapis.com/envoy.type.matcher.v3.HttpRequestHeaderMatchInput"
ROUTE_ACTION = "type.googleapis.com/envoy.config.route.v3.Route"


def compiled_listeners(point: EnforcementPoint):
    """The listeners whose allowed hops are compiled: all that pin their step but those taking
    records from clients."""
    return [listener for listener in point.deciding if listener.step and not listener.from_client]


Outcomes = dict[tuple[str | None, ...], tuple[str, str]]  # labels' values -> (destination, revision)


def outcomes_by_listener(precomputed: precompute.Precomputed) -> dict[tuple[str, str], Outcomes]:
    """The allowed answers as {(point, listener): {labels' values: (destination, revision)}}."""
    outcomes: dict = defaultdict(dict)
    for (point, listener, values), outcome in precomputed.outcomes.items():
        outcomes[(point, listener)][values] = outcome
    return outcomes


# ---- Envoy's matcher tree ----------------------------------------------------------------


def header_input(name: str) -> dict:
    return {"name": name, "typed_config": {"@type": HEADER_INPUT, "header_name": name}}


def header_is(name: str, string_match: dict) -> dict:
    return {"single_predicate": {"input": header_input(name), "value_match": string_match}}


def regex(expression: str) -> dict:
    return {"safe_regex": {"google_re2": {}, "regex": expression}}


def one_of(values: list[str]) -> dict:
    """Matches exactly one of the values (the whole header value)."""
    return regex("|".join(re.escape(value) for value in sorted(values)))


def digits_at_most(limit: int) -> str:
    """A regular expression for the decimal numbers 0..limit (leading zeros allowed up to its width)."""
    bound = str(limit)
    shorter = [f"[0-9]{{1,{len(bound) - 1}}}"] if len(bound) > 1 else []
    same_width = [
        f"{bound[:i]}[0-{int(bound[i]) - 1}][0-9]{{{len(bound) - i - 1}}}" for i in range(len(bound)) if bound[i] != "0"
    ]
    return "|".join(shorter + same_width + [bound])


def action(name: str, route: dict) -> dict:
    return {"action": {"name": name, "typed_config": {"@type": ROUTE_ACTION, **route}}}


def listener_matcher(outcomes: Outcomes, hop_timeout: str, headers: list[str]) -> dict:
    """The route matcher tree of one listener: OPA's allowed outcomes as leaves, OPA behind them.
    `headers`: the label headers, in the order of the outcomes' values.

    The first label every allowed labelling carries is an exact map. Under it, one predicate per
    destination and box of labellings (boxes): each other label one of the box's values, or
    absent. The predicates under a key are disjoint (a labelling has one outcome), so their order
    does not matter, and there are few: labellings fall into few boxes.
    """
    ask_opa = action("decide", decision_route(hop_timeout))

    def label_is(header: str, values: frozenset) -> dict:
        if values == {None}:
            return {"not_matcher": header_is(header, regex(".*"))}
        return header_is(header, one_of(sorted(values)))

    def leaves(by_outcome: dict[tuple[str, str], list[tuple]], label_headers: list[str]) -> dict:
        matchers = []
        for (destination, revision), labellings in sorted(by_outcome.items()):
            decided = action(f"to-{destination}", decided_route(destination, hop_timeout, revision))
            for box in precompute.boxes(labellings, split_absent=True):
                predicates = [label_is(header, values) for header, values in zip(label_headers, box)]
                predicate = predicates[0] if len(predicates) == 1 else {"and_matcher": {"predicate": predicates}}
                matchers.append({"predicate": predicate, "on_match": decided})
        return {"matcher_list": {"matchers": matchers}, "on_no_match": ask_opa}

    keyed = next((index for index in range(len(headers)) if all(values[index] is not None for values in outcomes)), None)
    if not outcomes:  # nothing decided ahead of time (Envoy refuses an empty matcher list): every record asks OPA
        labels = None
    elif keyed is None or len(headers) == 1:
        by_outcome: dict = defaultdict(list)
        for values, outcome in outcomes.items():
            by_outcome[outcome].append(values)
        labels = leaves(by_outcome, headers)
    else:
        rest = headers[:keyed] + headers[keyed + 1:]
        by_key: dict = defaultdict(lambda: defaultdict(list))
        for values, outcome in outcomes.items():
            by_key[values[keyed]][outcome].append(values[:keyed] + values[keyed + 1:])
        labels = {
            "matcher_tree": {
                "input": header_input(headers[keyed]),
                "exact_match_map": {"map": {key: {"matcher": leaves(by_outcome, rest)} for key, by_outcome in sorted(by_key.items())}},
            },
            "on_no_match": ask_opa,
        }
    def all_of(predicates: list[tuple[str, dict]]) -> dict:
        # The matcher's regular expressions name their engine (xds.type.matcher.v3.RegexMatcher).
        as_xds = lambda match: regex(match["safe_regex"]["regex"]) if "safe_regex" in match else match
        matched = [header_is(name, as_xds(match)) for name, match in predicates]
        return matched[0] if len(matched) == 1 else {"and_matcher": {"predicate": matched}}

    def refusal(name: str, status: int, predicates: list) -> dict:
        return action(name, refusal_route(name, status, predicates, deciding=True))

    a_record = {
        "matcher_list": {"matchers": [
            # Only OPA's decision sets the routing header (any other value was stripped before).
            {"predicate": header_is(ROUTING_HEADER, regex(".*")), "on_match": ask_opa},
            {"predicate": header_is("content-length", regex(digits_at_most(MAX_RECORD_BYTES))),
             "on_match": {"matcher": labels} if labels is not None else ask_opa},
        ]},
        "on_no_match": ask_opa,
    }
    # The same requests as routes.refusal_routes refuse, in the same order.
    return {
        "matcher_list": {"matchers": [
            {"predicate": all_of(A_RECORD), "on_match": {"matcher": a_record}},
            *[{"predicate": all_of(predicates), "on_match": refusal(name, status, predicates)} for name, predicates, status in REQUEST_FORMS],
        ]},
        "on_no_match": refusal("not-a-record", 404, []),
    }


# ---- the guard: the tree as Envoy walks it -----------------------------------------------------


# The walk is compiled once per listener into nested functions, each construct's fields read
# once: check_routes asks a 50-service central entity's trees 150,000 times, and reading the
# trees' dictionaries on every step took 3 of a warm reload's 5 s there.

Walk = Callable[[dict[str, str]], "dict | None"]  # a request's headers -> the action taken, None: none


def _header_holds(header: str, match: dict) -> Callable[[dict[str, str]], bool]:
    """Whether the request's header `header` is present and its value satisfies `match`."""
    if "exact" in match:
        expected = match["exact"]
        return lambda headers: headers.get(header) == expected  # absent (None) is no string
    if "safe_regex" in match:
        expression = re.compile(match["safe_regex"]["regex"])
        results: dict[str | None, bool] = {None: False}  # an absent header matches no value

        def matches(headers: dict[str, str]) -> bool:
            value = headers.get(header)
            held = results.get(value)
            if held is None:  # the walk over a space asks the same few values again and again
                held = results[value] = expression.fullmatch(value) is not None
            return held
        return matches
    raise EngineError(f"check_routes: a string match it cannot evaluate: {match}")


def _predicate(predicate: dict) -> Callable[[dict[str, str]], bool]:
    if "single_predicate" in predicate:
        single = predicate["single_predicate"]
        return _header_holds(single["input"]["typed_config"]["header_name"], single["value_match"])
    if "and_matcher" in predicate:
        parts = [_predicate(p) for p in predicate["and_matcher"]["predicate"]]

        def every_holds(headers: dict[str, str]) -> bool:
            for part in parts:
                if not part(headers):
                    return False
            return True
        return every_holds
    if "or_matcher" in predicate:
        parts = [_predicate(p) for p in predicate["or_matcher"]["predicate"]]
        return lambda headers: any(part(headers) for part in parts)
    if "not_matcher" in predicate:
        inner = _predicate(predicate["not_matcher"])
        return lambda headers: not inner(headers)
    raise EngineError(f"check_routes: a predicate it cannot evaluate: {sorted(predicate)}")


def _on_match(on_match: dict | None) -> Walk:
    if on_match is None:
        return lambda headers: None
    if "action" in on_match:
        taken = on_match["action"]
        return lambda headers: taken
    return tree_walk(on_match["matcher"])


def tree_walk(matcher: dict) -> Walk:
    """Envoy's matcher tree `matcher` as a function: a request's headers -> the action Envoy
    takes (the constructs listener_matcher writes: matcher lists, exact maps, header
    predicates). Refuses (EngineError) a construct it cannot evaluate, wherever it is."""
    on_no_match = _on_match(matcher.get("on_no_match"))
    if "matcher_list" in matcher:
        candidates = [(_predicate(candidate["predicate"]), _on_match(candidate["on_match"]))
                      for candidate in matcher["matcher_list"]["matchers"]]

        def first_match(headers: dict[str, str]) -> dict | None:
            for holds, then in candidates:
                if holds(headers):
                    action = then(headers)
                    if action is not None:
                        return action
            return on_no_match(headers)
        return first_match
    if "matcher_tree" in matcher:
        tree = matcher["matcher_tree"]
        header = tree["input"]["typed_config"]["header_name"]
        branches = {value: _on_match(branch) for value, branch in tree["exact_match_map"]["map"].items()}

        def exact_map(headers: dict[str, str]) -> dict | None:
            branch = branches.get(headers.get(header))  # an absent header takes no branch
            action = branch(headers) if branch is not None else None
            return action if action is not None else on_no_match(headers)
        return exact_map
    return on_no_match


def routed_outcome(action: dict) -> tuple[str, str] | None:
    """(destination, revision) of a route that decided ahead of time; None where OPA decides."""
    route = action["typed_config"]
    if "cluster" not in route.get("route", {}):
        return None
    revision = next(h["header"]["value"] for h in route.get("request_headers_to_add", []) if h["header"]["key"] == REVISION_HEADER)
    return (route["route"]["cluster"], revision)


def check_routes(point: EnforcementPoint, matchers: dict[str, dict], precomputed: precompute.Precomputed) -> None:
    """Refuses (EngineError) unless every compiled listener's tree, walked as Envoy walks it over
    the listener's decision space, routes exactly the labellings the rule set allows, each to the
    rule set's destination and revision."""
    space = precomputed.guard_space
    if point.name not in space["points"]:
        return
    compiled = {listener.name for listener in compiled_listeners(point)}
    only_compiled = {**space, "points": {point.name: {**space["points"][point.name], "listeners": {
        name: pinned for name, pinned in space["points"][point.name]["listeners"].items() if name in compiled}}}}
    walks = {name: tree_walk(matchers[name]) for name in only_compiled["points"][point.name]["listeners"]}
    expected, routed = {}, {}
    for labelling in precompute.labellings(only_compiled):
        _, listener, values = labelling
        headers = {":method": "POST", ":path": RECORD_PATH, "content-type": "application/json", "content-length": "2",
                   **{header: value for (_, header), value in zip(space["labels"], values) if value is not None}}
        action = walks[listener](headers)
        if action is None:
            raise EngineError(f"point {point.name}: listener {listener}'s routes answer nothing for {labelling}")
        if (outcome := routed_outcome(action)) is not None:
            routed[labelling] = outcome
        if labelling in precomputed.outcomes:
            expected[labelling] = precomputed.outcomes[labelling]
    if routed != expected:
        raise EngineError("the compiled routes would not answer as the rule set does, so nothing was changed: "
                          + precompute.first_difference(point.name, expected, routed, only_compiled, "the compiled route"))


def configure(points: list[EnforcementPoint], settings: dict, rule_set: RuleSet, trust: dict, ahead: bool = True,
              set_clusters: dict[str, tuple[str, ...]] | None = None) -> dict[str, PointConfig]:
    data, precomputed = envoy_opa.decided_data(points, rule_set.folder, ahead, set_clusters, rule_set.revision)
    outcomes = outcomes_by_listener(precomputed)
    hop_timeout = hop_timeout_of(settings)
    headers = [label.header for label in rule_set.schema]
    configs = {}
    for point in points:
        matchers = {
            listener.name: listener_matcher(outcomes.get((point.name, listener.name), {}), hop_timeout, headers)
            for listener in compiled_listeners(point)
        }
        check_routes(point, matchers, precomputed)
        configs[point.name] = envoy_opa.point_config(point, settings, data.get(point.name), rule_set.schema, matchers, trust.get(point.name))
    return configs
