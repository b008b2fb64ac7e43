"""Waiting until the running parts of a deployment report a change (a reload's steps, a label
change): rounds over the parts still behind, a few at a time. Polling every part as fast as it
answers would itself load the machine the parts run on."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

POLL_INTERVAL = 0.05  # s between rounds


def until(checks: dict[str, Callable[[], bool]], started: float, timeout: float) -> dict[str, float | None]:
    """Seconds from `started` (time.monotonic) until each check first passed; None for those that
    did not pass within `timeout` of `started`."""
    pending = dict(checks)
    seconds: dict[str, float | None] = dict.fromkeys(pending)
    with ThreadPoolExecutor(max_workers=max(1, min(8, len(pending)))) as pool:
        while pending and time.monotonic() < started + timeout:
            names = list(pending)
            passed = list(pool.map(lambda name: pending[name](), names))
            now = time.monotonic() - started
            for name, done in zip(names, passed):
                if done:
                    seconds[name] = now
                    del pending[name]
            if pending:
                time.sleep(POLL_INTERVAL)
    return seconds
