"""scripts/check-prereqs.sh, which `make setup` runs first: a Python older than 3.11 is refused up
front, naming the version found and what to install, before anything is downloaded or built."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from complyroute.topology.manifest import REPO

SCRIPT = REPO / "scripts" / "check-prereqs.sh"
# pyenv's interpreters, where the machine has them (these machines do); the test needs a real 3.10.
PYTHON_3_10 = next(iter(sorted(Path(os.path.expanduser("~/.pyenv/versions")).glob("3.10.*/bin/python3.10"))), None)


def check_with_python(python: str, tmp_path: Path) -> subprocess.CompletedProcess:
    """Run the check with `python3` on PATH being `python`, everything else as on this machine."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(python)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    env.pop("VIRTUAL_ENV", None)
    return subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.skipif(PYTHON_3_10 is None, reason="no Python 3.10 under ~/.pyenv/versions on this machine")
def test_python_3_10_is_refused_up_front_denied(tmp_path):
    result = check_with_python(str(PYTHON_3_10), tmp_path)
    assert result.returncode == 1
    assert "python3 is 3.10." in result.stderr and "complyroute needs Python 3.11 or newer" in result.stderr, result.stderr
    assert "apt-get install python3 python3-venv" in result.stderr


def test_python_3_11_or_newer_passes_the_python_check_allowed(tmp_path):
    # The interpreter that runs the tests is 3.11+ (pyproject.toml's requires-python); its base
    # interpreter, not the venv's wrapper, as a user's python3 would be.
    assert sys.version_info >= (3, 11)
    result = check_with_python(sys._base_executable, tmp_path)
    assert "needs Python 3.11" not in result.stderr, result.stderr
    assert result.returncode == (0 if shutil.which("go") and shutil.which("npm") and shutil.which("curl") else 1), result.stderr
