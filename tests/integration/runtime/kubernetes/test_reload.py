"""`reload --target k8s` against a fake API server (kubectl answered from memory): only the
bundle and route ConfigMaps change, as the deploy's ApplySet members; what cannot be applied
is refused before anything is."""

import io
import json
import pickle
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from complyroute.policy import bundles
from complyroute.policy.policyfiles import POLICIES
from complyroute.policy.ruleset import RuleSet
from complyroute.runtime.kubernetes import apply, render
from complyroute.runtime.deployed import Deployed
from complyroute.runtime.target import ReloadError
from complyroute.topology import manifest

from tests.relabel import rule_set_with_label

SHIPPED = RuleSet.of("policies")
from tests.integration.runtime.kubernetes.manifests import bundle_files, bundle_members, by_kind, objects_of


class FakeApiServer:
    """kubectl as reload_policy calls it, answered from memory (a unit test's stand-in; the real
    API server is tests/k8s/test_k8s_e2e.py's): the namespace and ConfigMaps of a rendered
    topology, a resourceVersion bumped on every change an apply makes."""

    def __init__(self, objects):
        self.objects = {(o["kind"], o["metadata"]["name"]): {**o, "metadata": {**o["metadata"], "resourceVersion": "1"}} for o in objects}
        self.applied: list[list[dict]] = []
        self.version = 1

    def __call__(self, *args):
        answer = lambda stdout, code=0: subprocess.CompletedProcess(args, code, stdout, "" if code == 0 else "not found")
        if args[:2] == ("get", "namespace"):
            found = self.objects.get(("Namespace", args[2]))
            return answer(json.dumps(found), 0) if found else answer("", 1)
        if args[2:4] == ("get", "configmap"):
            names = args[4:args.index("-o")]
            return answer(json.dumps({"items": [self.objects[("ConfigMap", n)] for n in names if ("ConfigMap", n) in self.objects]}))
        if args[:2] == ("apply", "--server-side"):
            documents = objects_of(Path(args[3]).read_text())
            self.applied.append(documents)
            for document in documents:
                key = (document["kind"], document["metadata"]["name"])
                stored = self.objects.get(key)
                content = lambda o: {k: v for k, v in o.items() if k != "metadata"} | {"annotations": o["metadata"].get("annotations")}
                if stored is None or content(stored) != content(document):
                    self.version += 1
                    self.objects[key] = {**document, "metadata": {**document["metadata"], "resourceVersion": str(self.version)}}
            return answer("\n".join(f"configmap/{d['metadata']['name']} serverside-applied" for d in documents))
        raise AssertionError(f"reload_policy asked kubectl {args}")


@pytest.fixture(scope="module")
def central_entity_renders() -> dict[tuple, tuple[render.Renderer, str]]:
    """The compiled central entity's renders of this module, by (budget, services, security): the
    Renderer and its built YAML. Most tests deploy the same one (5 services, the default budget and
    security), and a render costs half a second of CPU here (OPA checks every point's quick path,
    kustomize builds): each is rendered once. Nothing a test does changes a Renderer; what it may
    change, the objects, it parses anew."""
    return {}


@pytest.fixture
def deployed_central_entity(tmp_path_factory, monkeypatch, central_entity_renders):
    """The compiled central entity (5 services unless told) as `deploy --target k8s` applies and records
    it, against a fake API server; its ConfigMaps' budget as given to the factory at deploy time."""

    def deploy(budget=None, services=5, security=None):
        key = (budget, services, json.dumps(security, sort_keys=True))
        if key not in central_entity_renders:
            with monkeypatch.context() as during:
                if budget:
                    during.setattr(render, "CONFIGMAP_BUDGET", budget)
                overrides = {"security": security} if security else None
                renderer = render.Renderer(manifest.load("central-entity", services=services, engine="envoy-compiled", overrides=overrides),
                                           RuleSet.of("policies"))
                renderer.render()
                central_entity_renders[key] = renderer, render.build(renderer, tmp_path_factory.mktemp("central-entity") / "kustomization")
        renderer, built = central_entity_renders[key]
        objects = objects_of(built)
        apply.write_record(apply.deployed_of(renderer), renderer.signing_key)
        api = FakeApiServer(objects)
        monkeypatch.setattr(apply, "kubectl_output", api)
        return renderer, objects, api
    return deploy


def test_reload_with_the_deployed_rule_set_applies_the_same_configmaps_and_changes_nothing_denied(deployed_central_entity):
    renderer, objects, api = deployed_central_entity()
    result = apply.reload_policy(renderer.topology, SHIPPED, out=io.StringIO())
    assert result["applied"] == ["bundles-1", "routes-central-entity-1"] and result["changed"] == []
    assert result["revision"] == renderer.revision == bundles.revision()
    [applied] = api.applied
    rendered_configmaps = by_kind(objects, "ConfigMap")
    assert all(o == rendered_configmaps[o["metadata"]["name"]] for o in applied)  # byte for byte what the deploy applied


