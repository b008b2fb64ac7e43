"""The differential check: a point's precomputed answers against the full decision, beyond the
decision space.

OPA's partial evaluation decides which answers may be precomputed (independence.py), and the
guard checks the table over the space it enumerates (precompute.check_quick_path). This check
asks the compliance entrypoint in full, for a seeded sample of each point's tabled answers, with
what the space holds constant: records (the empty one, the rule set's example records and test
records, and records made of their fields with other values), clock times (now, a day on, a year
on, the year 2100) and request ids. An answer the full decision would route otherwise, for any of
them, refuses the table (EngineError), naming the point, the labels, the probe and the rule that
decided (its code and message). It is a net under the analysis, not the analysis: it samples.

Both engines hold the same answers (the table, and the compiled routes made of it), so one check
serves both. The seed is fixed: a rule set and a deployment get the same verdict every time.
"""

from __future__ import annotations

import json
import random
import subprocess
from datetime import datetime, timedelta, timezone
from functools import cache
from pathlib import Path

from complyroute.engines.contract import EngineError
from complyroute.policy import policydata
from complyroute.policy.policyfiles import EXAMPLES, OPA, RULE_SET, content_digest, is_test

MODULE = Path(__file__).with_name("differential.rego")
QUERY = "data.complyroute_engines.differential.differences"
SEED = 38
# Full decisions per check (sampled answers x probes): about a second of OPA's CPU here.
MAX_DECISIONS = 4000
MAX_MENTIONED = 6  # example and test records asked at every clock time
MIXES = 4  # seeded records of two fields each, asked today
# Values a probe gives a field the examples and tests mention, beside their own.
VALUES = (0, 1, 17, 18, 65, -1, 10 ** 9, "", "yes", "no", "x" * 64, True, False, None, [], {})


def clock_times(now: datetime | None = None) -> list[int]:
    """The clock times each probe record is asked at, in ns: today at 13:00 UTC, a day and an hour
    on, a year on, 2100. Whole hours of today, so that a day's checks of one rule set can be
    answered from the cache (precompute.cached)."""
    today = (now or datetime.now(timezone.utc)).replace(hour=13, minute=0, second=0, microsecond=0)
    times = [today, today + timedelta(days=1, hours=1), today + timedelta(days=400), datetime(2100, 1, 1, tzinfo=timezone.utc)]
    return [int(moment.timestamp() * 1e9) for moment in times]


def mentioned_records(policies: Path) -> list[dict]:
    """The records the rule set's examples hold, and the object literals its tests give a "record" key."""
    found = []
    for example in sorted((policies / EXAMPLES).glob("*.json")):
        try:
            record = json.loads(example.read_text()).get("record")
        except (json.JSONDecodeError, AttributeError):
            continue
        if isinstance(record, dict):
            found.append(record)
    tests = sorted(path for path in (policies / RULE_SET).rglob("*.rego") if is_test(path))
    return found + _test_records(content_digest({str(path): path.read_bytes() for path in tests}), tuple(tests))


@cache
def _test_records(_digest: str, tests: tuple[Path, ...]) -> list[dict]:
    records: list[dict] = []
    for test in tests:
        parsed = subprocess.run([str(OPA), "parse", "--format", "json", str(test)], capture_output=True, text=True)
        if parsed.returncode == 0:
            _collect_records(json.loads(parsed.stdout), records)
    return records


def _collect_records(node, records: list[dict]) -> None:
    """Appends every constant object that an object literal of the AST gives its "record" key."""
    if isinstance(node, list):
        for item in node:
            _collect_records(item, records)
    elif isinstance(node, dict):
        if node.get("type") == "object":
            for key, value in node.get("value", []):
                if key == {"type": "string", "value": "record"} and value.get("type") == "object":
                    constant = _constant(value)
                    if isinstance(constant, dict):
                        records.append(constant)
        for value in node.values():
            _collect_records(value, records)


def _constant(term: dict):
    """A term of OPA's JSON AST as a JSON value, or None when it is not a constant."""
    kind, value = term.get("type"), term.get("value")
    if kind in ("null", "boolean", "number", "string"):
        return value
    if kind == "array":
        items = [_constant(item) for item in value]
        return items if all(item is not None for item in items) else None
    if kind == "object":
        pairs = [(_constant(key), _constant(item)) for key, item in value]
        return {key: item for key, item in pairs} if all(isinstance(key, str) for key, _ in pairs) else None
    return None


