"""Apply a rule set to the running deployment, restarting nothing: `make reload-policy`.

A reload configures every enforcement point again from the plan the deployment was rendered
from (run folder: rendered.pickle) and the rule set in `policies`, exactly as a deploy would,
and hands the result to the running processes the way each takes it:

- every OPA gets a new bundle (bundles.py): rule set, index, revision. The bundle server
  answers the OPA's pending long poll with it; OPA activates it between two decisions.
- under envoy-compiled, every Envoy gets the route configurations of its deciding listeners
  again: files moved into the folder it watches (RDS from the filesystem), holding the hops
  OPA decided ahead of time under the new revision. (Under envoy-opa, Envoy's routes do not
  depend on the rule set: OPA's answers carry every change.)

Nothing is restarted, so nothing in flight is dropped: a request keeps the route and the
policy it started with. The reload returns once every point decides with the new revision:
its OPA reports it (GET /v1/data/complyroute/revision on its REST API) and its Envoy serves
route configurations of that version (the admin interface's RDS statistics), both read through
the point's private sockets.
"""

from __future__ import annotations

import json
import pickle
import sys
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from complyroute import engines
from complyroute.policy import bundles, labels, policydata, policyfiles
from complyroute.runtime.local import deployment, rendering
from complyroute.topology import localhttp
from complyroute.topology.plan import EnforcementPoint

POLL_INTERVAL = 0.05  # between rounds of asking the points still on the old revision


class ReloadError(RuntimeError):
    """A reload that could not be applied or did not take; the message says what to do."""


def _get_json(url: str) -> dict | None:
    """A JSON answer from a point's socket (localhttp); None when it does not answer 200."""
    try:
        status, body = localhttp.request(url, timeout=2)
        return json.loads(body) if status == 200 else None
    except (OSError, ValueError):
        return None


def opa_revision(point: EnforcementPoint) -> str | None:
    """The revision the point's OPA decides with (None: no bundle loaded, or unreachable)."""
    answer = _get_json(f"{point.opa_http.url}/v1/data/complyroute/revision")
    return (answer or {}).get("result")


def envoy_revisions(point: EnforcementPoint) -> set[str]:
    """The versions of the route configurations the point's Envoy serves: each listener's
    http.<listener>.rds.<route configuration>.version_text (the config dump keeps the version
    a configuration was last loaded with while its content stays the same)."""
    query = urllib.parse.urlencode({"filter": r"\.rds\..*\.version_text$", "format": "json"})
    answer = _get_json(f"{point.admin.url}/stats?{query}")
    if answer is None or "stats" not in answer:
        return set()
    return {stat["value"] for stat in answer["stats"] if "value" in stat}


def decides_with(point: EnforcementPoint, has_opa: bool, has_routes: bool, revision: str) -> bool:
    return (not has_routes or envoy_revisions(point) == {revision}) and (not has_opa or opa_revision(point) == revision)


def load_rendered(state: dict) -> rendering.Rendered:
    path = Path(state["run_dir"]) / rendering.RENDERED
    if not path.exists():
        raise ReloadError(f"{path} is missing: the deployment was started before reloads existed; deploy it again")
    return pickle.loads(path.read_bytes())


