"""Issue 38's first "Done when": a rule set whose rules read the record's body or the clock in forms
the shipped rules do not use is never bypassed. Both engines, in every enforcing topology, deliver
each record where `python -m complyroute decide` (make decide) says, and no point's allowed table
answers a labelling such a rule reads at.

One rule set holds every form, each a rule of its own gated on a region of its own, so that a
record trips exactly one rule: a body form reads a field of its own (object.filter, a
comprehension, walk, json.filter, object.get, input[key]), a clock form reads the clock through an indexed
call (time.clock(...)[1], time.date(...)[0]). A tripped rule excludes the EU instance of the
analyse step, so the record goes to analyse-us where its twin, which trips no rule, goes to
analyse-eu (the sender's region, the first tier): a table that answered the tripped labelling
without the body or the clock would have sent it to analyse-eu.

The clock conditions hold at every time this test can run (it asserts nothing about time), so a
table built at deploy would have agreed with them: what shows the clock was not frozen into a
table is that no table answers their labellings. (Today OPA's analysis tables none of this rule
set's labellings, the twins' included: docs/architecture.md, "Only what OPA finds independent".
The test asks only that the tripped ones are not, and the shipped rules' table, which holds
them, is its twin.)

Three services, the fewest with a choice to make at a hop a topology's own point decides (the
sidecar of ingest-eu, a router, the central entity): ingest-eu, then analyse-eu or analyse-us.
One deployment per topology × engine, every record sent once.
"""

import io
import json
import subprocess
import sys
import tarfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from complyroute.engines import envoy_opa, precompute
from complyroute.policy import labels as label_schema
from complyroute.policy.policyfiles import POLICIES
from complyroute.policy.ruleset import RuleSet
from complyroute.runtime.local import deployment, rendering
from complyroute.topology import manifest
from complyroute.topology.plan import GATEWAY_SENDER, catalog, place

from tests.rulesets import shipped_with

from .helpers import matrix, post

SERVICES = [
    {"id": "ingest-eu", "step": "ingest", "region": "EU", "purposes": ["care"]},
    {"id": "analyse-eu", "step": "analyse", "region": "EU", "purposes": ["care"]},
    {"id": "analyse-us", "step": "analyse", "region": "US", "purposes": ["care"]},
]
RULE = '''
# METADATA
# title: Hidden {name}
# description: A rule written with {name}, a form the shipped rules do not use.
# custom:
#   code: HIDDEN_{code}
#   message: hidden rule {name}
exclusions contains exclusion(rego.metadata.rule(), id, "{name}") if {{
	input.step == "analyse"
	label.region == "{region}"
	{condition}
	some id, candidate in candidates
	candidate.region == "EU"
}}
'''
# form -> (region, condition, the record that trips it): each a region of its own, none GDPR-protected
# (whose personal data could go to the US).
BODY = {
    "object.filter": ("JP", 'object.filter(input.record, {"hidden_filter"}).hidden_filter == true', {"hidden_filter": True}),
    "comprehension": ("KR", 'count([key | some key, value in input.record; key == "hidden_each"; value == true]) > 0',
                      {"hidden_each": True}),
    "walk": ("CA", 'walk(input.record, [["hidden_walk"], true])', {"hidden_walk": True}),
    "json.filter": ("NZ", 'json.filter(input.record, ["hidden_json"]) == {"hidden_json": true}', {"hidden_json": True}),
    "object.get": ("IL", 'object.get(input, ["record", "hidden_get"], false) == true', {"hidden_get": True}),
    # The record reached through a variable over input's keys, which OPA 1.14's partial evaluation
    # bound to the keys it knew only (tools/opa/go.mod).
    "input[key]": ("IN", 'some key\n\tinput[key].hidden_key == true', {"hidden_key": True}),
}
# form -> (region, condition): tripped by a personal record of the region, whatever its body.
CLOCK = {
    "time.clock": ("UK", 'label.category == "personal"\n\ttime.clock([time.now_ns(), "UTC"])[1] < 60'),
    "time.date": ("AU", 'label.category == "personal"\n\ttime.date([time.now_ns(), "UTC"])[0] >= 2026'),
}
ANONYMOUS = {"category": "anonymous"}
PERSONAL = {"category": "personal", "consent": "care"}
PLAIN = {"subject": "alice"}


def cases() -> list[tuple[str, dict, dict, str]]:
    """(name, labels, record, the instance of analyse the rules pick) for every form and its twin."""
    found = []
    for form, (region, _, tripping) in BODY.items():
        found += [(form, {"region": region, **ANONYMOUS}, {**PLAIN, **tripping}, "analyse-us"),
                  (f"{form}, twin", {"region": region, **ANONYMOUS}, PLAIN, "analyse-eu")]
    for form, (region, _) in CLOCK.items():
        found += [(form, {"region": region, **PERSONAL}, PLAIN, "analyse-us"),
                  (f"{form}, twin", {"region": region, **ANONYMOUS}, PLAIN, "analyse-eu")]
    return found


CASES = cases()


def topology_of(topology: str, engine: str) -> manifest.Topology:
    return manifest.load(topology, services=SERVICES, engine=engine)


@pytest.fixture(scope="module")
def hidden(tmp_path_factory) -> Path:
    rules = "".join(RULE.format(name=form, code=f"{number}", region=region, condition=condition)
                    for number, (form, (region, condition, *_)) in enumerate({**BODY, **CLOCK}.items()))
    return shipped_with(tmp_path_factory.mktemp("hidden"), rules)


