"""Capacity: the highest offered rate each topology holds, per engine and chain length: the
search, what a step is judged by, and a search's result read back from its steps.

For each (topology, engine, services) the offered rate is stepped inside one deployment
(run/capacity_run.py runs the steps). The search starts at `start_rate`, doubles while steps hold,
up to `max_rate`; then it bisects between the last rate held and the first that failed until
the gap is within `gap` (10%) of the rate held. A step that fails is run again at its rate
(`confirmations`, 1): the rate fails only when every one of its steps fails. A shared machine's
noise only adds to a step's latency, so a single spike fails a step that the rate holds, and
one such step early in the doubling ended a search at a fraction of what its topology held
(capacity-n5-20261130: 100 req/s failed on one p99 of 510 ms, the search ended at 93); it
cannot make a step over the knee hold. The baseline is always searched too, first at
each chain length: the reference. With `closing_baseline` (the default) it is searched again
after the enforcing topologies: how far its capacity moved over the run is how far the machine
did (a shared machine's speed drifts over an hour), which the report sets beside the shares.

A step is *held* when (`judge`): its achieved rate is at least 95% of the offered one; its
errors and missed sends are at most 1% of the requests its window scheduled; and the p99 of
its delivered records' RTTs is at most `p99_bound_ms`.

A run's raw/steps.csv (STEP_COLUMNS, one row per step) holds what its report needs
(report/capacity_report.py): `result_of_steps` derives each search's result from its rows alone.
The closing baseline searches' steps are in raw/closing-steps.csv (the same columns), apart: every
share is against the first search, and a reader of steps.csv meets one search per topology,
engine and chain length.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from complyroute.topology import manifest

from experiments.design import matrix
from experiments.design.matrix import BASELINE, ENGINES, MAX_ERROR_RATE, MIN_ACHIEVED_SHARE, P99_BOUND_MS, ParameterError

# The search's defaults (the command line's).
START_RATE = 50
MAX_RATE = 2000
STEP_SECONDS = 10
STEP_WARMUP = 5  # a step's first seconds carry a start transient (new Locust, new connections): 2 s left it in the window
SERVICES = [5, 10]
GAP = 0.10  # bisect until the lowest failed rate is within this share above the highest held
HALVINGS = 3  # a first step that fails: halve the rate at most this often to find one held
CONFIRMATIONS = 1  # a failed step is run again this often at its rate before the rate counts as failed
MAX_STEPS = 16  # steps of one search at most, whatever the step function does
ENFORCING = matrix.ENFORCING
STEPS_CSV = "steps.csv"
CLOSING_STEPS_CSV = "closing-steps.csv"
# Where an experiment run keeps the capacity runs its report prices enforcement with (`report RUN
# --capacity`, `run --capacity`): of each, its metadata.json and raw/steps.csv, all its table is made
# of, so that the run's report is rebuilt from the run's folder alone and a later `report RUN` keeps the share.
KEPT_CAPACITY = Path("raw") / "capacity"
MAX_WORK_ITERATIONS = 1_000_000  # what a service takes (services/config.js MAX_WORK_ITERATIONS)
STEP_COLUMNS = ("topology", "engine", "services", "step", "offered_rate", "scheduled", "sent", "achieved_rate", "achieved_share",
                "errors", "missed", "loss_share", "p50_ms", "p95_ms", "p99_ms", "held", "why_not", "cpu_machine", "cpu_locust",
                "cpu_deployment", "started_at")


# ---- what a step is judged by -----------------------------------------------------------------

def judge(offered_rate: float, achieved_rate: float, scheduled: int, errors: int, missed: int, p99_ms: float,
          p99_bound_ms: float) -> tuple[bool, list[str]]:
    """Whether a step held, and if not every criterion it failed, worded for the report.

    Held: achieved >= 95% of offered; errors + missed <= 1% of the requests scheduled in the
    window; p99 RTT (delivered records, from the intended send time) <= the bound. A step
    that delivered nothing has no p99 and fails that criterion."""
    reasons = []
    share = achieved_rate / offered_rate if offered_rate else 0.0
    if share < MIN_ACHIEVED_SHARE:
        reasons.append(f"achieved {share:.1%} of offered < {MIN_ACHIEVED_SHARE:.0%}")
    loss = (errors + missed) / scheduled if scheduled else 1.0
    if loss > MAX_ERROR_RATE:
        reasons.append(f"errors+missed {loss:.1%} > {MAX_ERROR_RATE:.0%}")
    if p99_ms is None or math.isnan(p99_ms):
        reasons.append("no record delivered (no p99)")
    elif p99_ms > p99_bound_ms:
        reasons.append(f"p99 {p99_ms:.0f} ms > {p99_bound_ms:g} ms")
    return not reasons, reasons


# ---- the search -------------------------------------------------------------------------------

@dataclass
class SearchResult:
    capacity: int | None  # the highest rate held; None when no step held
    capped: bool  # every step held, up to max_rate: the capacity is at least that
    lowest_failed: int | None  # the lowest rate that failed (the bracket's top)
    first_failed: int | None  # the first rate in time that failed (every step of it)
    steps: list[tuple[int, bool]] = field(default_factory=list)  # (rate, held) in the order run, a rate's confirmations after it

    @property
    def converged(self) -> bool:
        """Whether the bracket is within the gap (or capped at max_rate)."""
        if self.capped:
            return True
        if self.capacity is None or self.lowest_failed is None:
            return False
        return self.lowest_failed - self.capacity <= max(1, GAP * self.capacity)


def search(step: Callable[[int], bool], start_rate: int = START_RATE, max_rate: int = MAX_RATE, gap: float = GAP,
           halvings: int = HALVINGS, max_steps: int = MAX_STEPS, confirmations: int = CONFIRMATIONS) -> SearchResult:
    """Find the highest rate `step(rate)` holds.

    Doubling from start_rate while rates hold, up to max_rate (held there: capped); a first
    rate that fails is followed by halvings until one holds (at most `halvings`); then
    bisection between the highest held and the lowest failed rate until their gap is within
    `gap` of the held rate (or 1 req/s). A rate holds when one of its steps does: a step that
    fails is run again, up to `confirmations` times. Every rate probed lies strictly between
    the two, so the held rates stay below the failed ones even when the step function is
    noisy: the capacity is always the highest rate held and the lowest failed rate the
    bracket's top."""
    if start_rate < 1 or max_rate < start_rate:
        raise ParameterError(f"the search needs 1 <= start rate <= max rate, got {start_rate} and {max_rate}")
    steps: list[tuple[int, bool]] = []

    def probe(rate: int) -> bool:
        for tried in range(1 + confirmations):
            if tried and len(steps) >= max_steps:
                return False
            held = bool(step(rate))
            steps.append((rate, held))
            if held:
                return True
        return False

    held_rate: int | None = None
    failed_rate: int | None = None
    rate = start_rate
    while len(steps) < max_steps:
        if not probe(rate):
            failed_rate = rate
            break
        held_rate = rate
        if rate >= max_rate:
            break
        rate = min(2 * rate, max_rate)
    first_failed = failed_rate
    if held_rate is None and failed_rate is not None:  # the first step failed: look below it
        for _ in range(halvings):
            rate //= 2
            if rate < 1 or len(steps) >= max_steps:
                break
            if probe(rate):
                held_rate = rate
                break
            failed_rate = rate
    if held_rate is not None and failed_rate is not None:
        while failed_rate - held_rate > max(1, gap * held_rate) and len(steps) < max_steps:
            middle = (held_rate + failed_rate) // 2
            if probe(middle):
                held_rate = middle
            else:
                failed_rate = middle
    return SearchResult(capacity=held_rate, capped=failed_rate is None and held_rate is not None, lowest_failed=failed_rate,
                        first_failed=first_failed, steps=steps)


