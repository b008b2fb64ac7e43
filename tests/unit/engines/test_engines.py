"""Engines: the pieces of envoy-compiled that need no running process (the configure step over a whole
topology: tests/integration/engines/test_engines.py; the end-to-end and differential tests run the real ones)."""

import itertools
import json
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from complyroute.engines import envoy_compiled, precompute
from complyroute.policy import labels


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


def test_a_listener_with_nothing_decided_ahead_asks_opa_for_every_record_denied():
    # A rule set that reads the body has no allowed table: the tree has no leaves, and every
    # record takes the decision route (an empty matcher list would answer 404).
    matcher = envoy_compiled.listener_matcher({}, "1s", ["x-data-classification", "x-data-retention"])
    headers = {":method": "POST", ":path": "/process", "content-type": "application/json", "content-length": "2",
               "x-data-classification": "public"}
    assert envoy_compiled.tree_walk(matcher)(headers)["name"] == "decide"
    assert '"matchers": []' not in json.dumps(matcher)


def header(name, **match):
    return {"single_predicate": {"input": envoy_compiled.header_input(name), "value_match": match}}


# A matcher list of each predicate the guard evaluates; the first that holds names its action.
WALKED = {"matcher_list": {"matchers": [
    {"predicate": {"and_matcher": {"predicate": [header("x-a", exact="1"), {"not_matcher": header("x-b", **envoy_compiled.regex(".*"))}]}},
     "on_match": {"action": {"name": "a-without-b"}}},
    {"predicate": {"or_matcher": {"predicate": [header("x-a", exact="2"), header("x-b", **envoy_compiled.regex("b[0-9]"))]}},
     "on_match": {"matcher": {"matcher_tree": {"input": envoy_compiled.header_input("x-c"),
                                               "exact_match_map": {"map": {"c": {"action": {"name": "c"}}}}},
                              "on_no_match": {"action": {"name": "not-c"}}}}},
]}, "on_no_match": {"action": {"name": "none"}}}


@pytest.mark.parametrize("headers, taken", [
    ({"x-a": "1"}, "a-without-b"), ({"x-a": "1", "x-b": ""}, "none"), ({"x-a": "2", "x-c": "c"}, "c"),
    ({"x-b": "b7"}, "not-c"), ({"x-b": "b7x"}, "none"), ({}, "none"),
], ids=["and-not-allowed", "present-empty-header-denied", "or-then-exact-map-allowed", "or-regex-then-no-branch-allowed",
        "regex-matches-whole-value-denied", "absent-headers-match-nothing-denied"])
def test_the_guard_walks_a_tree_as_envoy_does(headers, taken):
    assert envoy_compiled.tree_walk(WALKED)(headers)["name"] == taken


def test_the_guard_refuses_a_construct_it_cannot_evaluate_wherever_it_is_denied():
    # Deep in a branch no request of a space may reach: refused before any request is walked.
    unknown = {"matcher_list": {"matchers": [{"predicate": header("x-a", exact="1"), "on_match": {"action": {"name": "a"}}},
                                             {"predicate": header("x-a", prefix="2"), "on_match": {"action": {"name": "b"}}}]}}
    with pytest.raises(envoy_compiled.EngineError, match="a string match it cannot evaluate"):
        envoy_compiled.tree_walk(unknown)
    with pytest.raises(envoy_compiled.EngineError, match="a predicate it cannot evaluate"):
        envoy_compiled.tree_walk({"matcher_list": {"matchers": [{"predicate": {"xor_matcher": {}}, "on_match": {"action": {}}}]}})


def test_the_answers_cache_keeps_what_was_used_last_and_evicts_the_least_recently_used(tmp_path, monkeypatch):
    monkeypatch.setattr(precompute, "CACHE", tmp_path / "cache")
    monkeypatch.setattr(precompute, "CACHE_ENTRIES", 2)
    asked = []

    def evaluate(query, space, policies, modules=(), yielding=False):  # OPA stands in: this checks the cache, not the answers
        asked.append(space["points"]["p"]["n"])
        return [["p", "l", [space["points"]["p"]["n"]], "d", "r"]]

    monkeypatch.setattr(precompute.policydata, "evaluate", evaluate)
    rules = tmp_path / "rules"
    rules.mkdir()

    def ask(n):
        time.sleep(0.02)  # apart by more than a tick of the file system's clock, which orders them
        space = {"labels": [], "labellings": [], "points": {"p": {"n": n, "listeners": {"l": {}}}}}
        return precompute.evaluate_split(precompute.ALLOWED, space, rules)

    assert ask(1) == [["p", "l", [1], "d", "r"]]
    ask(2)
    assert ask(1) == [["p", "l", [1], "d", "r"]] and asked == [1, 2]  # a hit asks nothing
    ask(3)  # over the cap: 2 goes, used before 1 was used again
    ask(1)
    assert asked == [1, 2, 3]
    ask(2)
    assert asked == [1, 2, 3, 2]  # evicted, so asked again
    assert sorted(path.name.split(".", 1)[1] for path in (tmp_path / "cache").iterdir()) == ["json.gz", "json.gz", "lock", "lock"]


def test_an_entry_another_process_evicted_while_this_one_evicts_is_no_error_allowed(tmp_path, monkeypatch):
    class Listing(type(tmp_path)):
        def glob(self, pattern):  # another process evicts an entry between the listing and the reading of its time
            yield from super().glob(pattern)
            yield self / "evicted-meanwhile.json.gz"

    monkeypatch.setattr(precompute, "CACHE", Listing(tmp_path / "cache"))
    monkeypatch.setattr(precompute, "CACHE_ENTRIES", 1)
    rules = tmp_path / "rules"
    rules.mkdir()
    assert precompute.cached("query", {"n": 1}, rules, lambda: [1]) == [1]
    time.sleep(0.02)  # apart by more than a tick of the file system's clock
    assert precompute.cached("query", {"n": 2}, rules, lambda: [2]) == [2]
    # Its denied twin: an entry still there past the bound is evicted as before.
    assert len(list((tmp_path / "cache").glob("*.json.gz"))) == 1


def test_processes_asking_for_the_same_answers_at_once_ask_opa_once_allowed(tmp_path, monkeypatch):
    monkeypatch.setattr(precompute, "CACHE", tmp_path / "cache")
    asked, started = [], threading.Event()

    def evaluate(query, space, policies, modules=(), yielding=False):  # OPA stands in, slow: the other asker arrives meanwhile
        asked.append(space["points"]["p"]["n"])
        started.set()
        time.sleep(0.3)
        return [["p", "l", [space["points"]["p"]["n"]], "d", "r"]]

    monkeypatch.setattr(precompute.policydata, "evaluate", evaluate)
    rules = tmp_path / "rules"
    rules.mkdir()

    def ask(n):
        return precompute.evaluate_split(precompute.ALLOWED, {"labels": [], "labellings": [], "points": {"p": {"n": n, "listeners": {"l": {}}}}}, rules)

    with ThreadPoolExecutor(max_workers=3) as pool:
        first = pool.submit(ask, 1)
        started.wait(5)
        second, other = pool.submit(ask, 1), pool.submit(ask, 2)
        assert first.result() == second.result() == [["p", "l", [1], "d", "r"]]
        assert other.result() == [["p", "l", [2], "d", "r"]]
    # Denied twin: other answers (2) are asked for, not waited for.
    assert sorted(asked) == [1, 2]
