"""A delivered record's round trip split by the timestamps its answer carries: the five parts
and the times of each hop both add up to it (experiments/load/timing.py)."""

import pytest

from experiments.load.timing import hop_times, split

# A record through three services (client clock, ms): sent at 100, received at 160.
PATH = [
    {"t_in": 104.0, "t_out": 106.0, "t_back": 150.0},  # sends on at 106, its answer comes back at 150
    {"t_in": 110.0, "t_out": 113.0, "t_back": 141.0},
    {"t_in": 118.0, "t_out": 130.0},  # the last step answers at its t_out
]


def test_each_hops_in_service_and_out():
    hops = hop_times(PATH, 100.0, 160.0)
    assert hops["hop_in_ms"] == [4.0, 4.0, 5.0]  # client -> first, then each t_out -> next t_in
    assert hops["hop_service_ms"] == [2.0, 3.0, 12.0]
    assert hops["hop_out_ms"] == [10.0, 9.0, 11.0]  # 160 - 150, 150 - 141, 141 - 130 (the last answered at its t_out)


def test_the_hops_add_up_to_the_round_trip_as_the_five_parts_do():
    hops = hop_times(PATH, 100.0, 160.0)
    assert sum(sum(values) for values in hops.values()) == pytest.approx(60.0)
    assert sum(split(PATH, 100.0, 160.0).values()) == pytest.approx(60.0)
    # a record of one service: in, its own time, out
    assert hop_times([{"t_in": 3.0, "t_out": 5.0}], 0.0, 6.0) == {"hop_in_ms": [3.0], "hop_service_ms": [2.0], "hop_out_ms": [1.0]}

