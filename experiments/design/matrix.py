"""What a run measures: its parameters, the profiles that preset them, and the cells they span."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields

from complyroute.topology import manifest

from complyroute.policy import policyfiles

from experiments.load.mixes import MIXES, policy_of
from experiments.load.openloop import ARRIVALS

# The paper's order (Table I), then the reference without enforcement: as the manifests say
# (their `paper` field), with the names the paper gives them.
TOPOLOGIES = tuple(manifest.paper_topologies())
PAPER_NAMES = manifest.paper_names()
BASELINE = "baseline"
ENFORCING = tuple(t for t in TOPOLOGIES if t != BASELINE)

# How enforcing topologies decide (complyroute/engines/); the baseline decides nothing and has
# none. envoy-opa, Envoy asking OPA over ext_authz before every hop, is the paper's
# architecture and the reference the compiled engine is compared with.
ENGINES = manifest.ENGINES
REFERENCE_ENGINE = "envoy-opa"
COMPILED_ENGINE = "envoy-compiled"
ENGINE_NAMES = {"envoy-opa": "envoy-opa", "envoy-compiled": "compiled"}
# Runs recorded before the experiment ran engines name none: they ran envoy-opa.
ENGINE_OF_OLDER_RUNS = REFERENCE_ENGINE

# Records per part and rounds of `make bench`'s measurement, which a run takes once per
# session before its cells. CPU time is counted in 10 ms clock ticks: a bare Envoy traversal
# (about 0.2 ms) needs about 1000 records a round to be known to a few percent; fewer than
# `make bench`'s 1500 keep it under about two minutes.
BENCH_RECORDS = 1000
BENCH_ROUNDS = 3
BENCH_CSV = "bench.csv"  # in a run's raw/: the latest session's bench
# The bench's rows that price what a deployment adds for its evidence, each against the same
# process without it (the report's Findings quote them): "access log and hop counters (<engine's
# deciding hop>): ...", one row per engine, and the entry's decision log.
BENCH_OBSERVABILITY = "access log and hop counters"
BENCH_DECISION_LOG = "the entry's decision and label token, with its decision log: OPA"

PROFILES = {
    # The paper's matrix (III-e, III-f): 5 topologies x 3 rates x 4 service counts x 5 repetitions.
    # The paper does not say how long a case ran; a minute after a 10 s warm-up gives
    # 6,000 to 60,000 requests per cell at the target rate.
    "paper": {
        "topologies": list(TOPOLOGIES), "engines": list(ENGINES), "rates": [100, 500, 1000], "services": [5, 10, 25, 50],
        "repetitions": 5, "duration": 60, "warmup": 10, "load": "open",
    },
    # `make experiment`: every topology under both engines, the two lower rates and the two
    # smaller chains, once.
    "quick": {
        "topologies": list(TOPOLOGIES), "engines": list(ENGINES), "rates": [100, 500], "services": [5, 10],
        "repetitions": 1, "duration": 20, "warmup": 5, "load": "open",
    },
}
DEFAULT_PROFILE = "paper"
# A fresh deployment is slow twice: in its first seconds of load (cold TLS sessions, connection
# pools, code), and once more about 500 records in, when the services' CPU doubles for a second
# and every record in flight waits 0.4-0.6 s, whatever the rate and the topology, the baseline's
# too (no Node GC pause shows then: likely V8 optimising its hot code, in every service at once).
# So a cell's fresh deployment first carries DEFAULT_PRIME_RECORDS records at the cell's rate, and
# at least PRIME_MIN_SECONDS, kept apart and not judged. A capacity search, whose first rate is a
# guess, primes at PRIME_SHARE of it.
DEFAULT_PRIME_RECORDS = 800
PRIME_MIN_SECONDS = 10
PRIME_SHARE = 0.5
DEFAULT_MIX = "allowed"
# How the load is generated. open: records sent on a schedule whatever the answers, RTT from
# each send's intended time (experiments/load/openloop.py); closed: Locust users that wait for each
# answer before the next send, as the paper's JMeter threads did.
LOADS = ("open", "closed")
DEFAULT_LOAD = "open"
# Runs recorded before the open loop existed ran the closed one.
LOAD_OF_OLDER_RUNS = "closed"
DEFAULT_ARRIVALS = "constant"
# Open loop: unanswered requests at most (one connection each), and how late a send may be.
# Beyond either the send is not made and is counted as missed. The cap keeps a saturated
# cell's queue, and this machine's memory and file descriptors, bounded: 1000 in flight is two
# seconds of backlog at 500 req/s. 100 ms of lateness is a tenth of a second of the sender's
# process not running: beyond it the schedule, not the system, is what failed.
DEFAULT_MAX_IN_FLIGHT = 1000
DEFAULT_LATE_TOLERANCE_MS = 100.0
# Closed loop: requests per second one Locust user sends at most; users = rate / this. Each
# user waits for its answer, so up to 1/USER_RATE s (100 ms) of RTT the target rate is kept.
DEFAULT_USER_RATE = 10.0

# Saturation: a cell that got less than this share of its target rate, or more errors.
MIN_ACHIEVED_SHARE = 0.95
MAX_ERROR_RATE = 0.01
# An open loop keeps its rate past capacity while its queue grows: its cell is saturated, as the capacity
# search judges a step, when the p99 RTT is beyond this.
P99_BOUND_MS = 500.0
# Repetitions: a case that is not saturated whose per-repetition medians have a coefficient
# of variation above this is flagged; its repetitions disagree more than its median says.
MAX_REPETITION_CV = 0.10


class ParameterError(ValueError):
    """Parameters that cannot be run; the message says which and what is allowed."""


def topology_name(name: str) -> str:
    """The manifest name of a topology given by name or alias (ce, dr3, dr6, sa)."""
    aliases = manifest.aliases()
    canonical = aliases.get(name, name)
    if canonical not in TOPOLOGIES:
        raise ParameterError(f"topology '{name}' is not one of {list(TOPOLOGIES)} or an alias {sorted(aliases)}")
    return canonical


def case_name(topology: str, engine: str | None) -> str:
    """What the report calls a topology under an engine: "CE (envoy-opa)", "CE (compiled)", "baseline"."""
    name = PAPER_NAMES.get(topology, topology)
    return f"{name} ({ENGINE_NAMES.get(engine, engine)})" if engine and topology != BASELINE else name


@dataclass(frozen=True)
class Cell:
    """One deployment under one load: what a result folder raw/<key>/ holds."""

    topology: str
    engine: str | None  # None for the baseline, which enforces nothing
    rate: int
    services: int
    repetition: int

    @property
    def key(self) -> str:
        engine = f"_{self.engine}" if self.engine else ""
        return f"{self.topology}{engine}_r{self.rate}_n{self.services}_rep{self.repetition}"

    @property
    def folder_names(self) -> list[str]:
        """Where this cell's results may be: its key, and for envoy-opa also the key runs
        recorded before engines gave it (resuming such a run keeps its finished cells)."""
        names = [self.key]
        if self.engine == ENGINE_OF_OLDER_RUNS:
            names.append(f"{self.topology}_r{self.rate}_n{self.services}_rep{self.repetition}")
        return names

    @property
    def label(self) -> str:
        return f"{case_name(self.topology, self.engine)} {self.rate} req/s {self.services} services rep {self.repetition}"


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
    load: str = DEFAULT_LOAD
    arrivals: str = DEFAULT_ARRIVALS  # open loop only
    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT  # open loop only
    late_tolerance_ms: float = DEFAULT_LATE_TOLERANCE_MS  # open loop only
    user_rate: float = DEFAULT_USER_RATE  # closed loop only
    engines: list[str] = field(default_factory=lambda: list(ENGINES))  # of the enforcing topologies
    bench_records: int = BENCH_RECORDS
    bench_rounds: int = BENCH_ROUNDS
    prime: int = DEFAULT_PRIME_RECORDS  # records at a cell's rate on its fresh deployment before its own; 0: none
    policy: str = "policies"  # the rule set the enforcing topologies decide with (policyfiles.rule_set)

    def __post_init__(self):
        self.topologies = [topology_name(t) for t in self.topologies]
        if len(set(self.topologies)) != len(self.topologies):
            raise ParameterError(f"topologies {self.topologies} name one twice")
        for engine in self.engines:
            if engine not in ENGINES:
                raise ParameterError(f"engine '{engine}' is not one of {list(ENGINES)}")
        if not self.engines or len(set(self.engines)) != len(self.engines):
            raise ParameterError(f"engines {self.engines}: give one or more of {list(ENGINES)}, each once")
        if self.bench_records < 1 or self.bench_rounds < 0:
            raise ParameterError("bench records must be >= 1 and bench rounds >= 0 (0: no bench)")
        for name in ("rates", "services"):
            values = getattr(self, name)
            if not values or any(v < 1 for v in values):
                raise ParameterError(f"{name} must be whole numbers >= 1, got {values}")
        if self.repetitions < 1 or self.duration < 1 or self.warmup < 0 or self.user_rate <= 0:
            raise ParameterError("repetitions and duration must be >= 1, warmup >= 0, user rate > 0")
        if self.mix not in MIXES:
            raise ParameterError(f"mix '{self.mix}' is not one of {sorted(MIXES)}")
        try:
            policyfiles.source_of(self.policy)
        except policyfiles.RuleSetError as error:
            raise ParameterError(str(error)) from None
        if policy_of(self.mix) != self.policy:
            raise ParameterError(f"mix '{self.mix}' is written for the rule set {policy_of(self.mix)}, not {self.policy}: "
                                 f"give --policy {policy_of(self.mix)}, or another mix")
        if self.load not in LOADS:
            raise ParameterError(f"load '{self.load}' is not one of {list(LOADS)}")
        if self.arrivals not in ARRIVALS:
            raise ParameterError(f"arrivals '{self.arrivals}' is not one of {list(ARRIVALS)}")
        if self.max_in_flight < 1 or self.late_tolerance_ms < 0:
            raise ParameterError("max in flight must be >= 1 and late tolerance >= 0 ms")
        if self.prime < 0:
            raise ParameterError(f"prime must be >= 0 records (0: none), got {self.prime}")

    def cells(self) -> list[Cell]:
        """Repetitions outermost, so a stopped run has whole repetitions; the baseline of a
        rate and chain length is measured once, right beside the topologies it is compared
        with, and a topology's engines one after the other, so they are compared on the same
        state of the machine."""
        return [
            Cell(topology, engine, rate, services, repetition)
            for repetition in range(1, self.repetitions + 1)
            for services in self.services
            for rate in self.rates
            for topology in self.topologies
            for engine in ([None] if topology == BASELINE else self.engines)
        ]

    def prime_seconds(self, rate: int) -> int:
        """How long a cell at `rate` is primed: its `prime` records, at least PRIME_MIN_SECONDS; 0 without priming."""
        return max(PRIME_MIN_SECONDS, math.ceil(self.prime / rate)) if self.prime else 0

    def users(self, rate: int) -> int:
        """Locust users of a cell: the open loop's one pacing user, or rate / user_rate in the closed loop."""
        return 1 if self.load == "open" else max(1, math.ceil(rate / self.user_rate))

    @property
    def load_label(self) -> str:
        """The load that produced a run's figures, as the report names it."""
        return load_label(self.load, self.arrivals)

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> "Parameters":
        """A run's parameters from its metadata.json; a run recorded before engines ran envoy-opa
        only, one recorded before the open loop ran the closed loop, and one recorded before
        priming primed no cell."""
        older = {"engines": [ENGINE_OF_OLDER_RUNS], "load": LOAD_OF_OLDER_RUNS, "prime": 0}
        return cls(**{**older, **{f.name: data[f.name] for f in fields(cls) if f.name in data}})


