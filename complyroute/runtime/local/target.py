"""Processes on this machine as a Target (complyroute/runtime/target.py): one deployment at a
time, every part under one supervisord (deployment.py), a new rule set written into its run
folder (reload.py), its evidence in that run folder under runs/."""

from __future__ import annotations

from pathlib import Path

from complyroute.policy.ruleset import RuleSet
from complyroute.runtime.local import deployment, reload, supervision
from complyroute.runtime.target import DeployFailed, Probe, TargetBusy, TargetError
from complyroute.topology.manifest import Topology

RELOAD_TIMEOUT_S = 120.0  # how long reload-policy waits, unless told, for every point to decide with the new rule set
# What a local deployment is, for an option of the other target or a --topology.
ONE_DEPLOYMENT = "a local deployment is the one running on this machine (`status` names it)"


class LocalTarget:
    """Processes on this machine, supervised, one deployment at a time."""

    name = "local"
    runs_here = True
    port_forwarded = False
    OPTIONS = {"restart": ("--no-restart", "on Kubernetes the kubelet restarts containers"),
               "reload_timeout": ("--timeout", "a reload on Kubernetes updates ConfigMaps and does not wait for the points")}

    def __init__(self, restart: bool = True, reload_timeout: float = RELOAD_TIMEOUT_S):
        self.restart = restart  # False: a part that dies stays down (supervisord still runs and stops them all)
        self.reload_timeout = reload_timeout
        self.deploying = False  # from deploy's start on, whatever is deployed is this target's
        self.run_dir: str | None = None
        self.entry_url: str | None = None
        self.parts: list[tuple[int, str]] = []  # (pid, kind)

    def describe(self) -> dict:
        return {"target": self.name, "where": "processes on this machine (supervisord), entry on loopback"}

    def check_free(self, topology: Topology | None) -> None:
        running = deployment.running()
        if running:
            raise TargetBusy(f"another deployment is running ({running['topology']}, run folder {running['run_dir']}); "
                             "stop it (`make undeploy`)")

    def deploy(self, topology: Topology, rule_set: RuleSet, out=None) -> dict:
        self.deploying = True
        try:
            state = deployment.deploy(topology, rule_set, out=out, restart=self.restart)
        except supervision.DeploymentError as error:
            raise DeployFailed(str(error)) from None
        self.run_dir = state["run_dir"]
        self.entry_url = state["entry_url"]
        self.parts = [(part["pid"], part["kind"]) for part in state["parts"]]
        self.deploying = False
        return {"engine": state["engine"], "parts": len(state["parts"]), "bring_up_seconds": state["bring_up_seconds"],
                "memory_mib": state["memory_mib"], "cpu_parts": self.parts, "run_dir": state["run_dir"]}

    def reach(self, topology: Topology, probe: Probe, out=None) -> dict:
        """The entry on loopback: deploy returned once every part answered its health check, and
        no address is left to program between them, so the probe is not sent."""
        return {"entry_url": self.entry_url}

    def undeploy(self, out=None) -> None:
        state = deployment.read_state()
        if state and (self.deploying or state["run_dir"] == self.run_dir):
            deployment.stop(out=out)
        self.deploying = False

    def left_over(self) -> list[int]:
        # By the run folder, not by the parts' pids at deploy: a part restarted since has another
        # pid, and its first may now be any process's.
        return deployment.processes_using(self.run_dir) if self.run_dir else []

    @staticmethod
    def refuse_topology(topology: Topology | None) -> None:
        if topology is not None:
            raise TargetError(f"--topology applies to --target k8s only (one of the topologies deployed to the kubectl context): "
                              f"{ONE_DEPLOYMENT}")

    def status(self, topology: Topology | None, out=None) -> int:
        self.refuse_topology(topology)
        return deployment.status(out=out)

    def deployed_rule_set(self, topology: Topology | None) -> str:
        self.refuse_topology(topology)
        return reload.deployed_rule_set()

    def reload_policy(self, topology: Topology | None, rule_set: RuleSet, out=None) -> dict:
        """The running deployment's rule set replaced by `rule_set`; returns once every point
        decides with it (reload.py)."""
        self.refuse_topology(topology)
        return reload.reload_policy(rule_set, out=out, timeout=self.reload_timeout)

    def undeploy_all(self, out=None) -> int:
        deployment.stop(out=out)
        return 0

    def run_folders(self, verb: str) -> Path:
        return deployment.runs_root()
