"""envoy-compiled: OPA decides each point's hops ahead of time; Envoy routes the allowed ones itself.

At configuration time OPA evaluates the query Envoy would ask it at run time
(data.complyroute.envoy.response, see decision_space.rego) over each deciding listener's
finite decision space:

- every known region (x-data-region) and every known category (x-data-category);
- consent (x-data-consent) absent, or any canonical value: known purposes, sorted, each once,
  joined with ",". Values that differ only in purposes no instance of the point's catalog
  processes for are tried once, with the shortest of them standing for all;
- the listener's sender and step, which the listener pins.

Each labelling the rule set allows, without rewriting a label, becomes a leaf of an Envoy
matcher tree on the listener's route configuration: category, then region (exact maps), then
consent (one regular expression of the allowed values per destination), routing straight to
the chosen instance with ext_authz disabled. Everything else misses the tree and takes the
decision route, which asks OPA exactly as envoy-opa does: unknown, malformed, non-canonical,
repeated (Envoy's matcher input joins repeated headers with ",") or contradictory labels,
denials (so every refusal keeps its status, code and message), a record (POST /process) with
a content-length above MAX_RECORD_BYTES or none, and a record OPA already decided (the routing
header is present). A request that is not a record is refused by Envoy (404, 405, 400) as the
decision route's listener refuses it. Listeners whose records come from a client keep asking OPA for every record:
the body is checked there, and nothing before has canonicalised the labels.

The tree's leaves come from OPA's answers only; a differential test (tests/e2e/
test_engines_differential.py) checks that both engines answer every point of the space and
thousands of hostile labellings alike.
"""

from __future__ import annotations

import itertools
import json
import re
from collections import defaultdict
from pathlib import Path

from .. import enforcement, policydata
from ..enforcement import MAX_RECORD_BYTES, ROUTING_HEADER, EnforcementPoint
from . import EngineError, PointConfig, envoy_opa

DECISION_SPACE = Path(__file__).with_name("decision_space.rego")
QUERY = "data.complyroute_engines.decision_space.allowed"
# Consent is enumerated over every combination of known purposes: 2^n values.
MAX_PURPOSES = 10

HEADER_INPUT = "type.googleapis.com/envoy.type.matcher.v3.HttpRequestHeaderMatchInput"
ROUTE_ACTION = "type.googleapis.com/envoy.config.route.v3.Route"


# ---- the decision space ------------------------------------------------------------------


def canonical_consents(purposes: list[str]) -> list[str]:
    """Every canonical x-data-consent value: a non-empty set of purposes, sorted, joined with ","."""
    if len(purposes) > MAX_PURPOSES:
        raise EngineError(
            f"envoy-compiled enumerates every combination of consent purposes; the reference data has "
            f"{len(purposes)} (2^{len(purposes)} combinations, at most {MAX_PURPOSES} purposes): use engine.kind envoy-opa"
        )
    ordered = sorted(purposes)
    return [",".join(chosen) for size in range(1, len(ordered) + 1) for chosen in itertools.combinations(ordered, size)]


def consent_classes(purposes: list[str], processed: set[str]) -> dict[str | None, list[str | None]]:
    """Canonical consent values grouped by what they say about the `processed` purposes.

    Keyed by the value that stands for its group (the first: fewest purposes, then
    alphabetical); None is the absent header, a group of its own.
    """
    classes: dict[str | None, list[str | None]] = {None: [None]}
    by_seen: dict[frozenset, list[str]] = {}
    for value in canonical_consents(purposes):
        by_seen.setdefault(frozenset(value.split(",")) & processed, []).append(value)
    for values in by_seen.values():
        classes[values[0]] = values
    return classes


def processed_purposes(catalog: dict) -> set[str]:
    """Every purpose some instance of a point's catalog processes for (list or comma-separated)."""
    purposes = set()
    for instance in catalog.get("instances", {}).values():
        value = instance.get("purposes", [])
        items = value.split(",") if isinstance(value, str) else value
        purposes |= {item.strip() for item in items if item.strip()}
    return purposes


def reference(policies: Path) -> dict:
    return json.loads((policies / "complyroute" / "reference" / "data.json").read_text())


def evaluate(points: list[EnforcementPoint], policies: Path, data: dict[str, dict]) -> dict[tuple[str, str], dict[tuple[str, str], dict[str | None, tuple[str, str]]]]:
    """OPA's allowed outcomes: {(point, listener): {(category, region): {consent: (destination, revision)}}}.

    `data`: each point's OPA data document (envoy_opa.opa_data).
    """
    known = reference(policies)
    classes_by_point = {p.name: consent_classes(list(known["purposes"]), processed_purposes(p.catalog)) for p in points}
    space = {
        "regions": sorted(known["regions"]),
        "categories": sorted(known["categories"]),
        "points": {
            point.name: {
                "data": data[point.name],
                "listeners": {
                    listener.name: {"sender": listener.sender, "step": listener.step, "consents": list(classes_by_point[point.name])}
                    for listener in compiled_listeners(point)
                },
            }
            for point in points
            if compiled_listeners(point)
        },
    }
    outcomes: dict = defaultdict(lambda: defaultdict(dict))
    if not space["points"]:
        return outcomes
    try:
        allowed = policydata.evaluate(QUERY, space, policies, modules=(DECISION_SPACE,))
    except policydata.PolicyDataError as error:
        raise EngineError(f"envoy-compiled: OPA could not evaluate the decision space: {error}") from None
    if allowed is None:
        raise EngineError(f"envoy-compiled: {QUERY} is undefined over the decision space")
    for point, listener, region, category, consent, destination, revision in allowed:
        for value in classes_by_point[point][consent]:
            outcomes[(point, listener)][(category, region)][value] = (destination, revision)
    return outcomes


