"""Split one request's round trip by the timestamps its answer carries.

Every instance on the path reports t_in (received), t_out (sent on, or answered at the last
step) and t_back (the next step's answer came back). With the client's own send and receive
times (t_send, t_recv, same clock: one machine) the round trip falls into five parts that
add up to it exactly:

- service: inside the services, sum of t_out - t_in;
- forward: from a service sending the record on to the next one receiving it
  (next.t_in - t_out), through whatever sits between them;
- back: from a service answering to the previous one getting the answer
  (t_back - next's answer time; a middle service answers right after its own t_back);
- entry: from the client sending to the first service receiving (through the entry);
- exit: from the first service answering to the client receiving.

Hop by hop (hop_times), the same round trip falls into three parts per service: in (from the
previous service sending the record on, or from the client's send, to this one receiving it),
service (t_out - t_in) and out (from this one answering to the previous one, or the client,
getting the answer). They add up to it exactly too, and tell which hop the time went to.
"""

from __future__ import annotations

DURATIONS = ("service_ms", "forward_ms", "back_ms", "entry_ms", "exit_ms")

# The per-hop parts, each a column of its own in a cell's requests.csv.gz: one value per hop,
# first hop first, separated by HOP_SEPARATOR.
HOP_PARTS = ("hop_in_ms", "hop_service_ms", "hop_out_ms")
HOP_SEPARATOR = " "


def answered_at(hop: dict) -> float:
    """When an instance answered: the last step at t_out, any other once its t_back came."""
    return hop.get("t_back", hop["t_out"])


def split(path: list[dict], t_send: float, t_recv: float) -> dict[str, float]:
    """The five durations (ms) of one delivered record; they sum to t_recv - t_send."""
    pairs = list(zip(path, path[1:]))
    return {
        "service_ms": sum(hop["t_out"] - hop["t_in"] for hop in path),
        "forward_ms": sum(after["t_in"] - before["t_out"] for before, after in pairs),
        "back_ms": sum(before["t_back"] - answered_at(after) for before, after in pairs),
        "entry_ms": path[0]["t_in"] - t_send,
        "exit_ms": t_recv - answered_at(path[0]),
    }


def hop_times(path: list[dict], t_send: float, t_recv: float) -> dict[str, list[float]]:
    """Per hop of one delivered record, first hop first: in, service and out (ms); all of them
    sum to t_recv - t_send."""
    sent_on = [t_send] + [hop["t_out"] for hop in path[:-1]]
    got_back = [t_recv] + [hop["t_back"] for hop in path[:-1]]
    return {
        "hop_in_ms": [hop["t_in"] - before for hop, before in zip(path, sent_on)],
        "hop_service_ms": [hop["t_out"] - hop["t_in"] for hop in path],
        "hop_out_ms": [back - answered_at(hop) for hop, back in zip(path, got_back)],
    }
