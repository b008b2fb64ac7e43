"""The rule set as bundles (complyroute/policy/bundles.py) and the server that hands them out
(complyroute/policy/bundleserver.py): real OPA building, signing, verifying and reading the
bundles, a real server over mutual TLS."""

import io
import json
import shutil
import socket
import ssl
import subprocess
import tarfile
import threading
import time
import urllib.error
import urllib.request

import pytest

from complyroute.policy import bundles, bundleserver, policyfiles
from complyroute.runtime.local import supervision
from complyroute.topology.manifest import REPO
from complyroute.trust import identity, pki

OPA = str(REPO / "bin" / "opa")
INDEX = {"complyroute": {"index": {"steps": {}}}}
KEY = bundles.new_signing_key()  # a deployment's bundle signing key
REFERENCE = json.loads((policyfiles.POLICIES / "complyroute" / "reference" / "data.json").read_text())


def modified_copy(tmp_path, name, region):
    """policies/ with `region` added to the adequacy list."""
    copy = tmp_path / name
    shutil.copytree(policyfiles.POLICIES, copy)
    reference = copy / "complyroute" / "reference" / "data.json"
    data = json.loads(reference.read_text())
    data["adequacy"].append(region)
    reference.write_text(json.dumps(data))
    return copy


def members(tarball: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(tarball), mode="r:gz") as tar:
        return {m.name.lstrip("/"): tar.extractfile(m).read() for m in tar.getmembers()}


def test_revision_is_the_commit_for_the_committed_rule_set_allowed():
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--", "policies"], capture_output=True, text=True).stdout
    if dirty:
        pytest.skip("policies/ has uncommitted changes here")
    assert bundles.revision() == commit


def test_revision_of_a_changed_rule_set_names_its_content_denied(tmp_path):
    us, ch = modified_copy(tmp_path, "us", "US"), modified_copy(tmp_path, "ch", "XX")
    again = modified_copy(tmp_path, "us-again", "US")
    commit = bundles.revision().split("-dirty.")[0]
    # Inside the repository, a rule set other than its policies/ as committed: the commit, dirty.
    classification = policyfiles.rule_set("classification")
    assert bundles.revision(classification, source=policyfiles.source_of("classification")) == (
        f"{commit}-dirty.{policyfiles.content_digest(bundles.rule_set_files(classification))[:12]}")
    # Outside it (tmp_path is), no commit of the repository holds it: its content alone.
    assert bundles.revision(us) == f"content.{policyfiles.content_digest(bundles.rule_set_files(us))[:12]}"
    assert bundles.revision(us) != bundles.revision(ch)  # two edits, two revisions
    assert bundles.revision(us) == bundles.revision(again)  # the same content, the same revision


def verified(path, key=KEY) -> subprocess.CompletedProcess:
    """OPA's own verification of the bundle at `path` against `key`'s public key (opa build reads a
    bundle it is given verifying its signature, as a point's OPA does before it activates one)."""
    public = path.with_suffix(".pub.pem")
    public.write_text(bundles.verification_key(key))
    return subprocess.run([OPA, "build", "--bundle", str(path), "--verification-key", str(public), "--verification-key-id",
                           bundles.SIGNING_KEY_ID, "--signing-alg", bundles.SIGNING_ALGORITHM, "--output", str(path.with_suffix(".out"))],
                          capture_output=True, text=True)


def test_bundle_carries_the_rule_set_the_index_and_the_revision_allowed(tmp_path):
    content = members(bundle(INDEX, "r-1"))
    manifest = json.loads(content[".manifest"])
    assert manifest["revision"] == "r-1"
    assert manifest["roots"] == ["complyroute/compliance", "complyroute/envoy", "complyroute/index", "complyroute/indexing",
                                 "complyroute/record", "complyroute/reference", "complyroute/revision"]
    # opa build merges the rule set's reference data into the bundle's data.json.
    assert json.loads(content["data.json"]) == {"complyroute": {"index": {"steps": {}}, "revision": "r-1", "reference": REFERENCE}}
    assert "complyroute/envoy/envoy.rego" in content and ".signatures.json" in content
    # Real OPA reads it: the revision where the policy looks for it.
    path = tmp_path / "point.tar.gz"
    path.write_bytes(bundle(INDEX, "r-1"))
    result = subprocess.run([OPA, "eval", "--format", "raw", "--bundle", str(path), "data.complyroute.envoy.revision"],
                            capture_output=True, text=True)
    assert result.returncode == 0 and result.stdout.strip() == "r-1", result.stderr


