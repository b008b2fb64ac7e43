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
import shutil
import tempfile
from pathlib import Path

import yaml


# PyYAML through libyaml where its wheel carries it, else in Python: a 50-service sidecar's
# manifests and its fifty opa.yaml files are dumped several times faster (10 ms each in Python).
YAML_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def yaml_text(*documents) -> str:
    """`documents` as YAML, keys in their order: one document, or a stream of them."""
    if len(documents) == 1:
        return yaml.dump(documents[0], Dumper=YAML_DUMPER, sort_keys=False)
    return yaml.dump_all(documents, Dumper=YAML_DUMPER, sort_keys=False)


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


# A folder of files written whole together (write_folder): each name a link through DATA_LINK
# into a hidden folder of one version, as the kubelet lays out a ConfigMap volume.
DATA_LINK = "..data"


def write_folder(folder: Path, files: dict[str, str]) -> list[str]:
    """Give the files of `folder` the contents `files` (name -> text) in one rename, and return
    the names whose content changed; the folder's other files keep theirs. Nothing is written
    when nothing changed.

    Envoy reads a watched route or listener file again whenever a file is moved into its
    folder, and every subscription watching the folder reads its own file again on each move:
    written one by one (write_whole), n files that change cost n x n reads (a central entity
    of 50 services under the compiled engine: 49 route files, 4,802 reads in a reload and 10.6
    s before every listener had its new routes). So, as the kubelet updates a ConfigMap
    volume, every name is a symbolic link through DATA_LINK into a hidden folder that holds one
    version of all of them, and the new version takes DATA_LINK's place in one rename: one
    move, each file read once, and a reader sees the old version of every file or the new."""
    folder.mkdir(parents=True, exist_ok=True)
    link = folder / DATA_LINK
    current = {path.name: path.read_text() for path in folder.iterdir() if not path.name.startswith(".") and path.is_file()}
    changed = [name for name, content in files.items() if current.get(name) != content]
    if not changed:
        return []
    version = Path(tempfile.mkdtemp(dir=folder, prefix="..version-"))
    os.chmod(version, 0o755)
    for name, content in {**current, **files}.items():
        (version / name).write_text(content)
    previous = os.readlink(link) if link.is_symlink() else None
    if previous is None:  # the first version: DATA_LINK names it before any link through it is read
        _swap_link(folder, version)
    for name in files:  # a new name, or a file written whole before: a link to its version (through DATA_LINK)
        entry = folder / name
        if not entry.is_symlink():
            temporary = folder / f".{name}.link"
            temporary.unlink(missing_ok=True)
            temporary.symlink_to(Path(DATA_LINK) / name)
            os.replace(temporary, entry)
    if previous is not None:
        _swap_link(folder, version)
        shutil.rmtree(folder / previous, ignore_errors=True)
    return changed


def _swap_link(folder: Path, version: Path) -> None:
    temporary = folder / f"{DATA_LINK}.new"
    temporary.unlink(missing_ok=True)
    temporary.symlink_to(version.name)
    os.replace(temporary, folder / DATA_LINK)
