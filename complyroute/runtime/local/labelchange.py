"""A rule set's labels, added to a running local deployment by `make reload-policy` (reload.py),
restarting nothing.

The label schema reaches three kinds of part outside OPA's bundle, each of which takes it from a
file of the run folder: every service (its labels file, `labels.json`, named by
COMPLYROUTE_LABELS_FILE: read again on SIGHUP, its digest reported on GET /health), every
point's Envoy with deciding listeners (its listeners file, LDS from the filesystem:
envoy.split_listeners; the label bound and the label token's claims), and the run's own record
(deployed.pickle, which trace and the audit read). A reload that adds labels gives them to the
services, then the listeners, before any bundle whose rules read them (apply), and has the
services require those the schema requires only once every point holds those rules (finish):
no record is refused by a service for a label the rules it passed did not ask for, and no rule
reads a label a service would not send on. Removing a label or moving it to another header is
refused (check): records in flight carry it, and rules in force read it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path

from complyroute.engines.configuration import Configuration
from complyroute.files import write_folder
from complyroute.policy import labels
from complyroute.proxy.envoy import LISTENERS_FILE
from complyroute.runtime.deployed import Deployed
from complyroute.runtime.local import deployment, polling, rendering, supervision
from complyroute.topology import localhttp
from complyroute.topology.plan import EnforcementPoint

TIMEOUT = 60.0  # s a step may take before what it wrote is put back


class LabelChangeError(RuntimeError):
    """A label change refused before anything was written, or one that did not take (what was
    written was put back); the message says what to do."""


def check(run_dir: Path, deployed: Deployed, schema: tuple[labels.Label, ...]) -> None:
    """Refuse, before anything is written, a change of the labels a reload cannot apply: one that
    removes a label or gives one another header (a service would stop sending on, and a listener
    stop bounding, a header that records in flight carry and rules in force read), or any change
    to a deployment whose listeners are not read from files (started before they were)."""
    if schema == deployed.schema:
        return
    given = {label.name: label for label in deployed.schema}
    removed = sorted(set(given) - {label.name for label in schema})
    moved = sorted(label.name for label in schema if label.name in given and label.header != given[label.name].header)
    unsafe = []
    if removed:
        unsafe.append(f"removes {', '.join(removed)}")
    if moved:
        unsafe.append(f"changes the header of {', '.join(moved)}")
    if unsafe:
        raise LabelChangeError(f"{' and '.join(unsafe)}: a reload adds labels (or changes what the rules know of one), it does not "
                               "take one away or move it; nothing was changed, deploy again to apply it")
    static = [point.name for point in deployed.points if point.deciding
              and not (run_dir / "points" / point.name / rendering.LISTENERS / LISTENERS_FILE).exists()]
    if static:
        raise LabelChangeError(f"changes the labels, and the Envoys of {', '.join(static)} were started with their listeners "
                               "in their bootstrap (before listeners were read from files): nothing was changed, deploy again")


def _setting(schema: tuple[labels.Label, ...], deployed: tuple[labels.Label, ...]) -> str:
    """The services' label setting on the way to `schema`: every label of it, required only when
    the deployed labels required it already."""
    required = {label.name for label in deployed if label.required}
    return labels.service_setting(tuple(dataclasses.replace(label, required=label.required and label.name in required) for label in schema))


def _wait(checks: dict[str, Callable[[], bool]], timeout: float, what: str) -> float:
    """Poll every check until each passes; the seconds the slowest took. LabelChangeError naming
    those still behind at `timeout`."""
    seconds = polling.until(checks, time.monotonic(), timeout)
    behind = sorted(name for name, taken in seconds.items() if taken is None)
    if behind:
        raise LabelChangeError(f"after {timeout:.0f} s these parts do not {what}: {', '.join(behind)}")
    return max(seconds.values(), default=0.0)


def _give_services(state: dict, setting: str, timeout: float) -> float:
    """Write the services' label setting, have each read it (SIGHUP through supervisord) and wait
    until each reports it; the seconds it took (0 when the setting is the one in effect)."""
    if not rendering.write_label_setting(Path(state["run_dir"]), setting):
        return 0.0
    digest = "sha256:" + hashlib.sha256(setting.encode()).hexdigest()
    services = [part for part in state["parts"] if part["kind"] == "service"]
    for part in services:
        deployment.signal_part(part["name"], "HUP", state)
    return _wait({part["name"]: lambda part=part: (supervision.health_answer(part["health_url"], tls=part.get("health_tls")) or {})
                  .get("labels") == digest for part in services}, timeout, "report the new label setting (their logs are in "
                 f"{Path(state['run_dir']) / 'logs'})")


def envoy_listeners_version(point: EnforcementPoint) -> str | None:
    """The version of the listeners file the point's Envoy serves (listener_manager.lds.version_text),
    once no listener of it is still warming; None before."""
    query = urllib.parse.urlencode({"filter": r"^listener_manager\.(lds\.version_text|total_listeners_warming)$", "format": "json"})
    try:
        status, body = localhttp.request(f"{point.admin.url}/stats?{query}", timeout=2)
        answer = json.loads(body) if status == 200 else {}
    except (OSError, ValueError):
        answer = {}
    stats = {stat["name"]: stat.get("value") for stat in answer.get("stats", [])}
    return stats.get("listener_manager.lds.version_text") if stats.get("listener_manager.total_listeners_warming") == 0 else None


def apply(state: dict, deployed: Deployed, generated: Configuration, out, timeout: float = TIMEOUT) -> dict[str, float]:
    """Have the labels the generated configuration's schema adds (check allowed it) reach the running parts
    before any rule reads them: the services first (each sends on and logs the new labels; none
    requires one yet: finish), then every point's listeners (label bound and token
    claims: their files rewritten, Envoy updates them in place). Waits until each part reports
    the new setting; the seconds each step took ({} when the labels are those deployed). On a
    step that does not take, what was written is put back and LabelChangeError says so."""
    schema = generated.schema
    if schema == deployed.schema:
        return {}
    run_dir = Path(state["run_dir"])
    listeners = {}  # point -> (its folder, its listener files, their version)
    for point in deployed.points:
        folder = run_dir / "points" / point.name
        configured = generated.points[point.name]  # its bootstrap is the running one: reload.py checked (rendering.check_bootstraps)
        if configured.listeners:
            listeners[point.name] = (folder / rendering.LISTENERS, configured.listeners, configured.listeners_version)
    before_setting = (run_dir / rendering.LABEL_SETTING).read_text()
    before_listeners = {name: {file: (folder / file).read_text() for file in files} for name, (folder, files, _) in listeners.items()}
    seconds = {}
    try:
        seconds["services"] = round(_give_services(state, _setting(schema, deployed.schema), timeout), 3)
        points = {point.name: point for point in deployed.points}
        for folder, files, _ in listeners.values():
            write_folder(folder, files)
        seconds["listeners"] = round(_wait({name: lambda name=name, version=version: envoy_listeners_version(points[name]) == version
                                            for name, (_, _, version) in listeners.items()}, timeout,
                                           f"serve the new listeners (their logs are in {run_dir / 'logs'})"), 3)
    except LabelChangeError as error:
        for name, files in before_listeners.items():
            write_folder(listeners[name][0], files)
        try:
            _give_services(state, before_setting, timeout)
        except LabelChangeError as back:
            raise LabelChangeError(f"{error}; the labels the deployment had were written back, but {back}") from None
        raise LabelChangeError(f"{error}; the labels the deployment had were written back") from None
    added = sorted({label.name for label in schema} - {label.name for label in deployed.schema})
    print(f"reload-policy: labels {', '.join(added) or '(changed)'}: taken by {sum(p['kind'] == 'service' for p in state['parts'])} services "
          f"in {seconds['services']:.2f} s, by the listeners of {len(listeners)} points in {seconds['listeners']:.2f} s", file=out)
    return seconds


def finish(state: dict, schema: tuple[labels.Label, ...], out, timeout: float = TIMEOUT) -> dict[str, float]:
    """Once every point holds the rules of `schema`: the services require the labels it makes
    required (apply gave new ones as optional). The seconds it took; {} when the
    services' setting is that already."""
    taken = _give_services(state, labels.service_setting(schema), timeout)
    if taken:
        print(f"reload-policy: the services require the labels the schema requires ({', '.join(l.name for l in schema if l.required)}) "
              f"after {taken:.2f} s", file=out)
    return {"services_required": round(taken, 3)} if taken else {}