def result_of_steps(rows: list[dict]) -> SearchResult:
    """A search's result from its rows of steps.csv (held as "True"/"False" or bools): what
    search() returned, derived from the raw data alone."""
    ordered = sorted(rows, key=lambda row: int(row["step"]))
    steps = [(int(float(row["offered_rate"])), as_bool(row["held"])) for row in ordered]
    held = {rate for rate, ok in steps if ok}  # a rate holds when one of its steps did
    failed = [rate for rate, _ in steps if rate not in held]
    return SearchResult(capacity=max(held) if held else None, capped=bool(held) and not failed,
                        lowest_failed=min(failed) if failed else None, first_failed=failed[0] if failed else None, steps=steps)


def as_bool(value) -> bool:
    return value if isinstance(value, bool) else str(value).strip().lower() in ("true", "1", "yes")


# ---- parameters -------------------------------------------------------------------------------

@dataclass
class Parameters:
    topologies: list[str] = field(default_factory=lambda: list(ENFORCING))
    engines: list[str] = field(default_factory=lambda: list(ENGINES))
    services: list[int] = field(default_factory=lambda: list(SERVICES))
    start_rate: int = START_RATE
    max_rate: int = MAX_RATE
    step_seconds: int = STEP_SECONDS
    step_warmup: int = STEP_WARMUP
    p99_bound_ms: float = P99_BOUND_MS
    gap: float = GAP
    max_steps: int = MAX_STEPS
    confirmations: int = CONFIRMATIONS
    # A first step at 50 req/s on a fresh deployment failed on a p99 of 680 ms that 46 req/s then held
    # at 77 ms: before its first step a search runs one step's load at PRIME_SHARE of the start rate.
    prime: bool = True
    mix: str = "allowed"
    max_in_flight: int = matrix.DEFAULT_MAX_IN_FLIGHT
    late_tolerance_ms: float = matrix.DEFAULT_LATE_TOLERANCE_MS
    replicas: int = 1  # instances of every step, alike (experiments/run/sets.py): what two compliant replicas hold against one
    work_iterations: int | None = None  # the services' work per record (None: the manifest's workload)
    closing_baseline: bool = True  # the baseline searched again after the enforcing topologies (module docstring)

    def __post_init__(self):
        names = [matrix.topology_name(t) for t in self.topologies]
        if len(set(names)) != len(names):
            raise ParameterError(f"topologies {self.topologies} name one twice")
        # The baseline is always searched, first at each chain length: the reference.
        self.topologies = [BASELINE] + [t for t in names if t != BASELINE]
        for engine in self.engines:
            if engine not in ENGINES:
                raise ParameterError(f"engine '{engine}' is not one of {list(ENGINES)}")
        if not self.engines or len(set(self.engines)) != len(self.engines):
            raise ParameterError(f"engines {self.engines}: give one or more of {list(ENGINES)}, each once")
        if not self.services or any(n < 1 for n in self.services) or len(set(self.services)) != len(self.services):
            raise ParameterError(f"services must be distinct whole numbers >= 1, got {self.services}")
        if self.start_rate < 1 or self.max_rate < self.start_rate:
            raise ParameterError(f"rates: need 1 <= --start-rate <= --max-rate, got {self.start_rate} and {self.max_rate}")
        if self.step_seconds < 1 or self.step_warmup < 0:
            raise ParameterError(f"--step-seconds must be >= 1 and --step-warmup >= 0, got {self.step_seconds} and {self.step_warmup}")
        if not self.p99_bound_ms > 0:
            raise ParameterError(f"--p99-bound-ms must be above 0, got {self.p99_bound_ms:g}")
        if self.max_steps < 1:
            raise ParameterError(f"--max-steps must be >= 1, got {self.max_steps}")
        if self.confirmations < 0:
            raise ParameterError(f"--confirmations must be >= 0, got {self.confirmations}")
        if not 1 <= self.replicas <= manifest.MAX_REPLICAS:
            raise ParameterError(f"--replicas must be from 1 to {manifest.MAX_REPLICAS}, got {self.replicas}")
        if self.work_iterations is not None and not 0 <= self.work_iterations <= MAX_WORK_ITERATIONS:
            raise ParameterError(f"--work-iterations must be from 0 to {MAX_WORK_ITERATIONS}, got {self.work_iterations}")
        if not 0 < self.gap < 1:
            raise ParameterError(f"the gap must be between 0 and 1, got {self.gap:g}")

    def searches(self) -> list[tuple[str, str | None, int, bool]]:
        """(topology, engine, services, closing) in the order run: per chain length the baseline
        (engine None), every other topology under each engine, then (closing_baseline, when there
        is another topology) the baseline again, closing True."""
        order = []
        for services in self.services:
            order += [(topology, engine, services, False) for topology in self.topologies
                      for engine in ([None] if topology == BASELINE else self.engines)]
            if self.closing_baseline and len(self.topologies) > 1:
                order.append((BASELINE, None, services, True))
        return order


def command_for(run: matrix.Parameters) -> str:
    """The capacity search that gives a run's report its price in capacity: the run's topologies,
    engines and chain lengths, each option left out where it is the search's default."""
    words = ["python -m experiments capacity"]
    enforcing = [t for t in run.topologies if t != BASELINE]
    if sorted(enforcing) != sorted(ENFORCING):
        words.append("--topologies " + " ".join(enforcing))
    if sorted(run.engines) != sorted(ENGINES):
        words.append("--engines " + " ".join(run.engines))
    if sorted(run.services) != sorted(SERVICES):
        words.append("--services " + " ".join(map(str, run.services)))
    return " ".join(words)


def search_key(topology: str, engine: str | None, services: int, closing: bool = False) -> str:
    return f"{topology}{'_' + engine if engine else ''}_n{services}{'_closing' if closing else ''}"


def capacity_text(result: SearchResult) -> str:
    """"287" (bracket within the gap), "≥ 2000" (every step held), "< 6" (none held)."""
    if result.capacity is None:
        tried = min(rate for rate, _ in result.steps) if result.steps else None
        return f"< {tried}" if tried is not None else "not measured"
    return f"≥ {result.capacity}" if result.capped else str(result.capacity)
