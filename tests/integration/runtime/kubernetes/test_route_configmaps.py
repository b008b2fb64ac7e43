"""Kubernetes manifests under the compiled engine: the routes OPA decided ahead of time (each
deciding listener's matcher tree) are route files in ConfigMaps of their own, under the size
limit, mounted where the point's Envoy reads them; under envoy-opa every route stays in the
bootstrap."""

import json

import pytest

from complyroute.policy import bundles
from complyroute.proxy.routes import ROUTE_CONFIGURATION, split_routes
from complyroute.runtime.kubernetes import render, validate
from complyroute.topology import manifest
from complyroute.trust import kubetrust

from tests.integration.runtime.kubernetes.manifests import (
    by_kind, configmap_bytes, connection_managers, containers, envoy_config, has_matcher_tree, mounted_files, pods, rendered)


BIG = [("central-entity", "central-entity"), ("dynamic-router-3", "router-1")]


# Under the compiled engine the routes OPA decided ahead of time (each deciding listener's
# matcher tree) are files Envoy reads from ConfigMaps routes-<point>-<n> of their own, which a
# reload updates. A compiled central entity or router set at 50 services holds 49 matcher trees
# with a TLS context and a token check each: with them its bootstrap would be over 1 MiB.
@pytest.fixture(scope="module")
def compiled_at_fifty(tmp_path_factory):
    """A compiled topology of 50 services as rendered under the default ConfigMap budget, rendered
    and validated once for the tests below (compiling 49 matcher trees takes OPA most of a minute here)."""
    rendered_once = {}

    def render(topology):
        if topology not in rendered_once:
            path, objects = rendered(topology, 50, tmp_path_factory.mktemp(topology), engine="envoy-compiled")
            assert validate.validate(path) == []
            rendered_once[topology] = objects
        return rendered_once[topology]
    return render


@pytest.mark.scale
@pytest.mark.parametrize("topology", ["sidecar", "central-entity", "dynamic-router-3", "dynamic-router-6"])
def test_compiled_engine_renders_its_matcher_trees_into_route_configmaps_under_the_size_limit_allowed(topology, compiled_at_fifty):
    objects = compiled_at_fifty(topology)
    configmaps = by_kind(objects, "ConfigMap")
    # The API server refuses a ConfigMap over 1 MiB; the renderer leaves a margin.
    assert max(configmap_bytes(o) for o in configmaps.values()) <= render.CONFIGMAP_BUDGET < render.CONFIGMAP_LIMIT
    routes = {name: o for name, o in configmaps.items() if name.startswith("routes-")}
    assert routes and all(has_matcher_tree(json.loads(value)["resources"][0]) for o in routes.values() for value in o["data"].values())
    assert not any(has_matcher_tree(manager["route_config"]) for name, o in configmaps.items() if name.startswith("envoy-")
                   for manager in connection_managers(json.loads(o["data"]["envoy.json"])).values() if "route_config" in manager)
    # Every point's route ConfigMaps are mounted by its Envoy, and by nothing else.
    for workload, pod in pods(objects).items():
        for container in containers(pod):
            projected = [s["configMap"]["name"] for v in pod["volumes"] if "projected" in v and v["name"] in
                         {m["name"] for m in container.get("volumeMounts", [])} for s in v["projected"]["sources"]]
            if container["name"] == "envoy":
                point, _ = envoy_config(objects, pod, container)
                assert projected == sorted(name for name in routes if name.rsplit("-", 1)[0] == f"routes-{point}"), workload
            else:
                assert not [name for name in projected if name in routes], (workload, container["name"])


