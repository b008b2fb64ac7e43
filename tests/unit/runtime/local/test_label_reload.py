"""A label added to a running local deployment (labelchange.py): the deciding points'
listeners in a file Envoy reads (LDS from the filesystem), the services' label setting in steps,
and the label changes a reload refuses. The parts' side runs for real in tests/e2e/test_reload_e2e.py."""

import dataclasses
import hashlib
import io
import json

import pytest

from complyroute.files import write_folder
from complyroute.engines import configuration
from complyroute.policy import labels
from complyroute.policy.policyfiles import POLICIES
from complyroute.policy.ruleset import RuleSet
from complyroute.proxy.envoy import LISTENER, LISTENERS_FILE, envoy_config
from complyroute.runtime.deployed import Deployed
from complyroute.runtime.local import labelchange, polling, rendering
from complyroute.topology import manifest
from complyroute.topology.plan import place

from tests.relabel import rule_set_with_label

SHIPPED = labels.schema(POLICIES)


@pytest.fixture(scope="module")
def with_sensitivity(tmp_path_factory):
    return labels.schema(rule_set_with_label(tmp_path_factory.mktemp("sensitivity")))


def plan():
    return place(manifest.load("topologies/examples/mixed-regions.yaml"))


def point(p, name):
    return next(x for x in p.points if x.name == name)


def split(point, envoy, points_folder):
    """A point's bootstrap, its listener files and their version, as a deploy writes them
    (configuration.split, in the point's folder under `points_folder`: rendering.layout)."""
    bootstrap, _, files, version = configuration.split(point, envoy, rendering.layout(points_folder), "r1")
    return bootstrap, files, version


def listener_file(sidecar, schema, folder):
    return split(sidecar, envoy_config(sidecar, {}, labels=schema), folder)


def test_a_deciding_point_s_listeners_go_to_a_file_its_bootstrap_names_allowed(tmp_path):
    sidecar = point(plan(), "sidecar-ingest-eu-1")
    config = envoy_config(sidecar, {}, labels=SHIPPED)
    bootstrap, files, version = split(sidecar, config, tmp_path)
    assert "listeners" not in bootstrap["static_resources"] and bootstrap["static_resources"]["clusters"] == config["static_resources"]["clusters"]
    lds = bootstrap["dynamic_resources"]["lds_config"]["path_config_source"]
    folder = tmp_path / sidecar.name / rendering.LISTENERS
    assert lds == {"path": f"{folder}/{LISTENERS_FILE}", "watched_directory": {"path": str(folder)}}
    response = json.loads(files[LISTENERS_FILE])
    assert response["version_info"] == version
    # Every listener, the readiness one too (ready only once the file was taken), as they were.
    assert [{k: v for k, v in r.items() if k != "@type"} for r in response["resources"]] == config["static_resources"]["listeners"]
    assert {r["@type"] for r in response["resources"]} == {LISTENER}
    assert "listeners" in config["static_resources"]  # the configuration given is left as it is


def test_a_point_that_decides_nothing_keeps_its_listeners_in_its_bootstrap_denied(tmp_path):
    store = point(plan(), "sidecar-store-eu-1")
    config = envoy_config(store, {}, labels=SHIPPED)
    assert split(store, config, tmp_path) == (config, {}, None)


def test_an_added_label_changes_the_deciding_listener_and_the_version_allowed(tmp_path, with_sensitivity):
    sidecar = point(plan(), "sidecar-ingest-eu-1")
    _, before, old = listener_file(sidecar, SHIPPED, tmp_path)
    bootstrap, after, new = listener_file(sidecar, with_sensitivity, tmp_path)
    assert new != old
    by_name = {side: {r["name"]: r for r in json.loads(files[LISTENERS_FILE])["resources"]} for side, files in (("before", before), ("after", after))}
    changed = sorted(name for name in by_name["after"] if by_name["after"][name] != by_name["before"][name])
    assert changed == ["egress"]  # the ingress (forwarding) and readiness listeners stay: Envoy leaves them be
    assert "x-data-sensitivity" in json.dumps(by_name["after"]["egress"]) and "x-data-sensitivity" not in json.dumps(by_name["before"]["egress"])
    # Its twin: the same labels again, the same file and version (a reload that changes no label rewrites nothing).
    assert listener_file(sidecar, with_sensitivity, tmp_path) == (bootstrap, after, new)
    assert bootstrap == listener_file(sidecar, SHIPPED, tmp_path)[0]  # the bootstrap does not depend on the labels


