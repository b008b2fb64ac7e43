"""What a run measures: its parameters, the profiles that preset them, and the cells they span."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields

from complyroute import manifest

from .mixes import MIXES

# The paper's order (Table I), then the reference without enforcement.
TOPOLOGIES = ("central-entity", "dynamic-router-3", "dynamic-router-6", "sidecar", "baseline")
PAPER_NAMES = {"central-entity": "CE", "dynamic-router-3": "DR_3", "dynamic-router-6": "DR_6", "sidecar": "SA", "baseline": "baseline"}
BASELINE = "baseline"

PROFILES = {
    # The paper's matrix (III-e, III-f): 5 topologies x 3 rates x 4 service counts x 5 repetitions.
    # The paper does not say how long a case ran; a minute after a 10 s warm-up gives
    # 6,000 to 60,000 requests per cell at the target rate.
    "paper": {
        "topologies": list(TOPOLOGIES), "rates": [100, 500, 1000], "services": [5, 10, 25, 50],
        "repetitions": 5, "duration": 60, "warmup": 10,
    },
    # `make experiment`: every topology, the two lower rates and the two smaller chains, once.
    "quick": {
        "topologies": list(TOPOLOGIES), "rates": [100, 500], "services": [5, 10],
        "repetitions": 1, "duration": 20, "warmup": 5,
    },
}
DEFAULT_PROFILE = "paper"
DEFAULT_MIX = "allowed"
# Requests per second one Locust user sends at most; users = rate / this. Each user waits
# for its answer, so up to 1/USER_RATE s (100 ms) of RTT the target rate is kept.
DEFAULT_USER_RATE = 10.0

# Saturation: a cell that got less than this share of its target rate, or more errors.
MIN_ACHIEVED_SHARE = 0.95
MAX_ERROR_RATE = 0.01


class ParameterError(ValueError):
    """Parameters that cannot be run; the message says which and what is allowed."""


def topology_name(name: str) -> str:
    """The manifest name of a topology given by name or alias (ce, dr3, dr6, sa)."""
    canonical = manifest.ALIASES.get(name, name)
    if canonical not in TOPOLOGIES:
        raise ParameterError(f"topology '{name}' is not one of {list(TOPOLOGIES)} or an alias {sorted(manifest.ALIASES)}")
    return canonical


@dataclass(frozen=True)
class Cell:
    """One deployment under one load: what a result folder raw/<key>/ holds."""

    topology: str
    rate: int
    services: int
    repetition: int

    @property
    def key(self) -> str:
        return f"{self.topology}_r{self.rate}_n{self.services}_rep{self.repetition}"

    @property
    def label(self) -> str:
        return f"{PAPER_NAMES[self.topology]} {self.rate} req/s {self.services} services rep {self.repetition}"


@dataclass
class Parameters:
    profile: str
    topologies: list[str]
    rates: list[int]
    services: list[int]
    repetitions: int
    duration: int  # seconds measured, after the warm-up
    warmup: int  # seconds left out of the statistics
    mix: str = DEFAULT_MIX
    user_rate: float = DEFAULT_USER_RATE

    def __post_init__(self):
        self.topologies = [topology_name(t) for t in self.topologies]
        if len(set(self.topologies)) != len(self.topologies):
            raise ParameterError(f"topologies {self.topologies} name one twice")
        for name in ("rates", "services"):
            values = getattr(self, name)
            if not values or any(v < 1 for v in values):
                raise ParameterError(f"{name} must be whole numbers >= 1, got {values}")
        if self.repetitions < 1 or self.duration < 1 or self.warmup < 0 or self.user_rate <= 0:
            raise ParameterError("repetitions and duration must be >= 1, warmup >= 0, user rate > 0")
        if self.mix not in MIXES:
            raise ParameterError(f"mix '{self.mix}' is not one of {sorted(MIXES)}")

    def cells(self) -> list[Cell]:
        """Repetitions outermost, so a stopped run has whole repetitions; the baseline of a
        rate and chain length is measured right beside the topologies it is compared with."""
        return [
            Cell(topology, rate, services, repetition)
            for repetition in range(1, self.repetitions + 1)
            for services in self.services
            for rate in self.rates
            for topology in self.topologies
        ]

    def users(self, rate: int) -> int:
        return max(1, math.ceil(rate / self.user_rate))

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> "Parameters":
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})


def resolve(profile: str | None, **given) -> Parameters:
    """The profile's parameters with every explicitly given one (not None) replacing its own."""
    name = profile or DEFAULT_PROFILE
    if name not in PROFILES:
        raise ParameterError(f"profile '{name}' is not one of {sorted(PROFILES)}")
    chosen = {"mix": DEFAULT_MIX, "user_rate": DEFAULT_USER_RATE, **PROFILES[name]}
    chosen.update({key: value for key, value in given.items() if value is not None})
    return Parameters(profile=name, **chosen)


def conflicts(stored: Parameters, **given) -> list[str]:
    """The explicitly given parameters that differ from a run's own (resuming keeps its own)."""
    stored_values = stored.to_json()
    differing = []
    for key, value in given.items():
        if value is None:
            continue
        if key == "topologies":
            value = [topology_name(t) for t in value]
        if value != stored_values[key]:
            differing.append(f"--{key.replace('_', '-')} {value} (the run has {stored_values[key]})")
    return differing
