"""Locust load of one experiment cell: labelled records to the entry, every request kept.

Run by the runner as one headless Locust process, with one of two user classes:

- OpenLoopUser (--load open, the default): one user walks a schedule of intended send times
  (constant or Poisson arrivals at --rate, experiments.load.openloop) and fires each record in a
  greenlet of its own at its time, whether or not earlier answers have come back; its
  FastHttpSession keeps up to --max-in-flight connections. A send later than
  --late-tolerance-ms or beyond the in-flight cap is not made and is written as a missed row.
- ClosedLoopUser (--load closed): each user sends at most --user-rate requests per second
  (constant_throughput) and waits for each answer before the next, so a slow system receives
  fewer requests.

A request-event hook writes one CSV row per request (intended and actual send time, RTT from
the intended time, service time from the actual send, status, the record's kind and expected
status, the durations of experiments.load.timing and its times of each hop), not only Locust's aggregates. In the closed loop
a request is intended when it is sent.
"""

from __future__ import annotations

import csv
import json
import random
import time

import gevent
from gevent.pool import Pool
from locust import FastHttpUser, constant_throughput, events, task
from locust.exception import StopUser

# Locust loads this file by path: `experiments` is imported as installed (make setup: pip install -e .).
from complyroute.policy import labels, policyfiles
from experiments.load.mixes import BODY, MIXES, policy_of
from experiments.load.openloop import ARRIVALS, Pacer, arrival_offsets, round_trip_ms
from experiments.load.timing import DURATIONS, HOP_PARTS, HOP_SEPARATOR, hop_times, split

# request_id (the answer's x-request-id: the entry assigns it), code and message (a refusal's JSON
# code and message: an enforcement point's says why Envoy could not deliver, %RESPONSE_CODE_DETAILS%)
# tell which record an audit line is of and who refused it, and why: the soak reads them (experiments/run/sets.py).
COLUMNS = ("t_intended_ms", "t_send_ms", "rtt_ms", "service_time_ms", "status", "missed", "record", "expected", "hops", *DURATIONS,
           "request_id", "code", "message", *HOP_PARTS)
BODY_TEXT = json.dumps(BODY)


@events.init_command_line_parser.add_listener
def add_arguments(parser):
    parser.add_argument("--requests-csv", required=True, help="file for one row per request")
    parser.add_argument("--mix", choices=sorted(MIXES), required=True)
    parser.add_argument("--services", type=int, required=True, help="length of the deployed chain")
    parser.add_argument("--enforcing", choices=("yes", "no"), required=True, help="no for the baseline")
    # closed loop
    parser.add_argument("--user-rate", type=float, help="closed loop: requests per second of one user at most")
    # open loop
    parser.add_argument("--rate", type=float, help="open loop: requests per second of the schedule")
    parser.add_argument("--arrivals", choices=ARRIVALS, help="open loop: constant gaps or a Poisson process")
    parser.add_argument("--schedule-seconds", type=float, help="open loop: length of the schedule")
    parser.add_argument("--seed", type=int, help="open loop: seed of the Poisson schedule")
    parser.add_argument("--max-in-flight", type=int, help="open loop: unanswered requests at most; a send beyond is missed")
    parser.add_argument("--late-tolerance-ms", type=float, help="open loop: a send later than this is missed")
    parser.add_argument("--answer-timeout", type=float, help="open loop: seconds a request may take before it counts as unanswered")


class RequestLog:
    """The CSV every request event appends to; opened when Locust starts, closed when it quits."""

    def __init__(self):
        self.file = None
        self.writer = None

    def open(self, path: str):
        self.file = open(path, "w", newline="", buffering=1 << 20)
        self.writer = csv.writer(self.file)
        self.writer.writerow(COLUMNS)

    def close(self):
        if self.file:
            self.file.close()


request_log = RequestLog()


@events.init.add_listener
def configure(environment, **_):
    options = environment.parsed_options
    enforcing = options.enforcing == "yes"
    records = MIXES[options.mix]
    header_of = {label.name: label.header for label in labels.schema(policyfiles.source_of(policy_of(options.mix)))}
    RecordUser.records = [(r, {header_of[k]: v for k, v in r.labels.items()}, r.expected_status(enforcing, options.services)) for r in records]
    RecordUser.weights = [r.weight for r in records]
    needed = {ClosedLoopUser: ("user_rate",), OpenLoopUser: ("rate", "arrivals", "schedule_seconds", "seed", "max_in_flight",
                                                           "late_tolerance_ms", "answer_timeout")}
    for user_class in environment.user_classes:
        missing = [f"--{name.replace('_', '-')}" for name in needed[user_class] if getattr(options, name) is None]
        if missing:
            raise SystemExit(f"locustfile: {user_class.__name__} needs {' '.join(missing)}")
    if options.user_rate is not None:
        ClosedLoopUser.wait_time = constant_throughput(options.user_rate)
    if options.max_in_flight is not None:
        OpenLoopUser.concurrency = options.max_in_flight  # one connection per request in flight
    if options.answer_timeout is not None:
        OpenLoopUser.network_timeout = OpenLoopUser.connection_timeout = options.answer_timeout
    request_log.open(options.requests_csv)


