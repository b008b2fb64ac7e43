"""The policy bundle: where the policies are, what of them OPA loads, and how OPA is run.

policies/ holds the rule set (complyroute/, which the points get in their bundles: bundles.py),
the enforcement points' own policies (system/: the REST API's authorization, the decision
log's mask, which each point's OPA loads from disk), the tests beside every module and example
inputs. Everything that loads policies/ or starts an OPA over it asks this module what to
load and how, the Makefile's policy targets too (`complyroute policy-test`, `complyroute decide`).
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from complyroute.topology.manifest import REPO

if TYPE_CHECKING:
    from complyroute.topology.plan import Endpoint

OPA = REPO / "bin" / "opa"  # opa-envoy-plugin, as `make setup` builds it (tools/opa/go.mod)
REGAL = REPO / "bin" / "regal"
REGAL_CONFIG = REPO / ".regal" / "config.yaml"  # the project's lint configuration, for any rule-set folder
POLICIES = REPO / "policies"
RULE_SET = "complyroute"  # the rule set's folder in policies/: the rest is not in a bundle
# The enforcement point's own policies, which OPA loads from disk beside its bundle: the REST
# API's authorization (system.authz). They are not the rule set: a reload leaves them, and a
# test's or the bench's stand-in rule set runs with them too.
SYSTEM_POLICIES = POLICIES / "system"
EXAMPLES = "examples"  # example inputs and a catalog (policies/examples/), JSON that is not data
# Rule sets besides the shipped one (`policy=<name>`): each a folder like policies/ that holds
# its own rules (complyroute/compliance/compliance.rego, complyroute/indexing,
# complyroute/reference), not the platform's parts (PLATFORM), which rule_set() adds.
RULE_SETS = REPO / "rule-sets"
# What every rule set runs with, written once in policies/: the compliance package's platform
# module (the entrypoint, the decision's assembly, the label and record checks, the helpers: a
# rule set's own compliance.rego in the same package adds its exclusions), the Envoy adapter
# (which reads the rule set's entrypoint and label schema), the record's shape as the platform
# reads it (what the quick path checks of a body, and OPA's partial evaluation assumes:
# engines/independence.py) and the enforcement points' own policies. Folders, but for the
# platform module, a file in the rule set's own package folder.
RECORD_SHAPE = Path(RULE_SET) / "record"
PLATFORM_MODULE = Path(RULE_SET) / "compliance" / "platform.rego"
PLATFORM = (PLATFORM_MODULE, Path(RULE_SET) / "envoy", RECORD_SHAPE, Path("system"))
ASSEMBLED = REPO / "build" / "rule-sets"
# What of policies/ is not policy: the tests beside each module and the example inputs.
IGNORED = ("*_test.rego", EXAMPLES)
# What `opa test` leaves out: it loads the tests, not the examples.
TEST_IGNORED = (EXAMPLES,)
# One decision in the direct form (policies/README.md): the input is the hop, the catalog comes
# as data, and the index the points get in their bundles is derived from it on the spot.
DIRECT_DECISION = ("data.complyroute.compliance.decision"
                   " with data.complyroute.index as data.complyroute.indexing.index(data.complyroute.catalog)")
# Flags of every point's `opa run --server`, wherever it runs: its REST API asks the rule set's
# system.authz policy (policies/system/authz) about every request, which refuses writes. Its
# REST API and diagnostics listen on unix sockets (plan.Endpoint.unix) that only OPA's
# own user may open (OPA's default, 755, would do: connecting takes write permission; stated).
# --pprof: Go's profiles on that REST API socket (`python -m experiments profile` reads where a
# decision's CPU goes there; a profile holds OPA's code paths, no data).
SERVER_FLAGS = ("--authorization=basic", "--unix-socket-perm=600", "--pprof")
# A point's OPA reads its index on every decision and never writes it: held as OPA's own
# values rather than as JSON, a decision's lookups convert nothing (also under `opa bench`).
RUN_FLAGS = ("--optimize-store-for-read-speed",)


class RuleSetError(ValueError):
    """A rule set that names no folder of rules; the message says what to name."""


def source_of(chosen: str | Path) -> Path:
    """The folder an author edits of a rule set: `chosen` is "policies" (the shipped one), a name
    of RULE_SETS or a folder."""
    folder = Path(chosen)
    if str(chosen) == "policies":
        folder = POLICIES
    elif not folder.is_dir() and (RULE_SETS / str(chosen)).is_dir():
        folder = RULE_SETS / str(chosen)
    if not (folder / RULE_SET / "compliance").is_dir():
        known = ", ".join(["policies", *sorted(p.name for p in RULE_SETS.iterdir() if p.is_dir())]) if RULE_SETS.is_dir() else "policies"
        raise RuleSetError(f"rule set {str(chosen)!r} is no folder holding {RULE_SET}/compliance/: name one of {known}, or a folder")
    return folder


def content_digest(files: dict[str, bytes]) -> str:
    """A digest of files by name: a rule set's content (bundles.revision, an assembled rule set's folder)."""
    digest = hashlib.sha256()
    for name, content in sorted(files.items()):
        digest.update(name.encode() + b"\0" + hashlib.sha256(content).digest())
    return digest.hexdigest()


def rule_set(chosen: str | Path) -> Path:
    """The folder of a rule set, complete (source_of names the choices). A rule set without some of
    the platform's parts gets those from policies/, in a copy under build/rule-sets/ named by its
    content (the adapter's tests left out: they are written against the shipped rules); the
    shipped one, and any folder that holds them, is used as it is."""
    folder = source_of(chosen)
    missing = missing_platform(folder)
    if not missing:
        return folder
    files = {path.relative_to(folder): path.read_bytes() for path in sorted(folder.rglob("*")) if path.is_file()}
    for part in missing:
        files.update({part / path.relative_to(POLICIES / part) if path != POLICIES / part else part: path.read_bytes()
                      for path in platform_files(part) if not (is_test(path) and part.parts[0] == RULE_SET)})
    assembled = ASSEMBLED / f"{folder.resolve().name}-{content_digest({str(name): content for name, content in files.items()})[:16]}"
    if not assembled.is_dir():
        partial = assembled.with_name(f"{assembled.name}.{os.getpid()}.partial")
        shutil.rmtree(partial, ignore_errors=True)
        for name, content in files.items():
            (partial / name).parent.mkdir(parents=True, exist_ok=True)
            (partial / name).write_bytes(content)
        try:
            partial.rename(assembled)
        except OSError:  # another process assembled the same content first
            shutil.rmtree(partial, ignore_errors=True)
    return assembled


def missing_platform(folder: Path) -> list[Path]:
    """The platform's parts a rule set's folder lacks, which rule_set() adds from policies/."""
    missing = [part for part in PLATFORM if not (folder / part).exists()]
    if (folder / RULE_SET / "envoy").is_dir() and PLATFORM_MODULE in missing:
        # A whole policies/ of a revision before the platform module (policy-diff base=...): its
        # compliance package holds the entrypoint and everything it reads, as it is.
        missing.remove(PLATFORM_MODULE)
    return missing


def platform_files(part: Path) -> list[Path]:
    """The files of one of the platform's parts in policies/ (a folder's, or the file itself)."""
    shipped = POLICIES / part
    return [shipped] if shipped.is_file() else [path for path in sorted(shipped.rglob("*")) if path.is_file()]


def is_platform(relative: Path) -> bool:
    """Whether a path relative to a rule set's folder is one of the platform's parts or inside one."""
    return any(relative == part or part in relative.parents for part in PLATFORM)


def ignore_flags(patterns: Sequence[str] = IGNORED) -> list[str]:
    return [f"--ignore={pattern}" for pattern in patterns]


# `opa test`'s own limit, 5 s, is too short on two busy cores: the coverage run of a CI clone
# beside `make k8s-e2e` and an experiment's model stopped with "context deadline exceeded".
TEST_TIMEOUT = "300s"


def test_args(paths: Sequence[str], coverage: bool = False) -> list[str]:
    """`opa test` over `paths` (the rule set's tests), with coverage as JSON when asked."""
    return ["test", f"--timeout={TEST_TIMEOUT}", *(["--coverage", "--format=json"] if coverage else []), *ignore_flags(TEST_IGNORED),
            *paths]


def decide_args(input_file: str, catalog: str, policies: Path = POLICIES) -> list[str]:
    """`opa eval` of one decision in the direct form: `input_file` is the hop, `catalog` the
    instances (policies/examples/catalog.json's shape), `policies` the rule set."""
    return ["eval", "--format=pretty", f"--data={policies}", f"--data={catalog}", f"--input={input_file}",
            *ignore_flags(), DIRECT_DECISION]


def is_test(path: Path) -> bool:
    return path.name.endswith("_test.rego")


def system_policy_files() -> list[Path]:
    """The files of SYSTEM_POLICIES a point's OPA loads: its modules and data, not their tests."""
    return [path for path in sorted(SYSTEM_POLICIES.rglob("*"))
            if path.is_file() and path.suffix in (".rego", ".json") and not is_test(path)]


# The Go runtime of an enforcement point's OPA. Each check leaves about 100 kB of garbage, and the
# live heap is small (about 10 MB at a central entity of 5 services), so at Go's default GOGC=100 a
# collection ran every few dozen checks, whose marking took 11 % of the entry's CPU (docs/cost.md);
# at 400, 4 %. GOMEMLIMIT keeps the larger heap this allows under a pod's limit
# (RESOURCES["opa"] in runtime/kubernetes/render.py, 128 Mi): Go collects sooner as it nears it.
# adaptivestackstart: Go starts a goroutine at the average stack its collections find, not at the
# smallest. The plugin's checks run on lasting stream workers (tools/opa/main.go), whose stacks
# stay grown; a check arriving while every worker is busy gets a new goroutine, and starts larger
# with it (docs/cost.md: before the workers, it took the entry's OPA from 1.57 and 1.65 to 1.33 and
# 1.34 ms a record under make bench).
# GOMAXPROCS 1 at every point, whatever its Envoy's workers: a check passes from the gRPC reader
# goroutine to a stream worker and its answer to the writer goroutine; with one thread running Go
# those hand-offs stay on it, with two each could wake the other thread (a futex). The central
# entity's OPA took 15-20 % less CPU a record with 1 than with its Envoy's 2 (docs/cost.md). At
# about 0.6 ms a decision, one thread carries some 1,600 checks a second (docs/cost.md says
# where that binds).
OPA_THREADS = 1
GO_RUNTIME = {"GOMAXPROCS": str(OPA_THREADS), "GOGC": "400", "GOMEMLIMIT": "96MiB", "GODEBUG": "adaptivestackstart=1"}


def server_args(http: Endpoint, diagnostic: Endpoint, config_file: str, paths: Sequence[str],
                ignore: Sequence[str] = IGNORED) -> list[str]:
    """The arguments of an enforcement point's `opa run`, on this machine or in a pod: its REST
    API on `http`, its health and metrics on `diagnostic`, its configuration (the bundle it
    fetches), and the files under `paths` it loads from disk less `ignore`."""
    return [
        "run", "--server", f"--addr={http.listen}", f"--diagnostic-addr={diagnostic.listen}",
        *SERVER_FLAGS, f"--config-file={config_file}", "--skip-version-check", "--log-level=error", *RUN_FLAGS,
        *ignore_flags(ignore), *paths,
    ]
