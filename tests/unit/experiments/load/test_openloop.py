"""The open loop's schedule and pacing, against a clock the test moves: arrivals at the
offered rate, sends that cannot be made on time counted as missed, and RTTs from the
intended send time (coordinated omission corrected)."""

import numpy as np
import pandas as pd
import pytest

from experiments.analysis import stats
from experiments.load.openloop import MISSED_CAP, MISSED_LATE, Pacer, arrival_offsets, round_trip_ms


def test_constant_arrivals_keep_the_rate_at_even_gaps():
    offsets = arrival_offsets("constant", rate=100, seconds=26, seed=0)
    assert len(offsets) == 2600
    assert offsets[0] == 0 and offsets[-1] < 26
    assert np.diff(offsets) == pytest.approx(np.full(2599, 0.01))


def test_poisson_arrivals_keep_the_rate_over_a_window_with_exponential_gaps():
    offsets = arrival_offsets("poisson", rate=500, seconds=60, seed=1)
    # 30,000 expected; a Poisson count's standard deviation is sqrt(30,000) = 173
    assert abs(len(offsets) - 30_000) < 4 * 173
    assert (0 <= offsets).all() and (offsets < 60).all() and (np.diff(offsets) >= 0).all()
    gaps = np.diff(offsets)
    assert gaps.mean() == pytest.approx(1 / 500, rel=0.03)
    assert gaps.std() == pytest.approx(gaps.mean(), rel=0.05)  # exponential: standard deviation = mean
    # per second the counts vary as a Poisson process's do (variance = mean), unlike constant arrivals
    per_second = np.bincount(offsets.astype(int), minlength=60)
    assert per_second.var() == pytest.approx(500, rel=0.5)
    assert (arrival_offsets("poisson", 500, 60, seed=1) == offsets).all()  # a cell's seed draws the same schedule again


def test_an_unknown_arrival_process_is_refused():
    with pytest.raises(ValueError, match=r"arrivals 'bursty' is not one of \['constant', 'poisson'\]"):
        arrival_offsets("bursty", 10, 1, seed=0)