@events.quitting.add_listener
def close_log(**_):
    request_log.close()


@events.request.add_listener
def log_request(response_time, response, context, start_time, **_):
    t_send = start_time * 1000
    t_intended = context.get("t_intended_ms", t_send)
    status = getattr(response, "status_code", 0) or 0
    row = [f"{t_intended:.3f}", f"{t_send:.3f}", f"{round_trip_ms(t_intended, t_send, response_time):.3f}", f"{response_time:.3f}",
           status, "", context["record"], context["expected"]]
    durations = [""] * len(DURATIONS)
    per_hop = [""] * len(HOP_PARTS)
    hops = ""
    request_id = (getattr(response, "headers", None) or {}).get("x-request-id") or ""
    code = message = ""
    if status and status != 200:
        try:
            answer = json.loads(response.content)
            code, message, request_id = answer.get("code") or "", answer.get("message") or "", request_id or answer.get("request_id") or ""
        except (ValueError, TypeError, AttributeError):
            pass  # not JSON (an answer Envoy made without the points' reply formats): its status alone
    if status == 200:
        try:
            path = json.loads(response.content)["path"]
            parts = split(path, t_send, t_send + response_time)  # adds up to the service time, from the actual send
            hops = len(path)
            durations = [f"{parts[name]:.3f}" for name in DURATIONS]
            each_hop = hop_times(path, t_send, t_send + response_time)
            per_hop = [HOP_SEPARATOR.join(f"{value:.3f}" for value in each_hop[name]) for name in HOP_PARTS]
        except (ValueError, KeyError, TypeError, IndexError):
            pass  # a 200 without a usable path: its RTT and status are still kept
    request_log.writer.writerow(row + [hops] + durations + [request_id, code, message] + per_hop)


class RecordUser(FastHttpUser):
    abstract = True
    records: list = []
    weights: list = []

    def pick_record(self) -> tuple:
        return random.choices(self.records, self.weights)[0]

    def post_record(self, picked: tuple, **timing) -> None:
        record, headers, expected = picked
        self.client.post(
            "/process",
            data=BODY_TEXT,
            headers={"content-type": "application/json", **headers},
            context={"record": record.kind, "expected": expected, **timing},
        )


class ClosedLoopUser(RecordUser):
    def on_start(self):
        # Users spawn at even intervals that are multiples of their own period, so without a
        # random phase they would all send in the same instant: bursts, and queueing that the
        # target rate alone does not cause.
        gevent.sleep(random.uniform(0, 1 / self.environment.parsed_options.user_rate))

    @task
    def send_record(self):
        self.post_record(self.pick_record())


class OpenLoopUser(RecordUser):
    """The one user of an open-loop cell: its single task is the whole schedule."""

    @task
    def run_schedule(self):
        options = self.environment.parsed_options
        pacer = Pacer(arrival_offsets(options.arrivals, options.rate, options.schedule_seconds, options.seed),
                      late_tolerance_s=options.late_tolerance_ms / 1000, max_in_flight=options.max_in_flight)
        in_flight = Pool()
        start, wall_start_ms = time.monotonic(), time.time() * 1000

        def send(offset: float) -> None:
            in_flight.spawn(self.post_record, self.pick_record(), t_intended_ms=wall_start_ms + offset * 1000)

        def miss(offset: float, reason: str) -> None:
            record, _, expected = self.pick_record()
            request_log.writer.writerow([f"{wall_start_ms + offset * 1000:.3f}", "", "", "", 0, reason, record.kind, expected, "",
                                         *[""] * len(DURATIONS), "", "", "", *[""] * len(HOP_PARTS)])

        outcomes = pacer.run(start, time.monotonic, gevent.sleep, lambda: len(in_flight), send, miss)
        # Every request sent gets its answer or, after --answer-timeout, fails: none is left without a row.
        in_flight.join()
        print(f"open loop: {len(pacer.offsets)} scheduled, " + ", ".join(f"{count} {outcome}" for outcome, count in outcomes.items()), flush=True)
        raise StopUser()  # the schedule was the whole load
