"""The rule set as OPA bundles: what every enforcement point's OPA decides with, and reloads.

A point's OPA does not read policies/ from disk. The control plane writes one bundle per
point (the rule set's modules and reference data, the point's index from policydata, the
revision, a manifest), built and signed as `opa build --signing-key` does with the deployment's own
key (new_signing_key; `build`), into the deployment's bundle folder; the bundle server (bundleserver.py)
serves it, and the point's OPA long-polls for it, so a new bundle is decided with about as soon
as it is written, without restarting anything (`make reload-policy`, reload.py). Each OPA
verifies the signature against the deployment's public key (proxy/opa.py bundle_config) and
refuses a bundle that is unsigned, signed by another key or altered: it keeps deciding with the
last one it verified.

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

import functools
import io
import json
import re
import subprocess
import tarfile
import tempfile
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from complyroute.files import write_whole
from complyroute.policy import policyfiles
from complyroute.policy.policyfiles import OPA, POLICIES, RULE_SET, is_test
from complyroute.topology.manifest import REPO

REVISION_PATH = ("complyroute", "revision")
# In a run folder: every bundle the deployment served, by revision (what `make audit` re-checks with).
REVISIONS = "revisions"
PACKAGE = re.compile(r"^package\s+([\w.]+)", re.MULTILINE)
# How bundles are signed: RSA with SHA-256 (PKCS #1 v1.5), whose signature is a function of the
# content and the key, so the same rule set and data under one key give the same bytes (the same
# ETag, on Kubernetes the same ConfigMap); ES256 signs with a random nonce. The key id every
# point's OPA configuration names (proxy/opa.py).
SIGNING_ALGORITHM = "RS256"
SIGNING_KEY_ID = "complyroute-deployment"
# What a bundle holds besides the rule set's files: OPA's manifest and signatures, and data.json,
# into which `opa build` merges every data file (the rule set's reference data with the point's).
BUNDLE_FILES = (".manifest", ".signatures.json", "data.json")
# The documents of a bundle's data.json that are the point's (the rest under data.complyroute
# is the rule set's reference data): its index (policydata) and the revision.
POINT_DOCUMENTS = ("index", REVISION_PATH[1])


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


def new_signing_key() -> bytes:
    """A new bundle signing key (PEM, PKCS #8): one per deployment, which only the control plane holds."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())


# Kept by key: every point of a deployment gets the same one, and loading the private key checks
# the RSA key's consistency (32 ms here), which a render of 50 points did 50 times (1.6 CPU-s).
@functools.cache
def verification_key(signing_key: bytes) -> str:
    """The public key (PEM) a point's OPA verifies bundles signed with `signing_key` against."""
    public = serialization.load_pem_private_key(signing_key, password=None).public_key()
    return public.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()


def build(files: dict[str, bytes], documents: dict[str, dict], revision_name: str, signing_key: bytes) -> dict[str, bytes]:
    """Each point's bundle ({point: its data document}): the rule set's `files`, the point's data
    (with the revision) and a manifest naming the revision and the roots; signed with `signing_key`
    (PEM). One OPA process builds them all (`opa complyroute-bundles`, tools/opa/bundles.go), each
    byte for byte what `opa build --bundle` writes from a folder of those members: it loads,
    compiles and formats the rule set once, where an `opa build` a point did it again (about 30 ms
    of CPU a point). It writes every member with the same fixed time and mode: the same content
    gives the same bytes."""
    if not documents:
        return {}
    with tempfile.TemporaryDirectory(prefix="bundles-") as scratch:  # mode 0700: the key is the deploying user's
        key = Path(scratch) / "signing.key"
        key.write_bytes(signing_key)
        rules, output = Path(scratch) / "rules", Path(scratch) / "bundles"
        output.mkdir()
        for name, content in files.items():
            (rules / name).parent.mkdir(parents=True, exist_ok=True)
            (rules / name).write_bytes(content)
        points = {}
        for point, data in documents.items():
            document = {**data, RULE_SET: {**data.get(RULE_SET, {}), REVISION_PATH[1]: revision_name}}
            points[point] = {"file": bundle_name(point), "manifest": {"revision": revision_name, "roots": roots(files, document)}, "data": document}
        request = {"rules": str(rules), "signing_key": str(key), "signing_alg": SIGNING_ALGORITHM, "output": str(output), "points": points}
        result = subprocess.run([str(OPA), "complyroute-bundles"], input=json.dumps(request), capture_output=True, text=True)
        if result.returncode != 0:
            raise BundleError(f"opa refused the rule set: {result.stderr.strip() or result.stdout.strip()}")
        return {point: (output / bundle_name(point)).read_bytes() for point in documents}


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
    """A bundle's rule set written under `rules` (as policies/ holds it: its modules, and its
    reference data, which `opa build` merged into the bundle's data.json, each document back in a
    data.json of its own); the point's data document, as it was bundled (its index, the revision,
    its other documents), without the rule set's data written under `rules`: OPA loads both, and
    a document in each would not merge."""
    members_by_name = members(content)
    document = json.loads(members_by_name["data.json"])
    rule_set_data = {name: value for name, value in document.get(RULE_SET, {}).items() if name not in POINT_DOCUMENTS}
    written = {name: member for name, member in members_by_name.items() if name not in BUNDLE_FILES}
    written |= {f"{RULE_SET}/{name}/data.json": json.dumps(value).encode() for name, value in rule_set_data.items()}
    for name, member in written.items():
        target = rules / name
        if not target.resolve().is_relative_to(rules.resolve()):
            raise BundleError(f"a bundle member names a path outside its folder: {name}")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(member)
    return {**document, RULE_SET: {name: value for name, value in document.get(RULE_SET, {}).items() if name not in rule_set_data}}