def compiled_listeners(point: EnforcementPoint):
    """The listeners whose allowed hops are compiled: all but those taking records from clients."""
    return [listener for listener in point.deciding if not listener.from_client]


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


def listener_matcher(outcomes: dict[tuple[str, str], dict[str | None, tuple[str, str]]], hop_timeout: str) -> dict:
    """The route matcher tree of one listener: OPA's allowed outcomes as leaves, OPA behind them.

    Category is an exact map. Under it, one predicate per destination and group of regions
    that allow the same consent values: region one of the group's, consent one of the values
    (or absent). The predicates of a category are disjoint (a labelling has one outcome), so
    their order does not matter, and there are few: regions fall into few groups.
    """
    ask_opa = action("decide", enforcement.decision_route(hop_timeout))
    consent_absent = {"not_matcher": header_is("x-data-consent", regex(".*"))}

    def leaf(outcome: tuple[str, str], regions: list[str], consents: frozenset) -> list[dict]:
        destination, revision = outcome
        decided = action(f"to-{destination}", enforcement.decided_route(destination, hop_timeout, revision))
        region = header_is("x-data-region", one_of(regions))
        values = sorted(c for c in consents if c is not None)
        matchers = []
        if None in consents:
            matchers.append({"predicate": {"and_matcher": {"predicate": [region, consent_absent]}}, "on_match": decided})
        if values:
            matchers.append({"predicate": {"and_matcher": {"predicate": [region, header_is("x-data-consent", one_of(values))]}}, "on_match": decided})
        return matchers

    # category -> (destination, revision) -> allowed consents -> regions
    groups: dict[str, dict[tuple[str, str], dict[frozenset, list[str]]]] = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for (category, region), by_consent in sorted(outcomes.items()):
        by_destination: dict[tuple[str, str], set] = defaultdict(set)
        for consent, outcome in by_consent.items():
            by_destination[outcome].add(consent)
        for outcome, consents in by_destination.items():
            groups[category][outcome][frozenset(consents)].append(region)
    by_category = {
        category: {
            "matcher_list": {"matchers": [
                matcher
                for outcome, by_consents in sorted(destinations.items())
                for consents, regions in sorted(by_consents.items(), key=lambda item: item[1])
                for matcher in leaf(outcome, regions, consents)
            ]},
            "on_no_match": ask_opa,
        }
        for category, destinations in groups.items()
    }
    labels = {
        "matcher_tree": {
            "input": header_input("x-data-category"),
            "exact_match_map": {"map": {category: {"matcher": tree} for category, tree in sorted(by_category.items())}},
        },
        "on_no_match": ask_opa,
    }
    def all_of(predicates: list[tuple[str, dict]]) -> dict:
        # The matcher's regular expressions name their engine (xds.type.matcher.v3.RegexMatcher).
        as_xds = lambda match: regex(match["safe_regex"]["regex"]) if "safe_regex" in match else match
        matched = [header_is(name, as_xds(match)) for name, match in predicates]
        return matched[0] if len(matched) == 1 else {"and_matcher": {"predicate": matched}}

    def refusal(name: str, status: int, predicates: list) -> dict:
        return action(name, enforcement.refusal_route(name, status, predicates, deciding=True))

    a_record = {
        "matcher_list": {"matchers": [
            # Only OPA's decision sets the routing header (any other value was stripped before).
            {"predicate": header_is(ROUTING_HEADER, regex(".*")), "on_match": ask_opa},
            {"predicate": header_is("content-length", regex(digits_at_most(MAX_RECORD_BYTES))), "on_match": {"matcher": labels}},
        ]},
        "on_no_match": ask_opa,
    }
    # The same requests as enforcement.refusal_routes refuse, in the same order.
    return {
        "matcher_list": {"matchers": [
            {"predicate": all_of(enforcement.A_RECORD), "on_match": {"matcher": a_record}},
            *[{"predicate": all_of(predicates), "on_match": refusal(name, status, predicates)} for name, predicates, status in enforcement.REQUEST_FORMS],
        ]},
        "on_no_match": refusal("not-a-record", 404, []),
    }


def configure(points: list[EnforcementPoint], settings: dict, policies: Path, trust: dict) -> dict[str, PointConfig]:
    data = envoy_opa.opa_data(points, policies)
    outcomes = evaluate(points, policies, data)
    hop_timeout = enforcement.hop_timeout_of(settings)
    configs = {}
    for point in points:
        matchers = {
            listener.name: listener_matcher(outcomes.get((point.name, listener.name), {}), hop_timeout)
            for listener in compiled_listeners(point)
        }
        configs[point.name] = envoy_opa.point_config(point, settings, data.get(point.name), matchers, trust.get(point.name))
    return configs
