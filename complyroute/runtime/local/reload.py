"""Apply a rule set to the running deployment, restarting nothing: `make reload-policy`.

A reload configures every enforcement point again from the deployment's record (run folder:
deployed.pickle, runtime/deployed.py) and the rule set in `policies`, exactly as a deploy would,
and hands the result to the running processes the way each takes it:

- every OPA gets a new bundle (bundles.py): rule set, index, revision, allowed table. The
  bundle server answers the OPA's pending long poll with it; OPA activates it between two
  decisions.
- under envoy-compiled, every Envoy gets the route configurations of its deciding listeners
  again: files moved into the folder it watches (RDS from the filesystem). (Under envoy-opa,
  Envoy's routes do not depend on the rule set: OPA's answers carry every change.)
- a rule set that adds labels to the schema (labelchange.py) has them reach the services
  and the listeners before the first step's bundles: every service reads the run's labels file
  again on SIGHUP and reports the setting it applies (GET /health), every point's Envoy takes
  its listeners file (LDS from the filesystem) and updates the deciding listeners in place
  (their label bound and token claims); a label that is new or newly required is required by
  the services only once every point holds the rules that require it, after the second step.
  So no record is refused by a service for a label the rules it passed
  did not ask for, and no rule reads a label a service would not send on. A rule set that
  removes a label or changes a label's header is refused (deploy again).
- no Envoy bootstrap: a rule set that would change one (rendering.check_bootstraps) is refused
  before anything is written (deploy again).

It does so in two steps, so that the new rules are in force before the control plane has asked
them over the whole decision space, which at 50 services is most of a reload's work:

1. the rule set without its precomputed answers: an empty allowed table, compiled routes that
   send every record to OPA. Every hop is decided in full by the rule set's entrypoint, which
   needs nothing computed ahead of time. Propagation is measured here: the reload says when every
   point decides with the new revision.
2. the rule set's answers over the decision space (precompute.py), checked by the guard, then
   the allowed tables and compiled routes that hold them: the same revision, now fast again.
   If the guard refuses them (or they cannot be computed), the points are given back the
   bundles and routes they had before the reload, and the reload fails saying so (labels it
   added stay with the services and listeners, where the old rules ignore them).

Nothing is restarted, so nothing in flight is dropped: a request keeps the route and the
policy it started with. Each step waits until every point has taken it: its OPA reports the
revision and the table's digest (GET /v1/data/complyroute on its REST API) and its Envoy serves
route configurations of that version (the admin interface's RDS statistics), both read through
the point's private sockets.
"""

from __future__ import annotations

import functools
import json
import re
import sys
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from complyroute import engines
from complyroute.engines import configuration
from complyroute.engines.configuration import Configuration, Versions
from complyroute.files import write_folder, write_whole
from complyroute.policy import bundles, labels, policydata, policyfiles
from complyroute.policy.ruleset import RuleSet
from complyroute.runtime.local import deployment, labelchange, polling, rendering, warmup
from complyroute.runtime.target import ReloadError
from complyroute.topology import localhttp
from complyroute.topology.plan import EnforcementPoint


def _get_json(url: str) -> dict | None:
    """A JSON answer from a point's socket (localhttp); None when it does not answer 200."""
    try:
        status, body = localhttp.request(url, timeout=2)
        return json.loads(body) if status == 200 else None
    except (OSError, ValueError):
        return None


def opa_state(point: EnforcementPoint) -> tuple[str | None, str | None]:
    """(revision, table digest) the point's OPA decides with (None, None: no bundle loaded, or
    unreachable)."""
    answer = _get_json(f"{point.opa_http.url}/v1/data/complyroute/revision")
    digest = _get_json(f"{point.opa_http.url}/v1/data/{configuration.TABLE_DIGEST_PATH}")
    return (answer or {}).get("result"), (digest or {}).get("result")


# OPA's count of the bundles it refused, by its reason (the status plugin's Prometheus metrics,
# proxy/opa.py bundle_config): a signature that does not verify, a bundle without one.
REFUSED_BUNDLES = re.compile(r'^bundle_failed_load_counter\{(?P<labels>.*)\} (?P<count>\S+)$', re.MULTILINE)
MESSAGE_LABEL = re.compile(r'message="((?:[^"\\]|\\.)*)"')


