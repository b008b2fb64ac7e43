"""Loopback networks of make test's own, held while it runs: `python -m tests.loopbacks N -- COMMAND...`
runs COMMAND with TEST_LOOPBACKS set to N networks (three bytes each, space-separated, e.g.
"127.0.131 127.0.42") that no socket listens on and no other make test holds.

make test's streams each deploy on a network and in a runs/ of their own. With networks fixed in
the Makefile, a deployment of the user's on one of them (or a second make test) took the same
addresses, and make test failed or stopped it. A network is held by an exclusive lock on a file
named after it in the temporary folder, taken here and kept open (inherited) by COMMAND and
everything it starts: the kernel releases it when the last of them exits, however they end.

A deployment started by hand on a held network after the choice is refused
(complyroute/runtime/local/heldnetworks.py, which names the lock files and the variable).
"""

from __future__ import annotations

import fcntl
import os
import random
import socket
import struct
import sys
from pathlib import Path

from complyroute.runtime.local.heldnetworks import HELD_VARIABLE as VARIABLE, lock_path

# The networks chosen from: above the defaults (127.0.0.1, 127.0.1.x) and the low ones people pick
# by hand for a deployment of their own (COMPLYROUTE_LOOPBACK=127.0.9 in the docs).
CANDIDATES = [f"127.0.{third}" for third in range(100, 250)]
SOCKET_TABLES = ("/proc/net/tcp", "/proc/net/udp")


class NoFreeNetwork(RuntimeError):
    pass


def networks_in_use(tables: tuple[str, ...] = SOCKET_TABLES) -> set[str]:
    """The loopback networks (three bytes) some IPv4 socket of this machine is bound on."""
    used = set()
    for table in tables:
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            address = line.split()[1].split(":")[0]  # local address, hex, in host byte order
            used.add(socket.inet_ntoa(struct.pack("=I", int(address, 16))).rsplit(".", 1)[0])
    return used


def reserve(count: int, folder: Path | None = None, candidates: list[str] | None = None,
            in_use: set[str] | None = None) -> list[tuple[str, int]]:
    """`count` networks, each with the open descriptor of its lock: free of sockets and locked by
    no other holder, tried in random order (two make tests starting at once seldom try the same
    network first)."""
    busy = networks_in_use() if in_use is None else in_use
    tried = candidates or CANDIDATES
    held: list[tuple[str, int]] = []
    for network in random.sample(tried, len(tried)):
        if len(held) == count:
            break
        if network in busy:
            continue
        descriptor = os.open(lock_path(network, folder), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(descriptor)
            continue
        held.append((network, descriptor))
    if len(held) < count:
        for _, descriptor in held:
            os.close(descriptor)
        raise NoFreeNetwork(f"only {len(held)} of the {count} loopback networks make test needs are free "
                            f"(of {len(tried)} tried): stop a make test or deployment and try again")
    return held


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--" or not argv[0].isdigit():
        print("usage: python -m tests.loopbacks N -- COMMAND [ARGS...]", file=sys.stderr)
        return 2
    try:
        held = reserve(int(argv[0]))
    except NoFreeNetwork as error:
        print(f"make test: {error}", file=sys.stderr)
        return 1
    for _, descriptor in held:
        os.set_inheritable(descriptor, True)
    os.environ[VARIABLE] = " ".join(network for network, _ in held)
    os.execvp(argv[2], argv[2:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
