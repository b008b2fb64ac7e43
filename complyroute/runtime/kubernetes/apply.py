"""Apply a rendered topology (render.py) to the current kubectl context, and read, reload and
delete what was applied there: kubectl, and what `deploy`, `status`, `reload-policy` and
`undeploy` do with --target k8s (KubernetesTarget, target.py): apply, status, reload_policy
and delete."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

from complyroute import engines
from complyroute.files import YAML_LOADER, write_whole, yaml_text
from complyroute.policy import bundles, labels, policydata
from complyroute.policy.ruleset import RuleSet
from complyroute.runtime.kubernetes.render import (PART_OF, RENDER_ANNOTATION, SERVICE_IMAGE, KubernetesNetwork, RenderError, Renderer, build,
                                                  component_of, namespace_of, write_private)
from complyroute.runtime.deployed import Deployed
from complyroute.runtime.target import ReloadError, runs_root
from complyroute.topology.manifest import Topology
from complyroute.topology.plan import Plan


def deployed_dir() -> Path:
    """Where the record of each namespace's deployment is kept, for its reload and undeploy."""
    return runs_root() / "k8s" / "deployed"


def kubectl(*args: str, check: bool = True, env: dict[str, str] | None = None, out=None) -> subprocess.CompletedProcess:
    """kubectl against the current context (KUBECONFIG and the context are the operator's); `env`
    adds to the environment. The command and what kubectl prints go to `out` (an open file), or
    to this process's standard output."""
    command = [shutil.which("kubectl") or "kubectl", *args]
    print("$ " + "".join(f"{k}={v} " for k, v in (env or {}).items()) + " ".join(command), file=out, flush=True)
    result = subprocess.run(command, text=True, env={**os.environ, **env} if env else None,
                            stdout=out, stderr=subprocess.STDOUT if out else None)
    if check and result.returncode != 0:
        raise RuntimeError(f"kubectl {' '.join(args)} failed with exit code {result.returncode}")
    return result


def kubectl_output(*args: str) -> subprocess.CompletedProcess:
    """kubectl against the current context, its output captured."""
    return subprocess.run([shutil.which("kubectl") or "kubectl", *args], capture_output=True, text=True)


def kubectl_json(*args: str) -> dict | None:
    """What kubectl ... -o json answers; None when it fails (its message is left out)."""
    result = kubectl_output(*args, "-o", "json")
    return json.loads(result.stdout) if result.returncode == 0 else None


@dataclass(frozen=True)
class Applied:
    """What `deploy --target k8s` applied beside the points' configuration, which its reload checks
    (the record's `placed`: runtime/deployed.py)."""

    render_id: str  # the namespace's RENDER_ANNOTATION: a reload refuses a namespace deployed since from elsewhere
    bootstraps: dict[str, str]  # SHA-256 of each point's Envoy bootstrap as applied: a reload changes none
    configmaps: list[str]  # the rule-set ConfigMaps as applied (rule_set_configmaps): the pods mount these and no other


def record_path(namespace: str) -> Path:
    """The record of the deployment in `namespace` (Deployed), which its reload reads."""
    return deployed_dir() / f"{namespace}.pickle"


def signing_key_path(namespace: str) -> Path:
    """The bundle signing key of the deployment in `namespace`, which its reload signs with;
    readable by the deploying user only, as the record (which holds no private key)."""
    return deployed_dir() / f"{namespace}.bundle-signing.key"


def deployed_of(renderer: Renderer) -> Deployed:
    """The record of what `renderer` configured, and of what of it a deploy applies."""
    return Deployed.of(renderer.plan, renderer.points, renderer.point_trust, renderer.configuration,
                       Applied(renderer.render_id, _digests(renderer.bootstraps), [o["metadata"]["name"] for o in renderer.rule_set_configmaps()]))


def write_record(deployed: Deployed, signing_key: bytes) -> None:
    deployed_dir().mkdir(parents=True, exist_ok=True)
    namespace = namespace_of(deployed.plan.topology)
    write_whole(signing_key_path(namespace), signing_key, 0o600)
    deployed.write(record_path(namespace))


def _digests(texts: dict[str, str]) -> dict[str, str]:
    return {name: hashlib.sha256(text.encode()).hexdigest() for name, text in texts.items()}