def decide(policies: Path, catalog_file: Path, folder: Path, hop: dict) -> dict:
    """What `python -m complyroute decide` answers for one hop (make decide runs it)."""
    input_file = folder / f"{hop['request_id']}.json"
    input_file.write_text(json.dumps(hop))
    printed = subprocess.run([sys.executable, "-m", "complyroute", "decide", "--input", str(input_file), "--catalog", str(catalog_file),
                              "--policies", str(policies)], capture_output=True, text=True, check=True).stdout
    return json.loads(printed)


@pytest.fixture(scope="module")
def decided(hidden, tmp_path_factory) -> dict[str, list[dict]]:
    """Each case's decisions, hop by hop (the entry's into ingest, ingest-eu's into analyse), as
    make decide gives them over the services' whole catalog."""
    folder = tmp_path_factory.mktemp("decide")
    loaded = topology_of("sidecar", "envoy-opa")
    catalog_file = folder / "catalog.json"
    catalog_file.write_text(json.dumps({"complyroute": {"catalog": catalog(loaded, loaded.instances, gateway=True)}}))
    inputs = folder / "inputs"
    inputs.mkdir()
    hops = [(name, {"labels": labels, "record": record, "sender": sender, "step": step, "request_id": f"{index}-{step}"})
            for index, (name, labels, record, _) in enumerate(CASES)
            for sender, step in ((GATEWAY_SENDER, "ingest"), ("ingest-eu", "analyse"))]
    with ThreadPoolExecutor(max_workers=2) as pool:
        answers = list(pool.map(lambda hop: decide(hidden, catalog_file, inputs, hop[1]), hops))
    by_case: dict[str, list[dict]] = {}
    for (name, _), answer in zip(hops, answers):
        by_case.setdefault(name, []).append(answer)
    return by_case


def tables(state) -> dict[str, dict]:
    """Each point's allowed table, from the bundle it was served."""
    found = {}
    for bundle in Path(state["run_dir"], rendering.BUNDLES).glob("*.tar.gz"):
        with tarfile.open(bundle, mode="r:gz") as tar:
            data = json.load(tar.extractfile("/data.json"))
        found[bundle.name.removesuffix(".tar.gz")] = data.get("complyroute_quick_path", {}).get("table", {})
    return found


def tabled(table: dict, labels: dict, policies: Path) -> bool:
    """Whether a point's allowed table answers the labels at the hop from ingest-eu into analyse
    (precompute.Precomputed.tables: a level per label, in the schema's order)."""
    slot = table.get("ingest-eu", {}).get("analyse", {})
    for label in label_schema.schema(policies):
        slot = slot.get(labels.get(label.name, precompute.ABSENT), {})
    return "destination" in slot


TRIPPED = [(name, labels) for name, labels, _, instance in CASES if instance == "analyse-us"]


def test_make_decide_sends_a_tripped_record_to_the_us_instance_and_its_twin_to_the_eu_one_allowed(decided):
    # The rule set's own answers, before any deployment: what the deployments must match.
    for name, _, _, instance in CASES:
        entry, analyse = decided[name]
        assert entry["destinations"] == [["ingest-eu"]], (name, entry)
        assert analyse["destinations"][0] == [instance], (name, analyse)


def test_the_shipped_rules_table_the_tripped_labellings_allowed():
    # The twin of the deployments' table check: without the hidden rules, a point holds them.
    points = place(topology_of("sidecar", "envoy-opa")).points
    _, precomputed = envoy_opa.decided_data(points, POLICIES)
    held = precomputed.tables()["sidecar-ingest-eu"]
    assert [name for name, labels in TRIPPED if tabled(held, labels, POLICIES)] == [name for name, _ in TRIPPED]


@pytest.fixture(scope="module", params=matrix())
def delivered(request, hidden) -> tuple[tuple[str, str], dict, dict]:
    """((topology, engine), each case's answer, each point's allowed table): the hidden rule set
    deployed, every case's record sent once to its entry."""
    topology, engine = request.param
    if deployment.read_state():
        deployment.stop(out=io.StringIO())
    state = deployment.deploy(topology_of(topology, engine), RuleSet.of(hidden), out=io.StringIO())
    try:
        answers = {name: post(state, labels, record)[1] for name, labels, record, _ in CASES}
        yield request.param, answers, tables(state)
    finally:
        deployment.stop(out=io.StringIO())


def check_paths(delivered, decided, tripped: bool) -> None:
    """Each record of the tripped cases (or of their twins) reached, at every hop, an instance of
    the first tier make decide gives (the data plane balances inside it; every instance is up)."""
    deployed, answers, _ = delivered
    for name, _, _, instance in CASES:
        if (instance == "analyse-us") != tripped:
            continue
        answer = answers[name]
        assert answer.status == 200, (deployed, name, answer.text[:300])
        path = [hop["instance"] for hop in answer.body["path"]]
        first_tiers = [decision["destinations"][0] for decision in decided[name]]
        assert len(path) == len(first_tiers) and all(hop in tier for hop, tier in zip(path, first_tiers)), (deployed, name, path, first_tiers)


def test_a_record_a_hidden_rule_trips_goes_where_make_decide_says_denied(delivered, decided, hidden):
    check_paths(delivered, decided, tripped=True)
    # No point's table answers a tripped labelling: OPA decides it in full, with the body and the clock.
    deployed, _, point_tables = delivered
    for point, table in point_tables.items():
        assert not [name for name, labels in TRIPPED if tabled(table, labels, hidden)], (deployed, point)


def test_its_twin_that_trips_none_goes_where_make_decide_says_allowed(delivered, decided):
    check_paths(delivered, decided, tripped=False)
