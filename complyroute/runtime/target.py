"""Where a plan runs, as one interface (after envoyproxy/gateway's infrastructure Manager): a
Target deploys a topology and waits until it is ready, reaches its entry, tells whether it is
free, shows its parts, applies a new rule set to it, undeploys it, and says where its runs keep
their evidence. Two implement it: processes on this machine (local/target.py, LocalTarget) and
the current kubectl context (kubernetes/target.py, KubernetesTarget); targets.py makes the one
`--target` names. The command line's verbs (deploy, status, reload-policy, undeploy, audit,
trace) and the experiments' cells both ask a Target, so nothing else of theirs differs.

A verb a target cannot do raises Unsupported, an option it does not take TargetError: one line
each, that the command line prints with exit code 2.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Protocol

from complyroute.policy.ruleset import RuleSet
from complyroute.topology.manifest import REPO, Topology


def runs_root() -> Path:
    """Where both targets keep their runs: COMPLYROUTE_RUNS, else the checkout's runs/. Read at
    each call, not once at import: a test (tests/conftest.py) or a second deployment beside the
    first (make test) names another root, and every reader must see the one in force."""
    return Path(os.environ.get("COMPLYROUTE_RUNS") or REPO / "runs")


class TargetError(RuntimeError):
    """A target that cannot be used as asked (an option of the other target, no cluster
    answering, nodes not labelled, a bad entry URL): the command stops, with this message."""


class Unsupported(TargetError):
    """A verb this target cannot do."""

    def __init__(self, verb: str, target: str, why: str):
        super().__init__(f"{verb} --target {target} is not supported: {why}")


class TargetBusy(RuntimeError):
    """Another deployment is where this one would go: an experiment stops rather than fail every cell."""


class ReloadError(RuntimeError):
    """A reload that could not be applied or did not take, on either target; the message says what to do."""


class DeployFailed(RuntimeError):
    """A deployment did not come up (the message says how); an experiment's cell fails, the run goes on."""


# What a deployed topology's entry answers one record, for reach: None once the record passed
# the whole chain, else what was answered (one line).
Probe = Callable[[str], "str | None"]


class Target(Protocol):
    name: str  # "local" or "k8s", as --target, metadata and reports name it
    runs_here: bool  # whether the deployment's parts are processes of this machine (their CPU time and memory can be sampled)
    port_forwarded: bool  # whether records reach the entry through `kubectl port-forward` (the API server and a kubelet carry each)
    # The options of the command line only this target takes: keyword -> (flag, why the other target does not).
    OPTIONS: dict[str, tuple[str, str]]

    def describe(self) -> dict:
        """Where it deploys: {"target": name, ...}; a k8s target asks its context here, and one
        that does not answer is a TargetError."""

    def check_free(self, topology: Topology | None) -> None:
        """Raise TargetBusy when another deployment is where `topology` would go (None: any topology)."""

    def deploy(self, topology: Topology, rule_set: RuleSet, out=None) -> dict:
        """Deploy `topology` with `rule_set` (made once where it was chosen: the command line, an
        experiment's run) and wait until every part is ready; what it runs prints to `out` (an
        open file; None: standard output).
        Returns engine, parts (how many), bring_up_seconds, memory_mib ({"total": MiB or None})
        and cpu_parts ([(pid, kind)] to sample, None when they cannot be). Raises DeployFailed."""

    def reach(self, topology: Topology, probe: Probe, out=None) -> dict:
        """Where this machine posts records to the deployed `topology`, once `probe` (sent there)
        passes its whole chain: {"entry_url": ..., and what the wait took}."""

    def undeploy(self, out=None) -> None:
        """Stop what this target object deployed, if anything (an experiment's cell)."""

    def left_over(self) -> list[int]:
        """Processes of this machine a stopped deployment left running (after undeploy)."""

    def status(self, topology: Topology | None, out=None) -> int:
        """Print the deployed parts (of `topology` only, where several can be deployed); 0 when
        every one is ready, 1 otherwise or when nothing is deployed."""

    def deployed_rule_set(self, topology: Topology | None) -> str:
        """The rule set the deployed `topology` was deployed with, as it was chosen (its record):
        what a reload applies again unless told; ReloadError when nothing is deployed there."""

    def reload_policy(self, topology: Topology | None, rule_set: RuleSet, out=None) -> dict:
        """Apply `rule_set` to the deployed `topology` without restarting anything."""

    def undeploy_all(self, out=None) -> int:
        """Remove every complyroute deployment there (the command line's undeploy); an exit code."""

    def run_folders(self, verb: str) -> Path:
        """The folder of this machine whose run folders hold this target's evidence (audit
        lines, decision logs), which `verb` reads; Unsupported where a deployment keeps it elsewhere."""