def test_the_same_bundle_made_at_another_time_is_the_same_bytes_allowed():
    """Its ETag, and on Kubernetes its ConfigMap, stay the same for the same content under one key:
    a reload of an unchanged rule set changes nothing (RS256 signs without a nonce; opa build
    stamps no time)."""
    first = bundle(INDEX, "r-1")
    time.sleep(1.1)
    assert bundle(INDEX, "r-1") == first


def test_another_revision_is_another_bundle_denied():
    assert bundle(INDEX, "r-2") != bundle(INDEX, "r-1")


def test_a_bundle_verifies_against_its_deployments_key_allowed(tmp_path):
    path = tmp_path / "point.tar.gz"
    path.write_bytes(bundle(INDEX, "r-1"))
    result = verified(path)
    assert result.returncode == 0, result.stderr


def test_an_altered_unsigned_or_foreign_bundle_does_not_verify_denied(tmp_path):
    """What a point's OPA refuses: a byte of the data changed after signing, a bundle without
    signatures, one signed by another deployment's key."""
    signed = members(bundle(INDEX, "r-1"))
    altered = {**signed, "data.json": signed["data.json"].replace(b'"r-1"', b'"r-9"')}
    unsigned = {name: content for name, content in signed.items() if name != ".signatures.json"}
    for name, (content, reason) in {"altered": (altered, "digest mismatch"), "unsigned": (unsigned, "missing .signatures.json")}.items():
        path = tmp_path / f"{name}.tar.gz"
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
            for member, data in content.items():
                info = tarfile.TarInfo(f"/{member}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        path.write_bytes(buffer.getvalue())
        result = verified(path)
        assert result.returncode != 0 and reason in result.stdout + result.stderr, (name, result.stdout, result.stderr)
    foreign = tmp_path / "foreign.tar.gz"
    foreign.write_bytes(bundle(INDEX, "r-1", key=bundles.new_signing_key()))
    result = verified(foreign)
    assert result.returncode != 0 and "verification error" in result.stdout + result.stderr


def test_unpack_gives_back_the_rule_set_as_policies_holds_it_allowed(tmp_path):
    """The audit re-checks with an archived bundle's rules: its reference data back in a file of
    its own, the point's document returned as it was bundled, without the reference data, which
    OPA loading both would not merge (a body-reading rule's audit asks OPA so: independence.reads_record)."""
    document = bundles.unpack(bundle(INDEX, "r-1"), tmp_path / "rules")
    assert document == {"complyroute": {"index": {"steps": {}}, "revision": "r-1"}}
    assert json.loads((tmp_path / "rules" / "complyroute" / "reference" / "data.json").read_text()) == REFERENCE
    assert bundles.rule_set_files(tmp_path / "rules").keys() == bundles.rule_set_files().keys()
    assert not (tmp_path / "rules" / "complyroute" / "index").exists()
    (tmp_path / "point.json").write_text(json.dumps(document))
    result = subprocess.run([OPA, "eval", "--format", "raw", "--data", str(tmp_path / "rules"), "--data", str(tmp_path / "point.json"),
                             "data.complyroute.reference.adequacy[0]"], capture_output=True, text=True)
    assert result.returncode == 0 and result.stdout.strip() == json.dumps(REFERENCE["adequacy"][0]).strip('"'), result.stderr


def test_bundle_leaves_out_tests_system_policies_and_examples_denied():
    content = members(bundle(INDEX, "r-1"))
    assert not [name for name in content if name.endswith("_test.rego") or name.startswith(("system/", "examples/"))]
    # The roots leave data.complyroute.token to what OPA loads from disk (the entry's key).
    assert not any("complyroute/token".startswith(root) for root in json.loads(content[".manifest"])["roots"])


def test_a_package_outside_complyroute_is_refused_denied(tmp_path):
    copy = tmp_path / "policies"
    shutil.copytree(policyfiles.POLICIES, copy)
    (copy / "complyroute" / "stray.rego").write_text("package stray\n\nallow := true\n")
    with pytest.raises(bundles.BundleError, match="stray.rego: its package is not complyroute"):
        bundle(INDEX, "r-1", policies=copy)


def opa_build(folder, files: dict[str, bytes], data: dict, revision: str) -> bytes:
    """A point's bundle as one `opa build --bundle` of a folder holding its members makes it: the
    rule set's files, its data.json (with the revision) and its .manifest, signed with KEY."""
    document = {**data, "complyroute": {**data.get("complyroute", {}), "revision": revision}}
    members = {".manifest": json.dumps({"revision": revision, "roots": bundles.roots(files, document)}).encode(),
               "data.json": json.dumps(document, sort_keys=True).encode(), **files}
    for name, content in members.items():
        (folder / "bundle" / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / "bundle" / name).write_bytes(content)
    (folder / "signing.key").write_bytes(KEY)
    subprocess.run([OPA, "build", "--bundle", ".", "--signing-key", str(folder / "signing.key"), "--signing-alg", bundles.SIGNING_ALGORITHM,
                    "--output", str(folder / "bundle.tar.gz")], cwd=folder / "bundle", check=True, capture_output=True)
    return (folder / "bundle.tar.gz").read_bytes()


def test_every_points_bundle_is_what_opa_build_makes_of_its_folder_allowed(tmp_path):
    """One OPA process builds every point's bundle (opa complyroute-bundles); each is byte for
    byte what `opa build --bundle` writes of its members, numbers, nested documents and all."""
    files = bundles.rule_set_files()
    documents = {
        "entry": INDEX,
        "sidecar-svc-01": {"complyroute": {"index": {"steps": {"step-01": {"svc-01": {"region": "EU", "weight": 1.5, "port": 8443}}}}},
                           "complyroute_quick_path": {"table": {"gateway": {"step-01": {"\u0000": {"destination": "svc-01"}}}}, "keys": [1, 2.0, -3]}},
    }
    built = bundles.build(files, documents, "r-1", KEY)
    assert list(built) == list(documents)
    for point, data in documents.items():
        assert built[point] == opa_build(tmp_path / point, files, data, "r-1"), point


def test_a_points_data_that_clashes_with_the_rule_sets_is_refused_as_opa_build_refuses_it_denied(tmp_path):
    """A point's document where the rule set's reference data is: refused, naming where, as
    `opa build` of its folder refuses it; and a point named as no file can be."""
    clash = {"complyroute": {"reference": "not an object"}}
    with pytest.raises(bundles.BundleError, match="data.complyroute.reference is both the rule set's and the point's"):
        bundles.build(bundles.rule_set_files(), {"entry": clash}, "r-1", KEY)
    with pytest.raises(subprocess.CalledProcessError):
        opa_build(tmp_path, bundles.rule_set_files(), clash, "r-1")
    with pytest.raises(bundles.BundleError, match="is no file name in the output folder"):
        bundles.build(bundles.rule_set_files(), {"../entry": INDEX}, "r-1", KEY)


def bundle(data: dict, revision: str, key: bytes = KEY, policies=policyfiles.POLICIES) -> bytes:
    """A point's bundle of the shipped rule set (or `policies`), as configuration.generate makes it."""
    return bundles.build(bundles.rule_set_files(policies), {"point": data}, revision, key)["point"]


def test_write_replaces_each_bundle_whole(tmp_path):
    bundles.write(tmp_path, {"a": bundle(INDEX, "r-2"), "b": bundle({}, "r-2")}, "r-2")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.tar.gz", "b.tar.gz"]
    assert json.loads(members((tmp_path / "b.tar.gz").read_bytes())["data.json"]) == {"complyroute": {"revision": "r-2", "reference": REFERENCE}}


# ---- the bundle server, over mutual TLS ----------------------------------------------------


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bundles")
    keys = tmp_path_factory.mktemp("pki")
    ca = pki.CertificateAuthority("test")
    (keys / "ca.pem").write_bytes(ca.cert_pem)
    files = {}
    for identity_name in [pki.BUNDLE_SERVER, pki.CONTROL, pki.spiffe_id("point", "a"), pki.spiffe_id("point", "b")]:
        credential = ca.issue(identity_name, hosts=("127.0.0.1",) if identity_name == pki.BUNDLE_SERVER else ())
        stem = identity_name.rsplit("/", 1)[1]
        (keys / f"{stem}.pem").write_bytes(credential.cert_pem)
        (keys / f"{stem}.key").write_bytes(credential.key_pem)
        files[identity_name] = identity.TlsFiles(str(keys / f"{stem}.pem"), str(keys / f"{stem}.key"), str(keys / "ca.pem"))
    bundles.write(folder, {"a": bundle(INDEX, "r-1")}, "r-1")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    tls = files[pki.BUNDLE_SERVER]
    threading.Thread(target=bundleserver.serve, args=(folder, "127.0.0.1", port, tls.cert, tls.key, tls.ca), daemon=True).start()
    url = f"https://127.0.0.1:{port}"
    deadline = time.monotonic() + 10
    while not supervision.healthy(f"{url}/health", tls=files[pki.CONTROL]):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    return url, folder, files


def get(url, files, as_identity, headers=None):
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10, context=supervision.control_context(files[as_identity])) as answer:
            return answer.status, dict(answer.headers), answer.read()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read()