def deployed(tmp_path, schema=SHIPPED, lds=True) -> Deployed:
    p = plan()
    if lds:
        for x in p.points:
            if x.deciding:
                (tmp_path / "points" / x.name / rendering.LISTENERS).mkdir(parents=True)
                (tmp_path / "points" / x.name / rendering.LISTENERS / LISTENERS_FILE).write_text("{}")
    return Deployed(p, p.points, {}, "policies", "r1", schema, {})


def relabelled(**changes):
    """The shipped labels with one label's fields changed: {name: {field: value}} (None: removed)."""
    by_name = {label.name: label for label in SHIPPED}
    return tuple(dataclasses.replace(label, **changes.get(name, {})) for name, label in by_name.items() if name not in changes or changes[name] is not None)


def test_a_reload_may_add_labels_or_change_what_the_rules_know_of_one_allowed(tmp_path, with_sensitivity):
    rendered = deployed(tmp_path)
    labelchange.check(tmp_path, rendered, with_sensitivity)  # an added label
    labelchange.check(tmp_path, rendered, with_sensitivity[:-1] + (dataclasses.replace(with_sensitivity[-1], required=True),))
    labelchange.check(tmp_path, rendered, relabelled(region={"values": "adequacy"}, consent={"required": True}))
    labelchange.check(tmp_path, rendered, SHIPPED)


@pytest.mark.parametrize("schema, refusal", [
    (relabelled(consent=None), "removes consent"),
    (relabelled(region={"header": "x-subject-region"}), "changes the header of region"),
    (relabelled(consent=None, region={"header": "x-subject-region"}), "removes consent and changes the header of region"),
])
def test_a_reload_that_removes_a_label_or_moves_its_header_is_refused_denied(tmp_path, schema, refusal):
    with pytest.raises(labelchange.LabelChangeError, match=rf"{refusal}: a reload adds labels .* nothing was changed, deploy again"):
        labelchange.check(tmp_path, deployed(tmp_path), schema)


def test_a_label_change_for_a_deployment_started_with_static_listeners_is_refused_denied(tmp_path, with_sensitivity):
    with pytest.raises(labelchange.LabelChangeError, match=r"the Envoys of entry, sidecar-.* were started with their listeners in their bootstrap.*deploy again"):
        labelchange.check(tmp_path, deployed(tmp_path, lds=False), with_sensitivity)
    labelchange.check(tmp_path, deployed(tmp_path / "other", lds=False), SHIPPED)  # no change, no refusal


def test_a_new_label_is_first_given_to_the_services_as_optional_then_required(with_sensitivity):
    required = with_sensitivity[:-1] + (dataclasses.replace(with_sensitivity[-1], required=True),)
    on_the_way = json.loads(labelchange._setting(required, SHIPPED))
    assert {label["name"]: label["required"] for label in on_the_way} == {"category": True, "consent": False, "region": True, "sensitivity": False}
    assert labelchange._setting(required, required) == labels.service_setting(required)  # once the rules require it
    # An existing label newly required: optional on the way too; one required before stays so.
    assert json.loads(labelchange._setting(relabelled(consent={"required": True}), SHIPPED)) == json.loads(labels.service_setting(SHIPPED))


class FakeServices:
    """The services of a state as the control plane sees them: signalled, then asked /health."""

    def __init__(self, run_dir, monkeypatch, take=True):
        self.run_dir, self.take, self.signalled, self.setting = run_dir, take, [], None
        monkeypatch.setattr(labelchange.deployment, "signal_part", self.signal)
        monkeypatch.setattr(labelchange.supervision, "health_answer", self.health)
        monkeypatch.setattr(polling, "POLL_INTERVAL", 0.01)

    def signal(self, name, signal_name, state):
        self.signalled.append((name, signal_name))
        if self.take:
            self.setting = (self.run_dir / rendering.LABEL_SETTING).read_text()

    def health(self, url, tls=None):
        return {"labels": "sha256:" + hashlib.sha256(self.setting.encode()).hexdigest()} if self.setting else {}


