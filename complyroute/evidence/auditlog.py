"""One instance's audit log as the audit reads it (runs/<run>/audit/<instance>.jsonl, written by
services/src/audit.js): its lines, each a JSON object, and its hash chain, every line's "prev"
the SHA-256 of the bytes of the line before it (GENESIS for the first); and a Problem, what the
audit found wrong at a line.

An instance may have written more than one chain: on Kubernetes its log is in its pod's
emptyDir, and a pod that replaces a deleted one starts a new chain. Each is a file of its own,
<instance>.<which>.jsonl beside <instance>.jsonl; the name up to the first dot names the
instance (an instance id is a DNS label: it has no dot).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

GENESIS = "0" * 64  # the "prev" of a file's first line (services/src/audit.js GENESIS)
PROGRESS_EVERY = 100_000  # lines: how often a long run reports how far it got


@dataclass(frozen=True)
class Problem:
    kind: str  # chain | undecided | forbidden | one of paths.PATH_FINDINGS
    where: str  # file:line; for a path finding every line involved, comma-separated
    detail: str


@dataclass
class Line:
    where: str
    instance: str  # the instance whose log holds it
    entry: dict


def line_hash(raw: bytes) -> str:
    return hashlib.sha256(raw).hexdigest()


def instance_of(path: Path) -> str:
    return path.name.split(".", 1)[0]


def read_chain(path: Path, name: str, progress=None) -> tuple[int, list[Line], list[Problem]]:
    """How many lines one instance's log has, those that are JSON objects, and the links that do not hold.

    After a broken link the chain is followed on from the line that broke it, so each
    edit, removal or insertion is reported once.
    """
    lines, problems = [], []
    expected = GENESIS
    number = 0
    with path.open("rb") as file:
        for number, raw in enumerate(file, 1):
            where = f"{name}:{number}"
            raw = raw.removesuffix(b"\n")
            try:
                entry = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError):
                entry = None
            if not isinstance(entry, dict):
                problems.append(Problem("chain", where, "not a JSON object"))
            elif "prev" not in entry:
                problems.append(Problem("chain", where, "no prev: not a chained audit line"))
            elif entry["prev"] != expected:
                problems.append(Problem("chain", where, "prev is not the hash of the line before it" if number > 1 else "the first line does not start from the genesis"))
            if isinstance(entry, dict):
                lines.append(Line(where, instance_of(path), entry))
            expected = line_hash(raw)
            if progress and number % PROGRESS_EVERY == 0:
                progress(f"{name}: {number} lines")
    return number, lines, problems


def hashable(value):
    """A field of a line as a key: a string (or null) as it is; anything else a forged line may
    hold (a list, a number) as its JSON text in a tuple, which equals no string."""
    return value if value is None or isinstance(value, str) else (json.dumps(value, sort_keys=True),)