def test_reload_without_a_rule_set_applies_the_one_deployed_allowed(tmp_path, monkeypatch):
    """A deploy with a rule set of its own records it (Deployed.rule_set); a reload told none
    applies that one again, as a local reload does, not policies/."""
    renderer = render.Renderer(manifest.load("central-entity", services=3, engine="envoy-compiled"), RuleSet.of("classification"))
    renderer.render()
    objects = objects_of(render.build(renderer, tmp_path / "kustomization"))
    apply.write_record(apply.deployed_of(renderer), renderer.signing_key)
    monkeypatch.setattr(apply, "kubectl_output", FakeApiServer(objects))
    assert apply.deployed_rule_set(renderer.topology) == "classification"
    result = apply.reload_policy(renderer.topology, RuleSet.of(apply.deployed_rule_set(renderer.topology)), out=io.StringIO())
    assert result["revision"] == renderer.revision == RuleSet.of("classification").revision != bundles.revision()
    assert result["changed"] == []


def test_reload_with_another_rule_set_applies_only_the_bundle_and_route_configmaps_allowed(deployed_central_entity, us_adequate):
    renderer, objects, api = deployed_central_entity()
    out = io.StringIO()
    result = apply.reload_policy(renderer.topology, RuleSet.of(us_adequate), out=out)
    revision = bundles.revision(us_adequate)
    assert result == {"revision": revision, "namespace": "complyroute-central-entity",
                      "applied": ["bundles-1", "routes-central-entity-1"], "changed": ["bundles-1", "routes-central-entity-1"]}
    [applied] = api.applied
    assert {o["kind"] for o in applied} == {"ConfigMap"}  # no Deployment, so no pod template changes
    assert all(o["metadata"]["annotations"] == {render.REVISION_ANNOTATION: revision} for o in applied)
    bundle = bundle_members(bundle_files(applied)["central-entity.tar.gz"])
    assert json.loads(bundle["data.json"])["complyroute"]["reference"]["adequacy"][-1] == "US"
    assert json.loads(bundle["data.json"])["complyroute"]["revision"] == revision
    assert f"revision {revision} applied to namespace complyroute-central-entity" in out.getvalue()
    assert "does not wait" in out.getvalue() and "names the revision that decided it" in out.getvalue()
    # The record names the revision now applied; a second reload of it changes nothing.
    assert pickle.loads(apply.record_path("complyroute-central-entity").read_bytes()).revision == revision
    assert apply.reload_policy(renderer.topology, RuleSet.of(us_adequate), out=io.StringIO())["changed"] == []


def test_reload_of_a_rule_set_that_does_not_compile_applies_nothing_denied(deployed_central_entity, tmp_path):
    renderer, _, api = deployed_central_entity()
    broken = tmp_path / "broken"
    shutil.copytree(POLICIES, broken)
    (broken / "complyroute" / "compliance" / "compliance.rego").write_text("package complyroute.compliance\n\nallow if {\n")
    with pytest.raises(ReloadError, match="cannot be applied; nothing was applied"):
        apply.reload_policy(renderer.topology, RuleSet.of(broken), out=io.StringIO())
    assert api.applied == []


def test_reload_refuses_a_namespace_it_has_no_record_of_or_one_deployed_again_since_denied(deployed_central_entity):
    renderer, _, api = deployed_central_entity()
    with pytest.raises(ReloadError, match="was not deployed to Kubernetes from here"):
        apply.reload_policy(manifest.load("sidecar"), SHIPPED, out=io.StringIO())
    api.objects[("Namespace", "complyroute-central-entity")]["metadata"]["annotations"][render.RENDER_ANNOTATION] = "another"
    with pytest.raises(ReloadError, match="runs render another, not"):
        apply.reload_policy(renderer.topology, SHIPPED, out=io.StringIO())
    del api.objects[("Namespace", "complyroute-central-entity")]
    with pytest.raises(ReloadError, match="not in the current kubectl context"):
        apply.reload_policy(renderer.topology, SHIPPED, out=io.StringIO())
    assert api.applied == []


def test_reload_of_a_rule_set_with_another_label_applies_nothing_and_says_deploy_again_denied(deployed_central_entity, tmp_path):
    renderer, _, api = deployed_central_entity()
    with pytest.raises(ReloadError, match=r"changes the labels complyroute-central-entity was deployed with \(category, consent, region, "
                                          r"sensitivity; deployed: category, consent, region\): .*nothing was applied: deploy again"):
        apply.reload_policy(renderer.topology, RuleSet.of(rule_set_with_label(tmp_path)), out=io.StringIO())
    assert api.applied == []


@pytest.mark.parametrize("written", [b"not a pickle", pickle.dumps({"topology": "an older record"}),
                                     pickle.dumps(object.__new__(Deployed))])  # no fields: a record from before a field
def test_reload_refuses_a_record_another_version_wrote_and_says_deploy_again_denied(deployed_central_entity, written):
    renderer, _, api = deployed_central_entity()
    apply.record_path(render.namespace_of(renderer.topology)).write_bytes(written)
    with pytest.raises(ReloadError, match="written by another version of complyroute and cannot be read: deploy again"):
        apply.reload_policy(renderer.topology, SHIPPED, out=io.StringIO())
    assert api.applied == []