def configured(p, schema, run_dir) -> configuration.Configuration:
    """What the generator gives the points of plan `p` under `schema` in `run_dir`, of their
    Envoys alone (what a label change reads: no rule set is asked)."""
    points = {}
    for x in p.points:
        bootstrap, routes, files, version = configuration.split(x, envoy_config(x, {}, labels=schema), rendering.layout(run_dir / "points"), "r1")
        points[x.name] = configuration.PointConfiguration(bootstrap, routes, files, version, None, None, (),
                                                          configuration.Versions(None, None, None))
    return configuration.Configuration(RuleSet("policies", POLICIES, "r1", schema), points)


def label_run(tmp_path):
    p = plan()
    rendering.write_label_setting(tmp_path, labels.service_setting(SHIPPED))
    for name, x in configured(p, SHIPPED, tmp_path).points.items():
        folder = tmp_path / "points" / name
        write_folder(folder / rendering.LISTENERS, x.listeners)
        (folder / "envoy.json").write_text(json.dumps(x.envoy))
    state = {"run_dir": str(tmp_path), "parts": [{"name": s.instance.id, "kind": "service", "health_url": s.health_url} for s in p.services]}
    return state, Deployed(p, p.points, {}, "policies", "r1", SHIPPED, {})


def visible_json(run_dir):
    """Every JSON file of the run as its readers name it: not the hidden folders of the versions a
    folder written whole keeps them in (files.write_folder)."""
    return {path: path.read_text() for path in run_dir.rglob("*.json")
            if not any(part.startswith(".") for part in path.relative_to(run_dir).parts)}


def configs_for(rendered, schema, run_dir):
    return configured(rendered.plan, schema, run_dir)


def test_apply_gives_the_services_the_labels_then_the_listeners_allowed(tmp_path, monkeypatch, with_sensitivity):
    state, rendered = label_run(tmp_path)
    services = FakeServices(tmp_path, monkeypatch)
    versions = {}
    monkeypatch.setattr(labelchange, "envoy_listeners_version", lambda point: versions.get(point.name))

    def listeners_taken(*args):
        # Envoy reads each rewritten file: it serves its version from then on.
        for x in rendered.plan.points:
            path = tmp_path / "points" / x.name / rendering.LISTENERS / LISTENERS_FILE
            if path.exists():
                versions[x.name] = json.loads(path.read_text())["version_info"]
        return real_wait(*args)
    real_wait = labelchange._wait
    monkeypatch.setattr(labelchange, "_wait", listeners_taken)
    out = io.StringIO()
    seconds = labelchange.apply(state, rendered, configs_for(rendered, with_sensitivity, tmp_path), out)
    assert set(seconds) == {"services", "listeners"}
    assert {signal for _, signal in services.signalled} == {"HUP"} and len(services.signalled) == len(state["parts"])
    assert [label["name"] for label in json.loads((tmp_path / rendering.LABEL_SETTING).read_text())] == ["category", "consent", "region", "sensitivity"]
    assert "x-data-sensitivity" in (tmp_path / "points" / "sidecar-ingest-eu-1" / rendering.LISTENERS / LISTENERS_FILE).read_text()
    assert f"labels sensitivity: taken by {len(state['parts'])} services" in out.getvalue()
    # Its twin: the labels deployed are the labels given, nothing is written or signalled.
    services.signalled.clear()
    assert labelchange.apply(state, dataclasses.replace(rendered, schema=with_sensitivity),
                             configs_for(rendered, with_sensitivity, tmp_path), out) == {}
    assert services.signalled == []


