"""The rule set as OPA bundles: what every enforcement point's OPA decides with, and reloads.

A point's OPA does not read policies/ from disk. The control plane writes one bundle per
point (a gzipped tarball: the rule set's modules and reference data, the point's index from
policydata, the revision, a manifest) into the deployment's bundle folder; the bundle server
(bundleserver.py) serves it, and the point's OPA long-polls for it, so a new bundle is
decided with about as soon as it is written, without restarting anything
(`make reload-policy`, reload.py).

The bundle owns only the documents it carries (its manifest's roots: data.complyroute.<x>
for each package and data document in it), so what a point's OPA loads from disk beside it
stays: the REST API's authorization policy (policies/system) and, at the entry, the
label-token key (data.complyroute.token), which never travels over the bundle server.

Every bundle names its revision, which every decision carries on (policies/complyroute/envoy:
the x-complyroute-revision header of an allowed hop, the `revision` of a denial): the git
commit the rule set was taken from, or, when it differs from that commit's, the commit plus
"-dirty." and a digest of its content, so two different edits are two revisions. A rule set
from a folder outside the repository is named by its content alone ("content." and the digest):
no commit of the repository holds it.
"""

from __future__ import annotations

import gzip
import io
import json
import re
import subprocess
import tarfile
from pathlib import Path

from complyroute.files import write_whole
from complyroute.policy import policyfiles
from complyroute.policy.policyfiles import POLICIES, RULE_SET, is_test
from complyroute.topology.manifest import REPO

REVISION_PATH = ("complyroute", "revision")
# In a run folder: every bundle the deployment served, by revision (what `make audit` re-checks with).
REVISIONS = "revisions"
PACKAGE = re.compile(r"^package\s+([\w.]+)", re.MULTILINE)


class BundleError(RuntimeError):
    """A rule set that cannot be made into a bundle; the message says what to fix."""


def rule_set_files(policies: Path = POLICIES) -> dict[str, bytes]:
    """The rule set's files a bundle carries, by path relative to `policies`: every module but
    the tests beside them, and every data.json (the reference data)."""
    root = policies / RULE_SET
    if not root.is_dir():
        raise BundleError(f"{policies} has no {RULE_SET}/ folder: it is not a rule set")
    files = {}
    for path in sorted(root.rglob("*")):
        if path.is_file() and ((path.suffix == ".rego" and not is_test(path)) or path.name == "data.json"):
            files[path.relative_to(policies).as_posix()] = path.read_bytes()
    return files


def revision(policies: Path = POLICIES, repo: Path = REPO, source: Path | None = None) -> str:
    """The rule set's revision: the repository's commit when `policies` is the repository's
    own and unchanged since it; "content." + 12 hex digits of its content when it comes from a
    folder outside the repository (`source`: the folder it was chosen as, when `policies` is
    its copy completed with the platform's parts); else the commit + "-dirty." + the same 12
    digits ("unversioned" in place of the commit outside a git checkout)."""
    digest = policyfiles.content_digest(rule_set_files(policies))[:12]
    if not Path(source or policies).resolve().is_relative_to(repo.resolve()):
        return f"content.{digest}"

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout.strip()

    try:
        commit = git("rev-parse", "HEAD")
        changed = Path(policies).resolve() != (repo / "policies").resolve() or git("status", "--porcelain", "--", "policies")
    except (OSError, subprocess.CalledProcessError):
        commit, changed = "unversioned", True
    return f"{commit}-dirty.{digest}" if changed else commit


def roots(files: dict[str, bytes], data: dict) -> list[str]:
    """The manifest's roots: complyroute/<x> for each package complyroute.<x>... and each
    document data.complyroute.<x> the bundle carries, and each other document of its data
    (data.complyroute_quick_path, precompute.py)."""
    found = set()
    for name, content in files.items():
        if name.endswith(".rego"):
            match = PACKAGE.search(content.decode())
            segments = match.group(1).split(".") if match else []
            if len(segments) < 2 or segments[0] != RULE_SET:
                raise BundleError(f"policies/{name}: its package is not complyroute.<name>...: a bundle owns data.complyroute.<name> documents only")
            found.add(f"{RULE_SET}/{segments[1]}")
        else:
            found.add(str(Path(name).parent))
    found |= {f"{RULE_SET}/{key}" for key in data.get(RULE_SET, {})} | {key for key in data if key != RULE_SET}
    return sorted(found)


def tarball(files: dict[str, bytes], data: dict, revision_name: str) -> bytes:
    """A bundle: the rule set's `files`, `data` (with the revision) as its data.json, a manifest."""
    document = {**data, RULE_SET: {**data.get(RULE_SET, {}), REVISION_PATH[1]: revision_name}}
    members = {
        ".manifest": json.dumps({"revision": revision_name, "roots": roots(files, document)}).encode(),
        "data.json": json.dumps(document, sort_keys=True).encode(),
        **files,
    }
    buffer = io.BytesIO()
    # Fixed times, in every member and in the gzip header (tarfile's "w:gz" would stamp the
    # current second there): the same content gives the same bytes, so the same ETag, and on
    # Kubernetes the same ConfigMap, which a reload then leaves as it is.
    with gzip.GzipFile(fileobj=buffer, mode="wb", mtime=0) as compressed:
        with tarfile.open(fileobj=compressed, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for name, content in members.items():
                info = tarfile.TarInfo(f"/{name}")
                info.size, info.mode, info.mtime = len(content), 0o644, 0
                tar.addfile(info, io.BytesIO(content))
    return buffer.getvalue()


def bundle_name(point: str) -> str:
    return f"{point}.tar.gz"


def write(folder: Path, point_bundles: dict[str, bytes], revision_name: str, archive: Path | None = None) -> None:
    """Write each point's bundle ({point: its tarball}) into `folder`.

    Each file is replaced by a rename, so the bundle server never serves half a bundle. With
    `archive`, each bundle is also kept as archive/<revision>/<point>.tar.gz: what `make audit`
    re-checks a hop with, whichever revision decided it.
    """
    folder.mkdir(parents=True, exist_ok=True)
    for point, content in point_bundles.items():
        targets = [folder / bundle_name(point)]
        if archive is not None:
            (archive / revision_name).mkdir(parents=True, exist_ok=True)
            targets.insert(0, archive / revision_name / bundle_name(point))
        for target in targets:
            write_whole(target, content)  # the bundle server never serves half of one


def members(content: bytes) -> dict[str, bytes]:
    """A bundle's files by name."""
    with tarfile.open(fileobj=io.BytesIO(content), mode="r:gz") as tar:
        return {member.name.lstrip("/"): tar.extractfile(member).read() for member in tar.getmembers() if member.isfile()}


def data_of(content: bytes) -> dict:
    """A bundle's data document."""
    return json.loads(members(content)["data.json"])


def unpack(content: bytes, rules: Path) -> dict:
    """A bundle's rule set written under `rules` (as policies/ holds it); its data document."""
    members_by_name = members(content)
    for name, member in members_by_name.items():
        if name in (".manifest", "data.json"):
            continue
        target = rules / name
        if not target.resolve().is_relative_to(rules.resolve()):
            raise BundleError(f"a bundle member names a path outside its folder: {name}")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(member)
    return json.loads(members_by_name["data.json"])