# A ConfigMap budget that the compiled central entity's bootstrap at 20 services in plain HTTP
# fits (220 kB) and its route files (228 kB: each listener's allowed labellings) do not: they
# take two. (With mutual TLS and label tokens the bootstrap is the larger; at 5 services the route
# files, 48 kB, are smaller than the bootstrap, 55 kB.)
SMALL_BUDGET = 224_000


SMALL_BUDGET_SERVICES = 20
SMALL_BUDGET_SECURITY = {"mtls": False, "label_tokens": False}


def test_reload_keeps_the_configmaps_the_pods_mount_allowed(deployed_central_entity, us_adequate):
    """Deployed with the route files over two ConfigMaps (SMALL_BUDGET), a rule set whose files
    fill one leaves the second mounted, empty."""
    renderer, _, api = deployed_central_entity(budget=SMALL_BUDGET, services=SMALL_BUDGET_SERVICES, security=SMALL_BUDGET_SECURITY)
    assert renderer.route_configmaps("central-entity") == ["routes-central-entity-1", "routes-central-entity-2"]
    result = apply.reload_policy(renderer.topology, RuleSet.of(us_adequate), out=io.StringIO())
    assert result["applied"] == ["bundles-1", "routes-central-entity-1", "routes-central-entity-2"]
    emptied = by_kind(api.applied[0], "ConfigMap")["routes-central-entity-2"]
    assert "data" not in emptied and "binaryData" not in emptied
    # Every compiled listener's route file, one per hop out of a service, in the first.
    assert len(by_kind(api.applied[0], "ConfigMap")["routes-central-entity-1"]["data"]) == SMALL_BUDGET_SERVICES - 1


def test_reload_of_the_baseline_says_there_is_no_rule_set_to_reload_denied(tmp_path, monkeypatch):
    renderer = render.Renderer(manifest.load("baseline", services=3), RuleSet.of("policies"))
    renderer.render()
    api = FakeApiServer(objects_of(render.build(renderer, tmp_path / "kustomization")))
    monkeypatch.setattr(apply, "kubectl_output", api)
    apply.write_record(apply.deployed_of(renderer), renderer.signing_key)
    with pytest.raises(ReloadError, match="baseline runs no OPA"):
        apply.reload_policy(renderer.topology, SHIPPED, out=io.StringIO())
    assert api.applied == []


def test_reload_refuses_files_that_would_need_configmaps_the_pods_do_not_mount_denied(deployed_central_entity, us_adequate, monkeypatch):
    renderer, _, api = deployed_central_entity(services=SMALL_BUDGET_SERVICES, security=SMALL_BUDGET_SECURITY)
    monkeypatch.setattr(render, "CONFIGMAP_BUDGET", SMALL_BUDGET)
    with pytest.raises(ReloadError, match=r"fills ConfigMaps the pods do not mount \(routes-central-entity-2\)"):
        apply.reload_policy(renderer.topology, RuleSet.of(us_adequate), out=io.StringIO())
    assert api.applied == []


def test_reload_refuses_a_rule_set_that_changes_an_envoy_bootstrap_denied(deployed_central_entity):
    renderer, _, api = deployed_central_entity()
    path = apply.record_path("complyroute-central-entity")
    record = pickle.loads(path.read_bytes())
    as_if = replace(record, placed=replace(record.placed, bootstraps={"central-entity": "0" * 64}))  # as if deployed with another bootstrap
    path.write_bytes(pickle.dumps(as_if))
    with pytest.raises(ReloadError, match="changes the Envoy configuration of central-entity beyond its route files"):
        apply.reload_policy(renderer.topology, SHIPPED, out=io.StringIO())
    assert api.applied == []


def test_reload_keeps_each_configmap_in_the_deploys_applyset_allowed(deployed_central_entity, us_adequate):
    """`deploy --target k8s` applied the ConfigMaps as members of its ApplySet (kubectl labelled them); a
    reload's server-side apply carries the label over, or it would take it off and the next
    deploy could no longer prune them."""
    renderer, objects, api = deployed_central_entity()
    for key in [("ConfigMap", "bundles-1"), ("ConfigMap", "routes-central-entity-1")]:
        api.objects[key]["metadata"]["labels"] = {**api.objects[key]["metadata"]["labels"], apply.APPLYSET_MEMBER: "applyset-abc-v1"}
    apply.reload_policy(renderer.topology, RuleSet.of(us_adequate), out=io.StringIO())
    [applied] = api.applied
    assert {o["metadata"]["name"]: o["metadata"]["labels"][apply.APPLYSET_MEMBER] for o in applied} == {
        "bundles-1": "applyset-abc-v1", "routes-central-entity-1": "applyset-abc-v1"}
    assert all(o["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "complyroute" for o in applied)


def test_reload_adds_no_applyset_label_where_the_deploy_had_none_denied(deployed_central_entity, us_adequate):
    renderer, objects, api = deployed_central_entity()
    apply.reload_policy(renderer.topology, RuleSet.of(us_adequate), out=io.StringIO())
    [applied] = api.applied
    assert not [o["metadata"]["name"] for o in applied if apply.APPLYSET_MEMBER in o["metadata"]["labels"]]