def test_a_point_reads_its_own_bundle_allowed(server):
    url, folder, files = server
    status, headers, body = get(f"{url}/bundles/a.tar.gz", files, pki.spiffe_id("point", "a"))
    assert status == 200 and headers["Content-Type"] == bundleserver.LONG_POLLING
    assert body == (folder / "a.tar.gz").read_bytes() and headers["ETag"].startswith('"')


def test_a_point_reads_no_other_bundle_and_strangers_do_not_connect_denied(server):
    url, _, files = server
    status, _, body = get(f"{url}/bundles/a.tar.gz", files, pki.spiffe_id("point", "b"))
    assert status == 403 and json.loads(body)["code"] == "PEER_NOT_ALLOWED"
    status, _, body = get(f"{url}/health", files, pki.spiffe_id("point", "a"))
    assert status == 403
    status, _, body = get(f"{url}/etc/passwd", files, pki.spiffe_id("point", "a"))
    assert status == 404 and json.loads(body)["code"] == "NOT_FOUND"
    no_certificate = ssl.create_default_context(cafile=files[pki.CONTROL].ca)
    no_certificate.check_hostname = False
    with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionError)):
        urllib.request.urlopen(f"{url}/bundles/a.tar.gz", timeout=5, context=no_certificate).read()


def test_long_poll_answers_when_the_bundle_changes_allowed(server):
    url, folder, files = server
    point = pki.spiffe_id("point", "a")
    _, headers, _ = get(f"{url}/bundles/a.tar.gz", files, point)
    answers = []
    waiting = threading.Thread(target=lambda: answers.append(
        get(f"{url}/bundles/a.tar.gz", files, point, {"If-None-Match": headers["ETag"], "Prefer": "modes=snapshot;wait=20"})))
    started = time.monotonic()
    waiting.start()
    time.sleep(0.3)
    bundles.write(folder, {"a": bundle(INDEX, "r-2")}, "r-2")
    waiting.join(20)
    status, new_headers, body = answers[0]
    assert status == 200 and time.monotonic() - started < 5
    assert new_headers["ETag"] != headers["ETag"] and json.loads(members(body)[".manifest"])["revision"] == "r-2"