def reload_policy(policies: Path | None = None, out=sys.stdout, timeout: float = 120.0) -> dict:
    """Apply the rule set in `policies` (None: the one the deployment was started with, as it
    is now) to the current deployment; returns once every enforcement point decides with its
    revision:
    {"revision", "seconds" (from the call until the last point switched), "points": {point: seconds}}."""
    started = time.monotonic()
    state = deployment.running()
    if not state:
        raise ReloadError("nothing is deployed here: `make deploy` first (a deployment on Kubernetes takes a new rule set by `make deploy target=k8s` again, which rolls its pods)")
    run_dir = Path(state["run_dir"])
    try:
        policies = policyfiles.rule_set(policies if policies is not None else state.get("policies", "policies"))
    except policyfiles.RuleSetError as error:
        raise ReloadError(str(error)) from None
    rendered = load_rendered(state)
    plan = rendered.plan
    engine = plan.topology.engine
    try:
        schema = labels.schema(policies)
    except labels.LabelSchemaError as error:
        raise ReloadError(f"the rule set in {policies} cannot be applied; nothing was changed: {error}") from None
    if schema != rendered.label_schema:
        # The services and the listeners' label bounds and token claims were given the labels at
        # deploy; a reload changes what OPA decides and the compiled routes, not those.
        raise ReloadError(f"the rule set in {policies} declares other labels than the deployment was started with "
                          f"({', '.join(label.name for label in schema)}; deployed: "
                          f"{', '.join(label.name for label in rendered.label_schema) or 'unknown'}): labels reach the services "
                          f"and the enforcement points' listeners at deploy; nothing was changed, deploy again to change them")
    try:
        configs = engines.configure(engine["kind"], plan.points, engine, policies, rendered.point_trust)
        revision = bundles.write(run_dir / rendering.BUNDLES,
                                 {name: config.data for name, config in configs.items() if config.opa is not None}, policies,
                                 archive=run_dir / bundles.REVISIONS)
    except (engines.EngineError, policydata.PolicyDataError, bundles.BundleError) as error:
        raise ReloadError(f"the rule set in {policies} cannot be applied; nothing was changed: {error}") from None
    routed = set()  # points whose Envoy reads routes from files
    for point in plan.points:
        folder = run_dir / "points" / point.name
        _, routes = rendering.point_routes(configs[point.name].envoy, folder, revision)
        rendering.write_routes(folder / rendering.ROUTES, routes)
        if routes:
            routed.add(point.name)
    written = time.monotonic() - started
    print(f"reload-policy: revision {revision} written for {len(plan.points)} enforcement points in {written:.2f} s", file=out)

    # Rounds over the points still on the old revision, a few at a time: polling every point
    # as fast as it answers would itself load the machine the points run on.
    pending = {point.name: point for point in plan.points}
    seconds: dict[str, float | None] = dict.fromkeys(pending)
    with ThreadPoolExecutor(max_workers=min(8, len(pending))) as pool:
        while pending and time.monotonic() < started + timeout:
            names = list(pending)
            switched = pool.map(lambda name: decides_with(pending[name], configs[name].opa is not None, name in routed, revision), names)
            now = time.monotonic() - started
            for name, done in zip(names, list(switched)):
                if done:
                    seconds[name] = now
                    del pending[name]
            if pending:
                time.sleep(POLL_INTERVAL)
    behind = sorted(name for name, taken in seconds.items() if taken is None)
    if behind:
        raise ReloadError(f"after {timeout:.0f} s these points do not decide with revision {revision} yet: {', '.join(behind)} "
                          f"(their logs are in {run_dir / 'logs'})")
    result = {"revision": revision, "seconds": round(max(seconds.values()), 3), "written_seconds": round(written, 3),
              "points": {name: round(taken, 3) for name, taken in seconds.items()}}
    with (run_dir / "reloads.jsonl").open("a") as log:
        log.write(json.dumps({"at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "policies": str(policies), **result}) + "\n")
    rendering.update_rendered(run_dir, rendered, revision)
    deployment.write_state(run_dir, {**deployment.read_state(run_dir), "revision": revision})
    print(f"reload-policy: every enforcement point decides with {revision} after {result['seconds']:.3f} s "
          f"(slowest: {max(seconds, key=seconds.get)})", file=out)
    return result


def watch(policies: str | Path | None = None, interval: float = 0.5, out=sys.stdout, stop: threading.Event | None = None) -> None:
    """Reload whenever the rule set's files change (until interrupted, or `stop` is set); a rule
    set that cannot be applied is reported and the deployment keeps the one it has. `policies`:
    the rule set as chosen (None: the deployment's); its source folder is watched."""
    if policies is None:
        state = deployment.running()
        policies = state.get("policies", "policies") if state else "policies"
    try:
        policies = policyfiles.source_of(policies)
    except policyfiles.RuleSetError as error:
        raise ReloadError(str(error)) from None
    def content() -> str | None:
        try:
            return policyfiles.content_digest(bundles.rule_set_files(policies))
        except (OSError, bundles.BundleError):
            return None

    seen = content()
    print(f"watch-policy: watching {policies} (Ctrl-C stops watching; the deployment keeps running)", file=out)
    stop = stop or threading.Event()
    while not stop.wait(interval):
        now = content()
        if now == seen or now is None:
            continue
        seen = now
        try:
            reload_policy(policies, out=out)
        except ReloadError as error:
            print(f"watch-policy: {error}", file=out)