# `deploy --target k8s` applies a topology as an ApplySet (KEP-3659): kubectl records in a parent Secret in the
# namespace which kinds and objects the last apply made, labels each member with the set's id
# (APPLYSET_MEMBER), and with --prune deletes every member the new apply no longer holds (a
# service of a larger render, a ConfigMap or Secret of an earlier hash). Pruning by a label
# selector with an allowlist (kubectl apply --prune -l ...) does not work with server-side
# apply, which the ConfigMaps need (client-side apply keeps each object in an annotation, at
# most 256 KiB).
APPLYSET = "complyroute"  # the parent: Secret `complyroute` in the topology's namespace
APPLYSET_MEMBER = "applyset.kubernetes.io/part-of"


def apply(topology: Topology, folder: Path, rule_set: RuleSet, timeout: str = "300s", image: str = SERVICE_IMAGE,
          one_node: bool = False, out=None) -> int:
    """Apply the rendered topology, with `rule_set`, in its own namespace, pruning what an earlier apply there left that this one does not hold, and wait
    until every workload is ready. What a reload needs of it is recorded once the API server
    took it (deployed_of). kubectl's commands and output go to `out` (an open file), or to standard
    output."""
    renderer = Renderer(topology, rule_set, image=image, one_node=one_node)
    renderer.render()
    output = folder.with_suffix(".yaml")
    output.parent.mkdir(parents=True, exist_ok=True)
    namespace = renderer.namespace
    # The namespace first, on its own: the ApplySet's parent lives in it, and no apply prunes it.
    namespace_file = folder.with_suffix(".namespace.yaml")
    namespace_file.write_text(yaml.safe_dump(renderer.namespace_object(), sort_keys=False))
    built = [o for o in yaml.load_all(build(renderer, folder), Loader=YAML_LOADER) if o]
    write_private(output, yaml_text(*[o for o in built if o["kind"] != "Namespace"]))
    kubectl("apply", "--server-side", "-f", str(namespace_file), out=out)
    kubectl("-n", namespace, "apply", "--server-side", "--prune", f"--applyset={APPLYSET}", "-f", str(output), env={"KUBECTL_APPLYSET": "true"},
            out=out)
    write_record(deployed_of(renderer), renderer.signing_key)
    kubectl("-n", namespace, "wait", "--for=condition=Available", "deployment", "--all", f"--timeout={timeout}", out=out)
    for daemonset in [o["metadata"]["name"] for o in renderer.objects if o["kind"] == "DaemonSet"]:
        kubectl("-n", namespace, "rollout", "status", f"daemonset/{daemonset}", f"--timeout={timeout}", out=out)
    entry = entry_service(renderer.plan)
    print(f"k8s: {topology.name} is running in namespace {namespace}. Reach its entry with\n"
          f"  kubectl -n {namespace} port-forward service/{entry} 8080:{KubernetesNetwork.ENTRY}\n"
          f"and send records to http://127.0.0.1:8080/process", file=out)
    return 0


def entry_service(plan: Plan) -> str:
    """The Service in front of a placed topology's entry: what clients and `kubectl port-forward` reach."""
    return plan.entry.reach.split(".")[0]


def status(topology: Topology | None = None, out=sys.stdout) -> int:
    """The pods of every topology deployed to the current context (or of `topology` only): each one's
    ready containers, restarts, node and phase. 0 when every pod is ready, 1 otherwise or when
    nothing is deployed."""
    selector = f"app.kubernetes.io/part-of={PART_OF}" + (f",app.kubernetes.io/instance={namespace_of(topology)}" if topology else "")
    found = kubectl_json("get", "namespaces", "-l", selector)
    if found is None:
        print("status: the current kubectl context does not answer (kubectl get namespaces failed)", file=out)
        return 1
    namespaces = sorted(n["metadata"]["name"] for n in found["items"])
    if not namespaces:
        print(f"status: no complyroute topology is deployed to the current kubectl context{f' as {namespace_of(topology)}' if topology else ''}", file=out)
        return 1
    unready = 0
    for namespace in namespaces:
        pods = sorted((kubectl_json("-n", namespace, "get", "pods") or {"items": []})["items"], key=lambda p: p["metadata"]["name"])
        ready_pods = 0
        print(f"{namespace}: {len(pods)} pods", file=out)
        for pod in pods:
            spec, state = pod["spec"], pod.get("status", {})
            # As kubectl's READY: the containers, and the native sidecars (init containers that keep running).
            sidecars = {c["name"] for c in spec.get("initContainers", []) if c.get("restartPolicy") == "Always"}
            statuses = state.get("containerStatuses", []) + [c for c in state.get("initContainerStatuses", []) if c["name"] in sidecars]
            restarts = sum(c.get("restartCount", 0) for c in state.get("containerStatuses", []) + state.get("initContainerStatuses", []))
            ready = any(c["type"] == "Ready" and c["status"] == "True" for c in state.get("conditions", []))
            ready_pods += ready
            print(f"  {'ready    ' if ready else 'NOT READY'} {sum(c.get('ready', False) for c in statuses)}/{len(spec['containers']) + len(sidecars)}"
                  f"  restarts {restarts:<3} {pod['metadata']['name']:<48} {pod['metadata'].get('labels', {}).get('component', '-'):<15}"
                  f" {spec.get('nodeName', '(unscheduled)'):<10} {state.get('phase', '-')}", file=out)
        unready += len(pods) - ready_pods + (not pods)
        print(f"status: {namespace}: {ready_pods}/{len(pods)} pods ready", file=out)
    return 1 if unready else 0