def probes(policies: Path, now: datetime | None = None) -> list[dict]:
    """What each sampled answer is asked with: {"record", "now_ns", "request_id"}. Records: the
    empty one and those the rule set mentions, at every clock time; then, at today's, each of
    VALUES in every field they mention at once, and a few seeded mixes."""
    rng = random.Random(SEED)
    mentioned = mentioned_records(policies)
    fields = sorted({field for record in mentioned for field in record})
    timed = [{}, *mentioned[:MAX_MENTIONED]]
    today = [{field: value for field in fields} for value in VALUES] if fields else []
    today += [{field: rng.choice(VALUES) for field in rng.sample(fields, k=min(len(fields), 2))} for _ in range(MIXES)] if fields else []
    times = clock_times(now)
    asked = [(record, moment) for record in unique(timed) for moment in times]
    asked += [(record, times[0]) for record in unique(today) if record not in timed]
    return [{"record": record, "now_ns": moment, "request_id": f"differential-{number}"} for number, (record, moment) in enumerate(asked)]


def unique(records: list[dict]) -> list[dict]:
    return list({json.dumps(record, sort_keys=True): record for record in records}.values())


def sample(outcomes: dict, seed_text: str, limit: int) -> dict[str, list]:
    """By point, at most `limit` of its tabled answers in all, each point its share, seeded by `seed_text`."""
    by_point: dict[str, list] = {}
    for labelling in sorted(outcomes, key=lambda item: (item[0], item[1], [value or "" for value in item[2]])):
        by_point.setdefault(labelling[0], []).append(labelling)
    rng = random.Random(f"{SEED}:{seed_text}")
    share = max(1, limit // max(1, len(by_point)))
    return {point: rng.sample(labellings, k=min(share, len(labellings))) for point, labellings in by_point.items()}


def check(outcomes: dict, space: dict, data: dict[str, dict], policies: Path, cached=None, now: datetime | None = None) -> None:
    """Refuses (EngineError) when the full decision would route a sampled answer of `outcomes`
    (labelling -> (destination, revision)) otherwise for some probe. `data`: each point's OPA data
    document as it will hold it (with its table). `cached(query, document, policies, compute)`:
    precompute.cached, which keeps the answers by all they depend on (None: asked every time)."""
    if not outcomes:
        return
    asked = probes(policies, now)
    chosen = sample(outcomes, json.dumps(space["labels"]), MAX_DECISIONS // len(asked))
    points = {}
    for point, labellings in chosen.items():
        listeners = space["points"][point]["listeners"]
        points[point] = {"data": data[point], "checks": [
            {"listener": listener, "sender": listeners[listener]["sender"], "step": listeners[listener]["step"],
             "labelling": list(values), "destination": outcomes[(point, listener, values)][0]}
            for _, listener, values in labellings]}
    document = {"labels": space["labels"], "probes": asked, "points": points}

    def ask() -> list:
        try:
            return policydata.evaluate(QUERY, document, policies, modules=(MODULE,), yielding=True) or []
        except policydata.PolicyDataError as error:
            raise EngineError(f"OPA could not run the differential check: {error}") from None

    found = cached(QUERY, document, policies, ask) if cached else ask()
    if found:
        point, listener, values, index, decision = min(found, key=lambda item: (item[0], item[1], json.dumps(item[2]), item[3]))
        probe = asked[index]
        labels = " ".join(f"{name}={'absent' if value is None else value}" for (name, _), value in zip(space["labels"], values))
        decided = (f"{decision.get('code')}: {decision.get('message')}" if not decision.get("allowed")
                   else f"allowed to {json.dumps(decision.get('destinations'))}")
        raise EngineError(
            f"the precomputed answers differ from the rule set for what the decision space does not enumerate, so no table "
            f"was taken: point {point}, listener {listener}, labels {labels}, record {json.dumps(probe['record'])}, clock "
            f"{datetime.fromtimestamp(probe['now_ns'] / 1e9, timezone.utc).isoformat()}: the table routes it to "
            f"{outcomes[(point, listener, tuple(values))][0]}, the rule set decides {decided} ({len(found)} differences in all)")