class FakeClock:
    """A clock that moves only when the pacer sleeps or a send costs time."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def pace(offsets, clock, send_cost=lambda offset: 0.0, in_flight=lambda: 0, tolerance_s=0.1, max_in_flight=1000):
    sent, missed = [], []

    def send(offset):
        sent.append((offset, clock.now))
        clock.now += send_cost(offset)

    outcomes = Pacer(offsets, tolerance_s, max_in_flight).run(0.0, clock, clock.sleep, in_flight, send,
                                                            lambda offset, reason: missed.append((offset, reason)))
    return outcomes, sent, missed


def test_a_sender_that_keeps_up_sends_every_record_at_its_intended_time():
    offsets = arrival_offsets("constant", rate=50, seconds=2, seed=0)
    clock = FakeClock()
    outcomes, sent, missed = pace(offsets, clock)
    assert outcomes == {"sent": 100, MISSED_LATE: 0, MISSED_CAP: 0} and missed == []
    assert [at for _, at in sent] == pytest.approx(list(offsets))


def test_a_lagging_sender_counts_its_late_sends_as_missed():
    # 100 req/s for 1 s; the 11th send stalls the sender for 0.35 s (its process was not
    # scheduled): sends due in that stall are late by up to 0.35 s, and those more than 0.1 s
    # late are missed, not made, while the ones within the tolerance go out late.
    offsets = arrival_offsets("constant", rate=100, seconds=1, seed=0)
    clock = FakeClock()
    outcomes, sent, missed = pace(offsets, clock, send_cost=lambda offset: 0.35 if offset == pytest.approx(0.10) else 0.0)
    assert outcomes["sent"] + outcomes[MISSED_LATE] + outcomes[MISSED_CAP] == len(offsets)  # every scheduled request accounted for
    # due at 0.11 .. 0.45, reached at 0.45: those due before 0.35 are more than 0.1 s late
    assert [round(offset, 2) for offset, _ in missed] == [round(0.11 + 0.01 * k, 2) for k in range(24)]
    assert {reason for _, reason in missed} == {MISSED_LATE}
    late_sends = [(offset, at) for offset, at in sent if at > offset + 1e-9]
    assert [round(offset, 2) for offset, _ in late_sends] == [round(0.35 + 0.01 * k, 2) for k in range(10)]
    assert all(at - offset <= 0.1 + 1e-9 for offset, at in late_sends)


def test_a_full_in_flight_cap_counts_its_sends_as_missed():
    offsets = arrival_offsets("constant", rate=10, seconds=1, seed=0)
    clock = FakeClock()
    outcomes, sent, missed = pace(offsets, clock, in_flight=lambda: 3 if clock.now >= 0.5 else 0, max_in_flight=3)
    assert outcomes == {"sent": 5, MISSED_LATE: 0, MISSED_CAP: 5}
    assert [round(offset, 1) for offset, _ in missed] == [0.5, 0.6, 0.7, 0.8, 0.9]


def test_the_rtt_is_measured_from_the_intended_send_time():
    # the sender was 40 ms late and the system answered 10 ms after the actual send: a record
    # sent on schedule would have waited 50 ms
    assert round_trip_ms(t_intended_ms=1000.0, t_send_ms=1040.0, service_time_ms=10.0) == pytest.approx(50.0)
    assert round_trip_ms(t_intended_ms=1000.0, t_send_ms=1000.0, service_time_ms=10.0) == pytest.approx(10.0)


def test_a_late_senders_cell_has_the_rtts_from_intended_time_and_its_misses_counted():
    # open loop at 10 req/s for 1 s: 10 scheduled, answered in 10 ms of service time each; the
    # sender was 40 ms late for the sixth record and missed the last two (late beyond tolerance)
    rows = [(100.0 * k, 100.0 * k + (40 if k == 5 else 0), 10.0, 200, None) for k in range(8)]
    rows += [(800.0, None, None, 0, MISSED_LATE), (900.0, None, None, 0, MISSED_LATE)]
    requests = pd.DataFrame(rows, columns=["t_intended_ms", "t_send_ms", "service_time_ms", "status", "missed"])
    requests["rtt_ms"] = round_trip_ms(requests["t_intended_ms"], requests["t_send_ms"], requests["service_time_ms"])
    requests = requests.assign(record="allowed", expected=200)
    result = stats.cell_statistics(requests, {"warmup_s": 0, "duration_s": 1, "offered_rate": 10, "users": 1, "load": "open"})
    assert (result["scheduled"], result["requests"], result["missed"], result["errors"]) == (10, 8, 2, 0)
    assert result["miss_rate"] == pytest.approx(0.2)
    assert result["max"] == pytest.approx(50.0)  # not the 10 ms of service time: the lateness is in the RTT
    assert result["median_service_time"] == pytest.approx(10.0)
    assert result["achieved_rate"] == pytest.approx(8.0) and result["saturated"] is True  # 80% of the schedule sent


@pytest.mark.parametrize("load, saturated", [("closed", False), ("open", True)])
def test_a_cell_whose_rtts_grew_past_the_bound_is_saturated_only_in_the_open_loop(load, saturated):
    # every send on time and answered, the RTT growing by 60 ms a record to 600 ms: an open
    # loop's queue past capacity; a closed loop's RTT grows only as its users wait
    rows = [(100.0 * k, 100.0 * k, 60.0 * (k + 1), 200, None) for k in range(10)]
    requests = pd.DataFrame(rows, columns=["t_intended_ms", "t_send_ms", "service_time_ms", "status", "missed"])
    requests["rtt_ms"] = round_trip_ms(requests["t_intended_ms"], requests["t_send_ms"], requests["service_time_ms"])
    requests = requests.assign(record="allowed", expected=200)
    result = stats.cell_statistics(requests, {"warmup_s": 0, "duration_s": 1, "offered_rate": 10, "users": 1, "load": load})
    assert result["achieved_rate"] == pytest.approx(10.0) and result["p99"] > stats.P99_BOUND_MS
    assert result["saturated"] is saturated
