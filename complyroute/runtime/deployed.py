"""The record of what a deploy configured, which a reload configures every point again from, on
either target: the plan, the points as they run, their trust, the rule set as it was chosen, its
revision and labels, and the compliant sets each Envoy has a cluster for (what
configuration.generate needs at a reload, and what it must keep). A deploy writes it, a reload
reads it and writes it again with what it applied. Each target keeps it where it keeps its
deployment: a local one in its run folder (rendering.py), a Kubernetes one in a file per
namespace on this machine (kubernetes/apply.py), beside the bundle signing key either way.

A record that cannot be read (missing, or written by another version of complyroute, whose
classes differ) is refused with what to do: deploy again. So is one that another user owns or
could have written: reading it unpickles it.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
from dataclasses import dataclass
from pathlib import Path

from complyroute.engines.configuration import Configuration
from complyroute.files import write_whole
from complyroute.policy.labels import Label
from complyroute.runtime.target import ReloadError
from complyroute.topology.plan import EnforcementPoint, Plan
from complyroute.trust import identity


@dataclass(frozen=True)
class Deployed:
    plan: Plan
    # The points as they run: locally the plan's; on Kubernetes as their pods run them (a router
    # DaemonSet carries its slot's routers of all nodes).
    points: list[EnforcementPoint]
    # Each point's mutual TLS settings: files its processes or its pod hold, and the label
    # tokens' public key; no private key.
    point_trust: dict[str, identity.PointTrust]
    rule_set: str  # as it was chosen (RuleSet.chosen): what a reload applies again unless told
    revision: str  # the rule set's revision the points decide with (a reload's, once one took)
    schema: tuple[Label, ...]  # the labels the services and listeners were given
    # By deciding point, the compliant sets its Envoy has a cluster for (its bootstrap's, which a
    # reload leaves as it is): the rules route to those sets and no other.
    set_clusters: dict[str, tuple[str, ...]]
    # What a target placed beyond the configuration, which its reload checks (Kubernetes:
    # apply.Applied, the render and its ConfigMaps); None where the run folder is the place.
    placed: object | None = None

    @classmethod
    def of(cls, plan: Plan, points: list[EnforcementPoint], point_trust: dict[str, identity.PointTrust], generated: Configuration,
           placed: object | None = None) -> Deployed:
        """What a deploy of `plan` generated (`generated`: configuration.generate's)."""
        return cls(plan, points, point_trust, generated.rule_set.chosen, generated.revision, generated.schema, generated.set_clusters,
                   placed)

    def reloaded(self, revision: str, schema: tuple[Label, ...] | None = None) -> Deployed:
        """The record once a reload applied `revision` (and `schema`, when it changed the labels)."""
        return dataclasses.replace(self, revision=revision, schema=schema or self.schema)

    def write(self, path: Path) -> None:
        write_whole(path, pickle.dumps(self), 0o600)

    @staticmethod
    def read(path: Path, deploy_again: str) -> Deployed:
        """The record at `path`; ReloadError saying `deploy_again` (the command that deploys it
        again) when it is missing or another version of complyroute wrote it."""
        if not path.exists():
            raise ReloadError(f"{path} is missing: the deployment was not made from here, or before its record was kept; "
                              f"deploy again ({deploy_again}), then reload")
        # Unpickling runs what the file names: a record another user could have written (or replaced)
        # is not read. A deploy writes it 0600, in a run folder of the deployment's user.
        status = path.stat()
        if status.st_uid != os.getuid() or status.st_mode & 0o022:
            raise ReloadError(f"{path} is not this user's own file, writable by no one else (owner uid {status.st_uid}, mode "
                              f"{status.st_mode & 0o777:o}), so it is not read: deploy again ({deploy_again}), then reload")
        try:
            deployed = pickle.loads(path.read_bytes())
        except (pickle.UnpicklingError, AttributeError, ImportError, EOFError, TypeError, ValueError):
            deployed = None
        if not isinstance(deployed, Deployed) or any(not hasattr(deployed, field.name) for field in dataclasses.fields(Deployed)):
            raise ReloadError(f"{path} was written by another version of complyroute and cannot be read: "
                              f"deploy again ({deploy_again}), then reload")
        return deployed