def test_long_poll_without_a_change_ends_in_not_modified_denied(server):
    url, _, files = server
    point = pki.spiffe_id("point", "a")
    _, headers, _ = get(f"{url}/bundles/a.tar.gz", files, point)
    started = time.monotonic()
    status, _, body = get(f"{url}/bundles/a.tar.gz", files, point, {"If-None-Match": headers["ETag"], "Prefer": "wait=1"})
    assert status == 304 and body == b"" and 0.9 < time.monotonic() - started < 5


def test_a_quiet_folder_is_not_read_and_a_rename_into_it_is_seen_allowed(tmp_path, monkeypatch):
    # Only the folder's own mtime can make a look read the files here: nothing counts as recent,
    # and the periodic full read is far away.
    monkeypatch.setattr(bundleserver, "RECENT_NS", 0)
    monkeypatch.setattr(bundleserver, "FULL_SCAN_INTERVAL", 3600.0)
    folder = tmp_path / "bundles"
    folder.mkdir()
    bundles.write(folder, {"a": bundle(INDEX, "r-1")}, "r-1")
    served = bundleserver.Bundles(folder)
    before = served.get("a", None, 0)
    reads = []
    scan = served.scan
    monkeypatch.setattr(served, "scan", lambda: (reads.append(1), scan()))
    threading.Thread(target=served.watch, daemon=True).start()
    time.sleep(20 * bundleserver.WATCH_INTERVAL)
    assert len(reads) == 1  # the first look, which has no folder mtime to compare with
    bundles.write(folder, {"a": bundle(INDEX, "r-2")}, "r-2")
    after = served.get("a", before[0], 5)
    assert after is not None and json.loads(members(after[1])[".manifest"])["revision"] == "r-2"
