"""Open-loop load: when each record is meant to be sent, and what a send that cannot be made
on time becomes.

An open loop sends on a schedule fixed before the cell starts, whether or not answers have
come back, so a slow system keeps receiving the offered rate and its queue shows in the RTT.
Each RTT is measured from the send's intended time, not from when the request actually left:
a sender that falls behind (its process was not scheduled, or it was busy with answers)
would otherwise time only the requests it managed to send late, and leave out the waiting
the system under test caused; that is coordinated omission. A send later than a stated
tolerance, or one that would exceed the cap on requests in flight, is not made: it is
recorded as missed, with its reason, so every scheduled request ends as an answer, an error
or a counted miss.

The schedule and the pacing here are plain functions of a clock; experiments/load/locustfile.py
drives them with gevent and Locust's FastHttpUser.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

ARRIVALS = ("constant", "poisson")
# Why a scheduled request was not sent (the `missed` column of requests.csv).
MISSED_LATE = "late"
MISSED_CAP = "in-flight cap"


def arrival_offsets(arrivals: str, rate: float, seconds: float, seed: int) -> np.ndarray:
    """Intended send times in seconds from the schedule's start, in [0, seconds).

    constant: one every 1/rate s from 0. poisson: exponential gaps of mean 1/rate (a Poisson
    process of that rate), drawn from `seed` so a cell's schedule can be drawn again.
    """
    if rate <= 0 or seconds <= 0:
        raise ValueError(f"an arrival schedule needs a rate and a length above 0, got {rate} req/s over {seconds} s")
    if arrivals == "constant":
        return np.arange(math.ceil(rate * seconds)) / rate
    if arrivals == "poisson":
        rng = np.random.default_rng(seed)
        expected = rate * seconds
        # Enough gaps that running past the end is all but certain (10 standard deviations over the mean count).
        times = np.cumsum(rng.exponential(1 / rate, size=math.ceil(expected + 10 * math.sqrt(expected) + 10)))
        while times[-1] < seconds:  # never in practice; kept so a schedule is never cut short
            times = np.concatenate([times, times[-1] + np.cumsum(rng.exponential(1 / rate, size=len(times)))])
        return times[times < seconds]
    raise ValueError(f"arrivals '{arrivals}' is not one of {list(ARRIVALS)}")


def round_trip_ms(t_intended_ms: float, t_send_ms: float, service_time_ms: float) -> float:
    """The RTT from the intended send time: what a record sent on schedule would have waited.
    service_time_ms is measured from the actual send; the difference is the sender's lateness."""
    return t_send_ms + service_time_ms - t_intended_ms


@dataclass(frozen=True)
class Pacer:
    """Walks a schedule: at each intended time sends, or records a miss and why."""

    offsets: Sequence[float]  # seconds from the schedule's start
    late_tolerance_s: float  # a send later than this is missed, not made
    max_in_flight: int  # a send that would exceed this many unanswered requests is missed

    def run(self, start: float, clock: Callable[[], float], sleep: Callable[[float], None], in_flight: Callable[[], int],
            send: Callable[[float], None], miss: Callable[[float, str], None]) -> Counter:
        """Send (or miss) every offset of the schedule, started at clock() == start; returns how
        many were sent and missed for each reason. sleep(0) when behind schedule still yields, so
        answers in flight are handled between late sends."""
        outcomes = Counter(sent=0, **{MISSED_LATE: 0, MISSED_CAP: 0})
        for offset in self.offsets:
            intended = start + offset
            sleep(max(0.0, intended - clock()))
            if clock() - intended > self.late_tolerance_s:
                outcome = MISSED_LATE
            elif in_flight() >= self.max_in_flight:
                outcome = MISSED_CAP
            else:
                send(offset)
                outcomes["sent"] += 1
                continue
            miss(offset, outcome)
            outcomes[outcome] += 1
        return outcomes
