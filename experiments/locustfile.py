"""Locust load of one experiment cell: labelled records to the entry, every request kept.

Run by the runner as one headless Locust process. Each user sends at most --user-rate
requests per second (constant_throughput) and waits for each answer before the next, so the
loop is closed: a slow system receives fewer requests. A request-event hook writes one CSV
row per request (send time, RTT, status, the record's kind and expected status, and the
durations of experiments.timing), not only Locust's aggregates.
"""

from __future__ import annotations

import csv
import json
import random

import gevent
from locust import FastHttpUser, constant_throughput, events, task

# Locust loads this file by path: `experiments` is imported as installed (make setup: pip install -e .).
from experiments.mixes import BODY, MIXES
from experiments.timing import DURATIONS, split

COLUMNS = ("t_send_ms", "rtt_ms", "status", "record", "expected", "hops", *DURATIONS)
BODY_TEXT = json.dumps(BODY)


@events.init_command_line_parser.add_listener
def add_arguments(parser):
    parser.add_argument("--requests-csv", required=True, help="file for one row per request")
    parser.add_argument("--mix", choices=sorted(MIXES), required=True)
    parser.add_argument("--user-rate", type=float, required=True, help="requests per second of one user at most")
    parser.add_argument("--services", type=int, required=True, help="length of the deployed chain")
    parser.add_argument("--enforcing", choices=("yes", "no"), required=True, help="no for the baseline")


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
    CellUser.wait_time = constant_throughput(options.user_rate)
    enforcing = options.enforcing == "yes"
    records = MIXES[options.mix]
    CellUser.records = [(r, {f"x-data-{k}": v for k, v in r.labels.items()}, r.expected_status(enforcing, options.services)) for r in records]
    CellUser.weights = [r.weight for r in records]
    request_log.open(options.requests_csv)


@events.quitting.add_listener
def close_log(**_):
    request_log.close()


@events.request.add_listener
def log_request(response_time, response, context, start_time, **_):
    t_send = start_time * 1000
    status = getattr(response, "status_code", 0) or 0
    row = [f"{t_send:.3f}", f"{response_time:.3f}", status, context["record"], context["expected"]]
    durations = [""] * len(DURATIONS)
    hops = ""
    if status == 200:
        try:
            path = json.loads(response.content)["path"]
            parts = split(path, t_send, t_send + response_time)
            hops = len(path)
            durations = [f"{parts[name]:.3f}" for name in DURATIONS]
        except (ValueError, KeyError, TypeError, IndexError):
            pass  # a 200 without a usable path: its RTT and status are still kept
    request_log.writer.writerow(row + [hops] + durations)


class CellUser(FastHttpUser):
    records: list = []
    weights: list = []

    def on_start(self):
        # Users spawn at even intervals that are multiples of their own period, so without a
        # random phase they would all send in the same instant: bursts, and queueing that the
        # target rate alone does not cause.
        gevent.sleep(random.uniform(0, 1 / self.environment.parsed_options.user_rate))

    @task
    def send_record(self):
        record, headers, expected = random.choices(self.records, self.weights)[0]
        self.client.post(
            "/process",
            data=BODY_TEXT,
            headers={"content-type": "application/json", **headers},
            context={"record": record.kind, "expected": expected},
        )