def bundle_refusals(point: EnforcementPoint) -> dict[str, float]:
    """How often the point's OPA refused a bundle, by OPA's reason ({} without an OPA, or unreachable)."""
    if not point.deciding:
        return {}
    try:
        status, body = localhttp.request(point.opa_metrics_url, timeout=2)
    except OSError:
        return {}
    if status != 200:
        return {}
    refusals = {}
    for match in REFUSED_BUNDLES.finditer(body.decode(errors="replace")):
        reason = MESSAGE_LABEL.search(match["labels"])
        # Prometheus's text format escapes a label value's quotes and backslashes.
        refusals[reason[1].replace('\\"', '"').replace("\\\\", "\\") if reason else "(no reason given)"] = float(match["count"])
    return refusals


def envoy_revisions(point: EnforcementPoint) -> set[str]:
    """The versions of the route configurations the point's Envoy serves: each listener's
    http.<listener>.rds.<route configuration>.version_text (the config dump keeps the version
    a configuration was last loaded with while its content stays the same)."""
    query = urllib.parse.urlencode({"filter": r"\.rds\..*\.version_text$", "format": "json"})
    answer = _get_json(f"{point.admin.url}/stats?{query}")
    if answer is None or "stats" not in answer:
        return set()
    return {stat["value"] for stat in answer["stats"] if "value" in stat}


def taken(point: EnforcementPoint, versions: Versions) -> bool:
    """Whether the point runs `versions`: its Envoy's routes, its OPA's revision and table."""
    if versions.routes is not None and envoy_revisions(point) != {versions.routes}:
        return False
    return versions.revision is None or opa_state(point) == (versions.revision, versions.table_digest)


@dataclass
class Running:
    """The bundles and route files the points run before a reload: what a refused second step
    gives them back."""

    bundles: dict[Path, bytes]
    routes: dict[str, dict[str, str]]  # point -> route file -> content
    expected: dict[str, Versions]

    @classmethod
    def of(cls, run_dir: Path, points: list[EnforcementPoint]) -> Running:
        bundles_now = {path: path.read_bytes() for path in (run_dir / rendering.BUNDLES).glob("*.tar.gz")}
        routes, expected = {}, {}
        for point in points:
            folder = run_dir / "points" / point.name / rendering.ROUTES
            routes[point.name] = {path.name: path.read_text() for path in folder.glob("*") if not path.name.startswith(".")}
            versions = {json.loads(content)["version_info"] for content in routes[point.name].values()}
            bundle = bundles_now.get(run_dir / rendering.BUNDLES / bundles.bundle_name(point.name))
            revision, digest = configuration.bundle_versions(bundle) if bundle is not None else (None, None)
            expected[point.name] = Versions(revision, digest, versions.pop() if len(versions) == 1 else None)
        return cls(bundles_now, routes, expected)

    def restore(self, run_dir: Path) -> None:
        for path, content in self.bundles.items():
            write_whole(path, content)
        for point, routes in self.routes.items():
            write_folder(run_dir / "points" / point / rendering.ROUTES, routes)


def write_step(run_dir: Path, generated: Configuration) -> None:
    """Write every point's bundle and route files (what a step of the reload gives the points)."""
    bundles.write(run_dir / rendering.BUNDLES, generated.bundles, generated.revision, archive=run_dir / bundles.REVISIONS)
    for name, point in generated.points.items():
        write_folder(run_dir / "points" / name / rendering.ROUTES, point.routes)


class Refusals:
    """The bundles the points' OPAs refuse during a step: a point whose OPA counts a refusal it did
    not count before the step's bundles were written (`before`, bundle_refusals) has refused its
    bundle, and keeps deciding with the last one it verified."""

    LOOK_EVERY = 0.5  # s between two reads of a point's metrics: polling them as fast as the revision would load the machine

    def __init__(self, points: list[EnforcementPoint]):
        with ThreadPoolExecutor(max_workers=8) as pool:
            self.before = dict(zip((point.name for point in points), pool.map(bundle_refusals, points)))
        self.refused: dict[str, str] = {}  # point -> OPA's reason
        self.looked: dict[str, float] = {}

    def refused_now(self, point: EnforcementPoint) -> bool:
        if time.monotonic() - self.looked.get(point.name, 0.0) < self.LOOK_EVERY:
            return False
        self.looked[point.name] = time.monotonic()
        before = self.before.get(point.name, {})
        new = [reason for reason, count in bundle_refusals(point).items() if count > before.get(reason, 0)]
        if new:
            self.refused[point.name] = "; ".join(new)
        return bool(new)

    def error(self, revision: str, running: str) -> ReloadError:
        refused = "; ".join(f"{name}: {reason}" for name, reason in sorted(self.refused.items()))
        return ReloadError(f"the OPA of {', '.join(sorted(self.refused))} refused the bundle of revision {revision} and keeps deciding "
                           f"with the last one it verified ({running}); every other point took it. OPA's reasons: {refused}. "
                           "A bundle the control plane wrote is signed with the deployment's key: one that does not verify was "
                           "altered, or replaced, after it was written")