def _record(topology: Topology) -> tuple[Path, Deployed, Applied]:
    """Where the record of `topology`'s deployment here is, the record and what it applied;
    ReloadError, saying to deploy again, when there is none this version reads."""
    record = record_path(namespace_of(topology))
    deploy_again = f"make deploy target=k8s topology={topology.name}"
    if not record.exists():
        raise ReloadError(f"{topology.name} was not deployed to Kubernetes from here ({record} is missing): {deploy_again} first")
    deployed = Deployed.read(record, deploy_again)
    if not isinstance(deployed.placed, Applied):
        raise ReloadError(f"{record} records no Kubernetes deployment: deploy again ({deploy_again}), then reload")
    return record, deployed, deployed.placed


def deployed_rule_set(topology: Topology) -> str:
    """The rule set `topology` was deployed with here, as it was chosen (its record)."""
    return _record(topology)[1].rule_set


def reload_policy(topology: Topology, rule_set: RuleSet, out=sys.stdout) -> dict:
    """Apply `rule_set` to `topology` as `deploy --target k8s` applied it to the current context
    (its namespace's record: the services it was deployed with, whatever `topology` holds),
    as its rule-set ConfigMaps only (bundles-<n>, routes-<point>-<n>): no pod template changes,
    so no pod is rolled. Returns {"revision", "namespace", "applied": [names], "changed": [names
    whose content changed]}.

    Every point is configured again from what the deploy recorded (Deployed: its points and
    their trust, so the same CA and keys; Applied) and the rule set, by the code a render runs. Refused,
    with nothing applied, when the rule set does not compile, when it would change anything
    else (an Envoy bootstrap, the labels), or when its files would need more ConfigMaps than were deployed
    (the pods mount a fixed list): then deploy again.

    It does not wait for the points to take the new revision: the kubelet swaps an updated
    ConfigMap into a running pod at its next sync of that pod (up to its sync period, a minute
    by default, plus its ConfigMap cache's delay); from there each OPA's long poll and each
    Envoy's watched folder take it at once. It prints how to ask a point which revision it
    decides with.
    """
    namespace = namespace_of(topology)
    record, deployed, applied = _record(topology)
    if not applied.configmaps:
        raise ReloadError(f"{topology.name} runs no OPA (nothing in it decides): there is no rule set to reload")
    found = kubectl_json("get", "namespace", namespace)
    if found is None:
        raise ReloadError(f"namespace {namespace} is not in the current kubectl context: deploy it there first (make deploy target=k8s)")
    running = found["metadata"].get("annotations", {}).get(RENDER_ANNOTATION)
    if running != applied.render_id:
        raise ReloadError(f"namespace {namespace} runs render {running}, not {applied.render_id} which {record} records: "
                          "it was deployed from elsewhere or again since; deploy it from here (make deploy target=k8s)")

    policies = rule_set.folder
    if rule_set.service_setting != labels.service_setting(deployed.schema):
        raise ReloadError(f"the rule set in {policies} changes the labels {namespace} was deployed with "
                          f"({', '.join(label.name for label in rule_set.schema)}; deployed: "
                          f"{', '.join(label.name for label in deployed.schema)}): on Kubernetes the "
                          "services and the Envoys' listeners take the labels when their pods start, which a reload does not "
                          "do; nothing was applied: deploy again (make deploy target=k8s). A local deployment's "
                          "`make reload-policy` adds labels without a restart")
    key = signing_key_path(namespace)
    if not key.exists():
        raise ReloadError(f"{key} is missing: the bundles of {namespace} are signed with the key its deploy recorded there; "
                          f"deploy again (make deploy target=k8s topology={topology.name}), then reload")
    renderer = Renderer(deployed.plan.topology, rule_set)
    renderer.signing_key = key.read_bytes()
    try:
        renderer.configure(deployed.points, deployed.point_trust, deployed.set_clusters)
    except (engines.EngineError, policydata.PolicyDataError, bundles.BundleError, RenderError) as error:
        raise ReloadError(f"the rule set in {policies} cannot be applied; nothing was applied: {error}") from None
    changed_bootstraps = sorted(name for name, digest in _digests(renderer.bootstraps).items() if applied.bootstraps.get(name) != digest)
    if changed_bootstraps:
        raise ReloadError(f"the rule set in {policies} changes the Envoy configuration of {', '.join(changed_bootstraps)} beyond its "
                          "route files, which a reload does not apply; nothing was applied: deploy again (make deploy target=k8s)")
    configmaps = {o["metadata"]["name"]: o for o in renderer.rule_set_configmaps()}
    beyond = sorted(set(configmaps) - set(applied.configmaps))
    if beyond:
        raise ReloadError(f"the rule set in {policies} fills ConfigMaps the pods do not mount ({', '.join(beyond)}); "
                          "nothing was applied: deploy again (make deploy target=k8s)")
    for name in applied.configmaps:  # a ConfigMap the new rule set leaves empty stays mounted, empty
        configmaps.setdefault(name, renderer.rule_set_configmap(name, {}))
    names = sorted(configmaps)
    for configmap in configmaps.values():
        configmap["metadata"]["namespace"] = namespace

    def versions() -> dict[str, str | None]:
        listed = kubectl_json("-n", namespace, "get", "configmap", *names) or {"items": []}
        return {**dict.fromkeys(names), **{c["metadata"]["name"]: c["metadata"]["resourceVersion"] for c in listed["items"]}}

    before = versions()
    # Each stays a member of the deploy's ApplySet (the label this apply would otherwise take off).
    members = (kubectl_json("-n", namespace, "get", "configmap", *names) or {"items": []})["items"]
    for member in members:
        if APPLYSET_MEMBER in member["metadata"].get("labels", {}):
            configmaps[member["metadata"]["name"]]["metadata"]["labels"][APPLYSET_MEMBER] = member["metadata"]["labels"][APPLYSET_MEMBER]
    applied = deployed_dir() / f"{namespace}.reload.yaml"
    applied.write_text(yaml.safe_dump_all([configmaps[name] for name in names], sort_keys=False))
    print(f"$ kubectl apply --server-side -f {applied}", file=out)
    result = kubectl_output("apply", "--server-side", "-f", str(applied))
    print((result.stdout + result.stderr).rstrip(), file=out)
    if result.returncode != 0:
        raise ReloadError(f"kubectl apply of {applied} failed (exit code {result.returncode}): {result.stderr.strip()}")
    after = versions()
    changed = [name for name in names if before[name] != after[name]]
    deployed.reloaded(renderer.revision).write(record)
    print(f"reload-policy: revision {renderer.revision} applied to namespace {namespace}: "
          + (", ".join(changed) + " changed" if changed else "no ConfigMap changed")
          + (f"; {', '.join(n for n in names if n not in changed)} unchanged" if len(changed) < len(names) else ""), file=out)
    # Envoy's admin and OPA's REST API are sockets only the point's own containers open
    # (render.PRIVATE_MOUNT): what a point decides with shows in the records it decides.
    print(f"reload-policy: this does not wait for the pods. The kubelet swaps a changed ConfigMap into the pods that mount it at "
          f"its next sync of each (up to about a minute); each OPA and Envoy then takes it at once. Which revision a point decides with: "
          f"send a record; each hop of its answer's path names the revision that decided it (a denial names it too), "
          f"and so does each audit line. Pods with an OPA: kubectl -n {namespace} get pods -l 'component in ({','.join(_opa_components(deployed))})'",
          file=out)
    return {"revision": renderer.revision, "namespace": namespace, "applied": names, "changed": changed}


def _opa_components(deployed: Deployed) -> list[str]:
    """The components whose pods run an OPA (their workloads' `component` label)."""
    return sorted({component_of(point) for point in deployed.points if point.deciding})


def delete(out=None) -> int:
    """Remove every complyroute namespace (each holds one topology) from the current context,
    and the records a reload would read; kubectl's output goes to `out`, or to standard output."""
    kubectl("delete", "namespace", "-l", "app.kubernetes.io/part-of=complyroute", "--wait=true", out=out)
    shutil.rmtree(deployed_dir(), ignore_errors=True)
    return 0
