"""Files that running processes read, written whole.

A process that opens such a file while it is written reads the old bytes or the new, never a
part: the bytes go to a temporary file beside it, which then takes the file's name in one
rename (os.replace, atomic within a file system). Envoy reads its watched route and listener
files when one is moved into place, the bundle server serves bundles as they lie, and a part
starting while the bench issues the next credential into the same folder read an empty ca.pem
and exited, before credentials were written so.

The lowest layer (tests/unit/test_layers.py): trust, policy and both runtimes write such files.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_whole(path: Path, data: bytes | str, mode: int = 0o644) -> None:
    """Replace the file at `path` with `data` at once, the new file with `mode`. The temporary
    file is created 0600 (a private key is never readable by others while written) and is
    removed if the write or the rename fails."""
    content = data.encode() if isinstance(data, str) else data
    handle = tempfile.NamedTemporaryFile(dir=path.parent, prefix=f".{path.name}.", delete=False)
    try:
        with handle:
            handle.write(content)
        os.chmod(handle.name, mode)
        os.replace(handle.name, path)
    except BaseException:
        os.unlink(handle.name)
        raise
