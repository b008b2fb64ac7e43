"""engine.decision_logs reaches every deciding point's OPA, locally and on Kubernetes: "file"
turns on OPA's console decision log (one JSON line per decision on the OPA's output: its log
file locally, its container's output on Kubernetes), "off" leaves it out. The mask that keeps
the record out of it is loaded beside the rule set. What OPA really writes:
tests/e2e/test_trace_e2e.py."""

import pytest
import yaml

from complyroute import engines, kubernetes, manifest
from complyroute.deployment import POLICIES, SYSTEM_POLICIES
from complyroute.plan import place

MIXED_REGIONS = str(manifest.REPO / "topologies" / "examples" / "mixed-regions.yaml")


def with_decision_logs(setting, engine="envoy-opa"):
    topology = manifest.load(MIXED_REGIONS, engine=engine)
    return manifest.load(MIXED_REGIONS, engine=engine, overrides={"engine": {**topology.engine, "decision_logs": setting}})


def opa_configs(topology) -> dict[str, dict]:
    configs = engines.configure(topology.engine["kind"], place(topology).points, topology.engine, POLICIES)
    return {name: config.opa for name, config in configs.items() if config.opa is not None}


@pytest.mark.parametrize("engine", manifest.ENGINES)
def test_every_opa_logs_its_decisions_to_its_console_with_file_allowed(engine):
    configs = opa_configs(with_decision_logs("file", engine))
    assert len(configs) == 5  # the entry and the four sidecars of instances that send on
    for config in configs.values():
        # Console only: a decision_logs section naming a service would upload them instead.
        assert config["decision_logs"] == {"console": True}


@pytest.mark.parametrize("engine", manifest.ENGINES)
def test_no_opa_logs_decisions_by_default_denied(engine):
    topology = manifest.load(MIXED_REGIONS, engine=engine)
    assert topology.engine["decision_logs"] == "off"
    assert all("decision_logs" not in config for config in opa_configs(topology).values())


def test_the_mask_is_among_the_policies_every_opa_loads_beside_its_rule_set_allowed():
    assert (SYSTEM_POLICIES / "log" / "mask.rego").is_file()


def rendered_opa_configs(topology, tmp_path):
    objects = [o for o in yaml.safe_load_all(kubernetes.render(topology, tmp_path / "kustomization")) if o]
    configmaps = [o for o in objects if o["kind"] == "ConfigMap"]
    opa = {o["metadata"]["name"]: yaml.safe_load(o["data"]["opa.yaml"]) for o in configmaps if o["metadata"]["name"].startswith("opa-config-")}
    policy = next(o for o in configmaps if o["metadata"]["name"].startswith("policy-"))
    return opa, policy["data"]


def test_on_kubernetes_every_opa_logs_its_decisions_to_its_containers_output_allowed(tmp_path):
    opa, policy = rendered_opa_configs(with_decision_logs("file"), tmp_path)
    assert len(opa) == 5 and all(config["decision_logs"] == {"console": True} for config in opa.values())
    assert "system.log.mask.rego" in policy


def test_on_kubernetes_no_opa_logs_decisions_by_default_denied(tmp_path):
    opa, _ = rendered_opa_configs(manifest.load(MIXED_REGIONS), tmp_path)
    assert len(opa) == 5 and all("decision_logs" not in config for config in opa.values())