def load_label(load: str, arrivals: str | None) -> str:
    """"open loop, constant arrivals", "open loop, Poisson arrivals" or "closed loop"."""
    if load == "open":
        return f"open loop, {'Poisson' if arrivals == 'poisson' else arrivals} arrivals"
    return "closed loop"


def resolve(profile: str | None, **given) -> Parameters:
    """The profile's parameters with every explicitly given one (not None) replacing its own."""
    name = profile or DEFAULT_PROFILE
    if name not in PROFILES:
        raise ParameterError(f"profile '{name}' is not one of {sorted(PROFILES)}")
    chosen = {"mix": DEFAULT_MIX, "user_rate": DEFAULT_USER_RATE, "arrivals": DEFAULT_ARRIVALS, "max_in_flight": DEFAULT_MAX_IN_FLIGHT,
              "late_tolerance_ms": DEFAULT_LATE_TOLERANCE_MS, "prime": DEFAULT_PRIME_RECORDS, **PROFILES[name]}
    chosen.update({key: value for key, value in given.items() if value is not None})
    return Parameters(profile=name, **chosen)


def conflicts(stored: Parameters, **given) -> list[str]:
    """The explicitly given parameters that differ from a run's own (resuming keeps its own),
    but for more repetitions than the run has: those are added to it (its cells are the same)."""
    stored_values = stored.to_json()
    differing = []
    for key, value in given.items():
        if value is None:
            continue
        if key == "topologies":
            value = [topology_name(t) for t in value]
        if key == "repetitions" and value >= stored_values[key]:
            continue
        if value != stored_values[key]:
            differing.append(f"--{key.replace('_', '-')} {value} (the run has {stored_values[key]})")
    return differing