def wait_for(points: list[EnforcementPoint], expected: dict[str, Versions], started: float, timeout: float,
             refusals: Refusals | None = None) -> dict[str, float | None]:
    """Seconds from `started` until each point has taken what `expected` says (None: not within
    `timeout`); with `refusals`, a point whose OPA refuses its bundle is waited for no longer (None)."""
    def taken_or_refused(point: EnforcementPoint) -> bool:
        return taken(point, expected[point.name]) or (refusals is not None and refusals.refused_now(point))

    seconds = polling.until({point.name: functools.partial(taken_or_refused, point) for point in points}, started, timeout)
    return {name: None if refusals is not None and name in refusals.refused else when for name, when in seconds.items()}


def behind(seconds: dict[str, float | None]) -> list[str]:
    return sorted(name for name, taken in seconds.items() if taken is None)


NOTHING_DEPLOYED = ("nothing is deployed here: `make deploy` first (a deployment on Kubernetes takes a new rule set by "
                    "`make reload-policy target=k8s topology=<t>`)")


def deployed_rule_set() -> str:
    """The rule set the running deployment was deployed with, as it was chosen (its record)."""
    state = deployment.running()
    if not state:
        raise ReloadError(NOTHING_DEPLOYED)
    return rendering.deployed_record(Path(state["run_dir"])).rule_set


