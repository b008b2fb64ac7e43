"""Loopback networks `make test` holds while it runs, and the refusal of a deployment on one.

make test deploys each of its streams on a loopback network of its own (tests/loopbacks.py),
chosen among those no socket is bound on, and holds it with an exclusive lock on a file named
after it in the temporary folder. A deployment a user starts by hand on such a network
(COMPLYROUTE_LOOPBACK) would take the addresses a test is about to listen on: it is refused
instead, unless it is one of make test's own, which run with the networks they hold in
TEST_LOOPBACKS.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

HELD_VARIABLE = "TEST_LOOPBACKS"


class NetworkHeld(RuntimeError):
    """The loopback network is held by a running make test."""


def lock_path(network: str, folder: Path | None = None) -> Path:
    """The file whose exclusive lock holds `network` (three bytes, e.g. "127.0.131")."""
    return (folder or Path(tempfile.gettempdir())) / f"complyroute-loopback-{network}.lock"


def refuse_if_held(network: str | None, folder: Path | None = None, environ: Mapping[str, str] = os.environ) -> None:
    """NetworkHeld when another make test holds `network` (None: the default addresses, which
    make test never takes); nothing when it is free or the caller's own make test holds it."""
    if network is None or network in environ.get(HELD_VARIABLE, "").split():
        return
    path = lock_path(network, folder)
    try:
        handle = path.open("rb")  # never created here: no lock file, no make test ever held it
    except FileNotFoundError:
        return
    with handle:
        try:  # a shared lock is refused only while someone holds the exclusive one
            fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            raise NetworkHeld(f"loopback network {network} is held by a running make test ({path}): set COMPLYROUTE_LOOPBACK "
                              "to another network, or deploy when it has ended") from None
