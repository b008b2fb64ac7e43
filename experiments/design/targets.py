"""Where an experiment's cells deploy, as the experiments use and report it. The Target itself is
the runtime's (complyroute/runtime/target.py: processes on this machine, as `make deploy`, or the
current kubectl context, as `make deploy target=k8s`); the runner, the capacity search and the
soak ask it to deploy a topology, to reach its entry, to undeploy it, and to say where it ran.
What is the experiments' own is here: the target made from their command line, the record a
cell's entry must pass before it is loaded, what the reports cannot show on a target, and how
they say where a run ran.

What a target can measure differs: on Kubernetes the parts are pods, not processes of this
machine, so their CPU time and memory are not sampled; and their entry is reached through
`kubectl port-forward` (the API server and the kubelet carry every request) unless --entry-url
names an address of the cluster's that this machine reaches.
"""

from __future__ import annotations

import time

from complyroute.client import send
from complyroute.runtime import targets
from complyroute.runtime.target import Probe, Target

from experiments.load.mixes import ALLOWED_LABELS, BODY


def make(name: str, one_node: bool = False, entry_url: str | None = None) -> Target:
    """The target the command line names; options that belong to the other target are refused.
    A k8s target asks its context once here, so a cluster that does not answer stops the
    command before any cell."""
    target = targets.make(name, **{keyword: value for keyword, value in (("one_node", one_node), ("entry_url", entry_url)) if value})
    target.describe()
    return target


def chain_probe(services: int) -> Probe:
    """One allowed record to a cell's entry: passed once it went through all `services`."""
    def probe(entry_url: str) -> str | None:
        answer = send(entry_url, ALLOWED_LABELS, BODY, request_id=f"path-check-{time.monotonic_ns()}", timeout=10)
        return None if answer.status == 200 and answer.body and len(answer.body["path"]) == services else answer.summary()
    return probe


def unmeasured(target: Target) -> list[str]:
    """What the reports cannot show on this target, one sentence each."""
    found = []
    if not target.runs_here:
        found.append("the deployment's CPU time and memory, by part or in total: its parts are pods of the cluster, not processes "
                     "of this machine (the CPU columns of the deployment are empty; machine and Locust CPU are this machine's)")
    if target.port_forwarded:
        found.append("latency and rate without kubectl port-forward: every record goes through the API server and the "
                     "node's kubelet to reach the entry, which adds to the RTT and caps the rate this machine can send")
    return found


def where_text(described: dict | None) -> str:
    """Where a run ran, as its reports say it: metadata.json's "target" (a run recorded before
    targets existed ran locally)."""
    if not described or described["target"] == "local":
        return "Target: **local** (processes on this machine, supervised; entry on loopback)."
    return (f"Target: **k8s**: kubectl context `{described['context']}`, API server {described['server']}, nodes "
            f"{', '.join(described['nodes'])} (deployed to {', '.join(described['deploys_to'])}"
            f"{', rendered for one node' if described['one_node'] else ''}); entry: {described['entry']}; "
            f"service image {described['image']}.")


def unmeasured_text(unmeasured: list[str] | None) -> str | None:
    """What the target could not measure, as the reports say it; None when everything was."""
    return f"Not measured on this target: {'; '.join(unmeasured)}." if unmeasured else None


def run_paragraphs(meta: dict) -> list[str]:
    """Where a run's cells deployed and what that target could not measure: the paragraphs the
    run's report and the capacity report both give under their parameters."""
    unmeasured = unmeasured_text(meta.get("unmeasured"))
    return [where_text(meta.get("target"))] + ([unmeasured] if unmeasured else [])