def reload_policy(rule_set: RuleSet, out=sys.stdout, timeout: float = 120.0) -> dict:
    """Apply `rule_set` to the current deployment, in the two steps above; returns once every enforcement
    point decides with its revision and holds its precomputed answers, and every deciding listener
    has decided a warm-up record with it (warmup.py): {"revision", "seconds"
    (from the call until the last point decided with the new revision), "written_seconds" (of
    which writing the first step), "precomputed_seconds" (until the last point held its
    precomputed answers), "warm_up" (warmup.wait: the seconds after that until every listener
    decided its warm-up record, and each one's record id), "points": {point: seconds}, and when
    the labels changed "labels": the seconds of each label step (labelchange.py)}."""
    started = time.monotonic()
    state = deployment.running()
    if not state:
        raise ReloadError(NOTHING_DEPLOYED)
    run_dir = Path(state["run_dir"])
    deployed = rendering.deployed_record(run_dir)
    policies, schema, revision = rule_set.folder, rule_set.schema, rule_set.revision
    plan = deployed.plan
    engine = plan.topology.engine
    layout = rendering.layout(run_dir / "points")
    signing_key = (run_dir / rendering.BUNDLE_SIGNING_KEY).read_bytes()  # the deployment's (rendering.render)
    try:
        labelchange.check(run_dir, deployed, schema)
    except labelchange.LabelChangeError as error:
        raise ReloadError(f"the rule set in {policies} {error}") from None
    configure_errors = (engines.EngineError, policydata.PolicyDataError, bundles.BundleError, rendering.BootstrapChanged)
    # The Envoys keep the clusters they were deployed with: the rules route to those sets only
    # (a set without one goes to its first instance; a deploy makes a cluster for every set).

    # Step 1: the rule set, every hop decided in full; labels it adds reach the services and listeners first.
    try:
        in_full = configuration.generate(plan.points, engine, rule_set, deployed.point_trust, layout, signing_key, deployed.set_clusters,
                                         ahead=False)
        rendering.check_bootstraps(run_dir, in_full)
        label_seconds = labelchange.apply(state, deployed, in_full, out)
    except (*configure_errors, labelchange.LabelChangeError) as error:
        raise ReloadError(f"the rule set in {policies} cannot be applied; nothing was changed: {error}") from None
    if label_seconds:  # what the services and listeners run now, whatever becomes of the rules
        deployed = deployed.reloaded(deployed.revision, schema)
        deployed.write(run_dir / rendering.DEPLOYED)
    running = Running.of(run_dir, plan.points)
    refusals = Refusals(plan.points)
    write_step(run_dir, in_full)
    written = time.monotonic() - started
    print(f"reload-policy: revision {revision} written for {len(plan.points)} enforcement points in {written:.2f} s", file=out)
    seconds = wait_for(plan.points, in_full.versions, started, timeout, refusals)
    if refusals.refused:
        raise refusals.error(revision, deployed.revision)
    if late := behind(seconds):
        raise ReloadError(f"after {timeout:.0f} s these points do not decide with revision {revision} yet: {', '.join(late)} "
                          f"(their logs are in {run_dir / 'logs'})")
    propagated = max(seconds.values())
    print(f"reload-policy: every enforcement point decides with {revision} after {propagated:.3f} s "
          f"(slowest: {max(seconds, key=seconds.get)}); each hop is decided in full until its precomputed answers follow", file=out)

    # Step 2: the rule set's answers over the decision space, guarded, then the tables and routes holding them.
    try:
        ahead = configuration.generate(plan.points, engine, rule_set, deployed.point_trust, layout, signing_key, deployed.set_clusters,
                                       routes_version=f"{revision}+precomputed")
        rendering.check_bootstraps(run_dir, ahead)
    except configure_errors as error:
        running.restore(run_dir)
        back = wait_for(plan.points, running.expected, time.monotonic(), timeout)
        again = f"decides with revision {deployed.revision} again" if not behind(back) else f"is being given revision {deployed.revision} back"
        raise ReloadError(f"the rule set in {policies} was taken back after {time.monotonic() - started:.1f} s (it decided every hop "
                          f"in full meanwhile) and the deployment {again}: {error}") from None
    refusals = Refusals(plan.points)
    write_step(run_dir, ahead)
    done = wait_for(plan.points, ahead.versions, started, timeout, refusals)
    if refusals.refused:
        raise refusals.error(revision, f"revision {revision}, decided in full")
    if late := behind(done):
        raise ReloadError(f"after {timeout:.0f} s these points decide with revision {revision} in full but do not hold its "
                          f"precomputed answers yet: {', '.join(late)} (their logs are in {run_dir / 'logs'})")
    # Holding the rules is not yet deciding with them: each OPA prepares its query again on the
    # first decision after it activates a bundle (warmup.py).
    try:
        warm_up = warmup.wait(warmup.listeners(plan, deployed.point_trust, run_dir), warmup.token_key(run_dir, plan), revision,
                              timeout, deployment.point_logs(state))
    except warmup.WarmUpError as error:
        raise ReloadError(f"every point holds revision {revision}, but {error}") from None
    try:
        label_seconds |= labelchange.finish(state, schema, out)
    except labelchange.LabelChangeError as error:
        raise ReloadError(f"every point decides with revision {revision}, but {error}: those services do not require the new "
                          "required labels yet (the rules do); `make reload-policy` again, or deploy again") from None
    result = {"revision": revision, "seconds": round(propagated, 3), "written_seconds": round(written, 3),
              "precomputed_seconds": round(max(done.values()), 3), "warm_up": warm_up,
              "points": {name: round(taken, 3) for name, taken in seconds.items()},
              **({"labels": label_seconds} if label_seconds else {})}
    with (run_dir / "reloads.jsonl").open("a") as log:
        log.write(json.dumps({"at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "policies": str(policies), **result}) + "\n")
    deployed.reloaded(revision, schema).write(run_dir / rendering.DEPLOYED)
    deployment.write_state(run_dir, {**deployment.read_state(run_dir), "revision": revision})
    print(f"reload-policy: every enforcement point holds the precomputed answers of {revision} after "
          f"{result['precomputed_seconds']:.3f} s; every deciding listener decided a warm-up record with it "
          f"{warm_up['seconds']:.3f} s later", file=out)
    return result


def watch(policies: str | Path | None = None, interval: float = 0.5, out=sys.stdout, stop: threading.Event | None = None) -> None:
    """Reload whenever the rule set's files change and then hold still for `interval` (until
    interrupted, or `stop` is set); a rule set that cannot be applied is reported and the
    deployment keeps the one it has. `policies`:
    the rule set as chosen (None: the deployment's); its source folder is watched, and made into
    a RuleSet again at every change, whose revision is its content's."""
    if policies is None:
        policies = deployed_rule_set() if deployment.running() else "policies"
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
        # A save need not be one write (an editor truncates, then writes): the folder is read
        # once it has held still for an interval, never a file caught half-written.
        if stop.wait(interval) or content() != now:
            continue
        seen = now
        try:
            reload_policy(RuleSet.of(policies), out=out)
        except labels.LabelSchemaError as error:
            print(f"watch-policy: the rule set in {policies} cannot be applied; nothing was changed: {error}", file=out)
        except (ReloadError, policyfiles.RuleSetError) as error:
            print(f"watch-policy: {error}", file=out)