@pytest.mark.scale
@pytest.mark.parametrize("budget", [None, 560_000], ids=["budget", "two-configmaps"])
@pytest.mark.parametrize("topology, point", BIG)
def test_every_route_file_a_listener_names_is_in_one_configmap_mounted_where_it_reads_allowed(topology, point, budget, tmp_path, monkeypatch,
                                                                                            compiled_at_fifty):
    if budget:
        # In plain HTTP, the route files of the central entity and of router-1 (587 kB) fill two
        # ConfigMaps of 560,000 bytes, their bootstraps (523 and 511 kB) one. (With mutual TLS and
        # label tokens the bootstraps, 608 and 594 kB, are the larger.)
        monkeypatch.setattr(render, "CONFIGMAP_BUDGET", budget)
        path, objects = rendered(topology, 50, tmp_path, engine="envoy-compiled", overrides={"security": {"mtls": False, "label_tokens": False}})
        assert validate.validate(path) == []
    else:
        objects = compiled_at_fifty(topology)
    configmaps = by_kind(objects, "ConfigMap")
    assert max(configmap_bytes(o) for o in configmaps.values()) <= (budget or render.CONFIGMAP_BUDGET)
    pod = pods(objects)[point]
    envoy_container = next(c for c in containers(pod) if c["name"] == "envoy")
    _, envoy = envoy_config(objects, pod, envoy_container)
    managers = connection_managers(envoy)
    assert len(managers) == len(envoy["static_resources"]["listeners"])
    # The 49 hops' matcher trees in files; the entry's and the readiness listener's routes, which
    # hold no decision of the rule set, stay in the bootstrap.
    inline = {listener for listener, manager in managers.items() if "route_config" in manager}
    assert len(managers) - len(inline) == 49 and not any(has_matcher_tree(managers[listener]["route_config"]) for listener in inline)
    files = mounted_files(objects, pod, envoy_container)
    for listener, manager in [(l, m) for l, m in managers.items() if l not in inline]:
        rds = manager["rds"]
        # Envoy reads a file again when the kubelet swaps the volume's contents (a rename in the folder).
        assert rds["config_source"] == {"path_config_source": {"path": f"{render.ROUTES_MOUNT}/{listener}.json",
                                                               "watched_directory": {"path": render.ROUTES_MOUNT}},
                                        "resource_api_version": "V3"}
        holding = [name for name, o in configmaps.items() if f"{listener}.json" in o.get("data", {})]
        assert len(holding) == 1, (listener, holding)
        response = json.loads(files[rds["config_source"]["path_config_source"]["path"]])
        # Its version is the rule set's revision: what Envoy's rds statistics tell of a reload.
        assert response["version_info"] == bundles.revision() and len(response["resources"]) == 1
        assert response["resources"][0]["@type"] == ROUTE_CONFIGURATION
        assert has_matcher_tree(response["resources"][0])
        assert response["resources"][0]["name"] == rds["route_config_name"] == listener
    routes = [name for name in configmaps if name.startswith(f"routes-{point}-")]
    assert len(routes) == (2 if budget else 1)
    projected = next(v for v in pod["volumes"] if v["name"] == f"routes-{point}")
    assert sorted(s["configMap"]["name"] for s in projected["projected"]["sources"]) == sorted(routes)
    assert [m for m in envoy_container["volumeMounts"] if m["name"] == f"routes-{point}"] == [
        {"name": f"routes-{point}", "mountPath": render.ROUTES_MOUNT, "readOnly": True}]
    # Only that point's Envoy reads them.
    assert [(w, c["name"]) for w, p in pods(objects).items() for c in containers(p)
            if any(m["mountPath"] == render.ROUTES_MOUNT for m in c.get("volumeMounts", []))] == [(point, "envoy")]


@pytest.mark.parametrize("engine", manifest.ENGINES)
@pytest.mark.parametrize("topology, point", BIG)
def test_only_routes_the_rule_set_decides_leave_the_bootstrap_denied(topology, point, engine, tmp_path):
    """Under envoy-opa no route depends on the rule set (OPA's answers carry every change): every
    route stays in its bootstrap. Under envoy-compiled only the matcher trees leave it."""
    _, objects = rendered(topology, 5, tmp_path, engine=engine)
    compiled = engine == "envoy-compiled"
    assert [name for name in by_kind(objects, "ConfigMap") if name.startswith("routes-")] == ([f"routes-{point}-1"] if compiled else [])
    for workload, pod in pods(objects).items():
        for container in [c for c in containers(pod) if c["name"] == "envoy"]:
            _, envoy = envoy_config(objects, pod, container)
            managers = connection_managers(envoy)
            inline = [m for m in managers.values() if "route_config" in m]
            assert inline and not any(has_matcher_tree(m["route_config"]) for m in inline), workload
            split = len(managers) - len(inline)
            assert split == (4 if compiled and workload == point else 0), (workload, split)  # the 4 hops of 5 services
            mounts = [m["mountPath"] for m in container["volumeMounts"]]
            assert mounts == (["/config", render.ROUTES_MOUNT, kubetrust.MOUNT, render.PRIVATE_MOUNT] if split
                              else ["/config", kubetrust.MOUNT, render.PRIVATE_MOUNT]), (workload, mounts)


def test_split_routes_moves_every_route_configuration_and_leaves_the_bootstrap_it_was_given():
    manager = lambda name: {"stat_prefix": name, "route_config": {"name": name, "virtual_hosts": []}, "http_filters": []}
    listener = lambda name: {"name": name, "filter_chains": [{"filters": [{"name": "hcm", "typed_config": manager(name)}]}]}
    envoy = {"static_resources": {"listeners": [listener("a"), listener("b")], "clusters": []}}
    bootstrap, files = split_routes(envoy, render.ROUTES_MOUNT)
    assert envoy["static_resources"]["listeners"][0] == listener("a")
    assert list(connection_managers(bootstrap)["a"]) == ["stat_prefix", "rds", "http_filters"]
    assert connection_managers(bootstrap)["b"]["rds"]["config_source"]["path_config_source"]["path"] == "/etc/envoy/routes/b.json"
    assert json.loads(files["a.json"]) == {"version_info": "1", "resources": [{"@type": ROUTE_CONFIGURATION, "name": "a", "virtual_hosts": []}]}


def test_route_files_fill_configmaps_in_turn_and_one_too_large_is_refused_denied():
    files = {"a.json": "x" * 10, "b.json": "y" * 10, "c.json": "z" * 10}  # 16 bytes each, key and value
    assert render.pack(files, budget=32) == [{"a.json": "x" * 10, "b.json": "y" * 10}, {"c.json": "z" * 10}]
    assert render.pack(files, budget=48) == [files]
    assert render.pack({}) == []
    with pytest.raises(render.RenderError, match="b.json is 26 bytes, over the 16 bytes"):
        render.pack({"a.json": "x" * 10, "b.json": "y" * 20}, budget=16)
