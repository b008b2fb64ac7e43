"""The targets by the name `--target` gives them (the Target interface: target.py), and the one
a command line makes, with the options it gave."""

from __future__ import annotations

from complyroute.runtime.kubernetes.target import KubernetesTarget
from complyroute.runtime.local.target import LocalTarget
from complyroute.runtime.target import Target, TargetError

TARGETS = {"local": LocalTarget, "k8s": KubernetesTarget}
DEFAULT = "local"


def make(name: str, **given) -> Target:
    """The target `name`, built with the options given (each by its keyword, only when the command
    line gave it); an option only the other target takes is refused, saying where it applies."""
    if name not in TARGETS:
        raise TargetError(f"--target {name!r}: use local (processes on this machine) or k8s (the current kubectl context)")
    kind = TARGETS[name]
    foreign = {keyword: (other, *other_kind.OPTIONS[keyword]) for keyword in given if keyword not in kind.OPTIONS
               for other, other_kind in TARGETS.items() if keyword in other_kind.OPTIONS}
    if foreign:
        flags = " and ".join(flag for _, flag, _ in foreign.values())
        where = sorted({other for other, _, _ in foreign.values()})
        reasons = "; ".join(dict.fromkeys(why for _, _, why in foreign.values()))
        raise TargetError(f"{flags} {'apply' if len(foreign) > 1 else 'applies'} to --target {' and '.join(where)} only: {reasons}")
    return kind(**given)