def test_apply_puts_back_what_it_wrote_when_a_part_does_not_take_it_denied(tmp_path, monkeypatch, with_sensitivity):
    state, rendered = label_run(tmp_path)
    before = visible_json(tmp_path)
    FakeServices(tmp_path, monkeypatch)
    monkeypatch.setattr(labelchange, "envoy_listeners_version", lambda point: None)  # no Envoy takes its new listeners
    with pytest.raises(labelchange.LabelChangeError, match=r"after 0 s these parts do not serve the new listeners \(their logs .*\): entry, sidecar-.*"
                                                            r"the labels the deployment had were written back"):
        labelchange.apply(state, rendered, configs_for(rendered, with_sensitivity, tmp_path), io.StringIO(), timeout=0.2)
    assert visible_json(tmp_path) == before


def test_envoy_listeners_version_is_the_lds_version_once_nothing_warms(monkeypatch):
    sidecar = point(plan(), "sidecar-ingest-eu-1")
    answers = iter([
        {"stats": [{"name": "listener_manager.lds.version_text", "value": "abc"}, {"name": "listener_manager.total_listeners_warming", "value": 0}]},
        {"stats": [{"name": "listener_manager.lds.version_text", "value": "abc"}, {"name": "listener_manager.total_listeners_warming", "value": 1}]},
        None,
    ])
    def admin(url, timeout):
        answer = next(answers)
        return (200, json.dumps(answer).encode()) if answer else (503, b"")
    monkeypatch.setattr(labelchange.localhttp, "request", admin)
    assert [labelchange.envoy_listeners_version(sidecar) for _ in range(3)] == ["abc", None, None]


def test_finish_has_the_services_require_a_new_required_label_once_the_rules_do_allowed(tmp_path, monkeypatch, with_sensitivity):
    state, rendered = label_run(tmp_path)
    services = FakeServices(tmp_path, monkeypatch)
    monkeypatch.setattr(labelchange, "envoy_listeners_version", lambda point: json.loads(
        (tmp_path / "points" / point.name / rendering.LISTENERS / LISTENERS_FILE).read_text())["version_info"])
    required = with_sensitivity[:-1] + (dataclasses.replace(with_sensitivity[-1], required=True),)
    labelchange.apply(state, rendered, configs_for(rendered, required, tmp_path), io.StringIO())
    setting = lambda: {label["name"]: label["required"] for label in json.loads((tmp_path / rendering.LABEL_SETTING).read_text())}
    assert setting()["sensitivity"] is False  # on the way: sent on and logged, not yet required
    out = io.StringIO()
    assert set(labelchange.finish(state, required, out)) == {"services_required"}
    assert setting() == {"category": True, "consent": False, "region": True, "sensitivity": True}
    assert "the services require the labels the schema requires (category, region, sensitivity)" in out.getvalue()
    # Its twin: the services hold that setting already (as after an optional label): nothing is written or signalled.
    services.signalled.clear()
    assert labelchange.finish(state, required, io.StringIO()) == {} and services.signalled == []


def test_a_reload_whose_bootstraps_are_those_running_passes_the_check_allowed(tmp_path, with_sensitivity):
    _, rendered = label_run(tmp_path)
    rendering.check_bootstraps(tmp_path, configured(rendered.plan, SHIPPED, tmp_path))
    rendering.check_bootstraps(tmp_path, configured(rendered.plan, with_sensitivity, tmp_path))  # labels go to listener files


def test_a_reload_that_would_change_a_bootstrap_is_refused_naming_the_point_denied(tmp_path):
    _, rendered = label_run(tmp_path)
    generated = configured(rendered.plan, SHIPPED, tmp_path)
    name = sorted(generated.points)[0]
    point = generated.points[name]
    clusters = point.envoy["static_resources"]["clusters"]
    changed = {**point.envoy, "static_resources": {**point.envoy["static_resources"], "clusters": [*clusters, {**clusters[0], "name": "another"}]}}
    generated = dataclasses.replace(generated, points={**generated.points, name: dataclasses.replace(point, envoy=changed)})
    with pytest.raises(rendering.BootstrapChanged, match=rf"changes the Envoy bootstrap of {name} beyond its route and listener files"):
        rendering.check_bootstraps(tmp_path, generated)
