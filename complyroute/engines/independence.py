"""Which of the rule set's allowed answers OPA itself finds independent of what a table cannot hold.

The allowed table (precompute.py) answers a hop from its labels, its sender and its step alone.
That is sound for a labelling only when the decision there reads nothing else: not the record's
content, not the request id, not the clock or another non-deterministic built-in, not a document
a point holds that the decision space does not (the table itself, the entry's token key). Whether
it does is OPA's to say, not a reading of the rules' syntax: for each allowed labelling of each
deciding listener, OPA partially evaluates the compliance entrypoint (its decision and canonical
labels) with

- known: the labels, the listener's sender and step, the rule set and the point's data document,
  as the full path would have them;
- unknown: `input.record`, `input.request_id`, `data.complyroute_quick_path.table` and
  `data.complyroute.token`.

OPA never evaluates a non-deterministic built-in during partial evaluation (its default), so a
clock read is left over like a read of an unknown. An answer OPA evaluates completely (its
result binds both values to constants, with no support rules) cannot differ from the answer at
run time, whatever the record, the id or the time; any residual means it could, and that
labelling is not tabled: the point's OPA decides it in full, with the body. OPA's residuals are
conservative (a rule whose dependencies mention the record is left over even where it would not
fire), never the other way round.

Before a labelling is asked, OPA's static view of the decision may answer for all of them at
once (`beyond_the_space`): its dependency analysis (`opa deps`) lists every base document the
query can read through every rule it reaches, and its planner (`opa build -t plan`) every
built-in the query's plan can call. A decision that can read none of the unknowns and call no
built-in OPA's capabilities mark non-deterministic is completely evaluated at every labelling,
so none is asked; a decision that can is asked labelling by labelling, as above. The static
view is coarser (a rule that reads the record for one labelling makes every labelling asked,
and partial evaluation then tables those it does not read it for), except for a built-in a rule
replaces with `with`: the plan calls none, where partial evaluation leaves any `with` over.

The record's content is unknown, its shape is not: the quick path takes a record only when its
body is a JSON object, and the full path denies any other (RECORD_MALFORMED). The platform's
package of the record's shape (policies/complyroute/record) says whether it is one; here it
answers "an object" (OBJECT_RECORD), in a copy of the rule set where it replaces the platform's
package and nothing else. A rule set whose own copy of that package differs from the platform's
gets no table: what it says of a record would not be what OPA was asked under.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from complyroute.engines.contract import EngineError
from complyroute.policy import bundles
from complyroute.policy.policyfiles import ASSEMBLED, OPA, POLICIES, RECORD_SHAPE, content_digest, ignore_flags, is_test
from complyroute.topology import localhttp

# What OPA's partial evaluation treats as unknown: what a hop carries beside its labels, sender and
# step, and the documents a point may hold that the decision space does not.
UNKNOWNS = ("input.record", "input.request_id", "data.complyroute_quick_path.table", "data.complyroute.token")
# What is asked, each value bound to a variable: the documents, as OPA's planner names its entrypoints.
DECIDED = {"decision": "complyroute/compliance/decision", "canonical": "complyroute/compliance/canonical_labels"}
QUERY = "; ".join(f"{name} = data.{entrypoint.replace('/', '.')}" for name, entrypoint in DECIDED.items())
BOUND = set(DECIDED)
# The platform's record package as partial evaluation asks under it: every record an object.
OBJECT_RECORD = Path(__file__).with_name("object_record.rego")
START_TIMEOUT_S = 60
REQUEST_TIMEOUT_S = 60

Labelling = tuple[str, str, tuple]


def order(labelling: Labelling) -> tuple:
    """How labellings are ordered wherever they are listed: point, listener, then the labels (absent first)."""
    return labelling[0], labelling[1], [value or "" for value in labelling[2]]


class RecordShapeChanged(EngineError):
    """The rule set carries its own package of the record's shape, not the platform's."""


def _ground(term: dict) -> bool:
    """Whether a term of OPA's JSON AST is a constant: no variable, reference, call or comprehension."""
    kind, value = term["type"], term.get("value")
    if kind in ("null", "boolean", "number", "string"):
        return True
    if kind in ("array", "set"):
        return all(_ground(item) for item in value)
    if kind == "object":
        return all(_ground(key) and _ground(item) for key, item in value)
    return False


def completely_evaluated(result: dict) -> bool:
    """Whether OPA's partial evaluation of QUERY (its /v1/compile `result`) left nothing to
    evaluate: one query, no support rules, each expression binding one of QUERY's variables to a
    constant. Anything else (no query: undefined; several: alternatives; a saved expression; a
    support rule) is a residual."""
    queries = result.get("queries") or []
    if len(queries) != 1 or result.get("support"):
        return False
    bound = set()
    for expression in queries[0]:
        terms = expression.get("terms")
        if expression.get("negated") or expression.get("with") or not isinstance(terms, list) or len(terms) != 3:
            return False
        operator, left, right = terms
        if operator != {"type": "ref", "value": [{"type": "var", "value": "eq"}]}:
            return False
        variable, constant = (left, right) if left["type"] == "var" else (right, left)
        if variable["type"] != "var" or variable["value"] not in BOUND or not _ground(constant):
            return False
        bound.add(variable["value"])
    return bound == BOUND


def asked_copy(policies: Path) -> Path:
    """The rule set as partial evaluation asks it: its own files, the platform's record package
    replaced by OBJECT_RECORD (under build/rule-sets/, named by content)."""
    own = policies / RECORD_SHAPE
    platform = POLICIES / RECORD_SHAPE
    shipped = {path.relative_to(platform): path.read_bytes() for path in sorted(platform.rglob("*.rego")) if not is_test(path)}
    held = {path.relative_to(own): path.read_bytes() for path in sorted(own.rglob("*.rego")) if not is_test(path)} if own.is_dir() else {}
    if held != shipped:
        raise RecordShapeChanged(f"the rule set's {RECORD_SHAPE}/ differs from the platform's (policies/{RECORD_SHAPE}/): "
                                 "no answer is precomputed under a record shape of its own")
    files = {path.relative_to(policies): path.read_bytes() for path in sorted(policies.rglob("*"))
             if path.is_file() and RECORD_SHAPE not in path.relative_to(policies).parents}
    files[RECORD_SHAPE / "record.rego"] = OBJECT_RECORD.read_bytes()
    copy = ASSEMBLED / f"asked-{content_digest({str(name): content for name, content in files.items()})[:16]}"
    if not copy.is_dir():
        partial = Path(tempfile.mkdtemp(dir=ASSEMBLED.parent if ASSEMBLED.parent.is_dir() else None, prefix=".asked-"))
        for name, content in files.items():
            (partial / name).parent.mkdir(parents=True, exist_ok=True)
            (partial / name).write_bytes(content)
        ASSEMBLED.mkdir(parents=True, exist_ok=True)
        try:
            partial.rename(copy)
        except OSError:  # another process made the same copy first
            shutil.rmtree(partial, ignore_errors=True)
    return copy


@contextlib.contextmanager
def _opa_server(copy: Path):
    """An OPA serving `copy` (asked_copy's) on a unix socket in a private folder."""
    folder = Path(tempfile.mkdtemp(prefix="complyroute-asked-"))
    socket_path = folder / "opa.sock"
    log = (folder / "opa.log").open("w")
    process = subprocess.Popen([str(OPA), "run", "--server", f"--addr=unix://{socket_path}", "--unix-socket-perm=600",
                                "--skip-version-check", "--log-level=error", *ignore_flags(), str(copy)],
                               stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "GOGC": "400"},
                               preexec_fn=lambda: os.nice(10))
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            with contextlib.suppress(OSError):
                if localhttp.request(localhttp.url(str(socket_path)) + "/health", timeout=2)[0] == 200:
                    break
            if process.poll() is not None or time.monotonic() > deadline:
                log.flush()
                raise EngineError(f"OPA could not serve the rule set for partial evaluation: {(folder / 'opa.log').read_text().strip()[-600:]}")
            time.sleep(0.05)
        yield str(socket_path)
    finally:
        process.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=10)
        if process.poll() is None:
            process.kill()
            process.wait()
        log.close()
        shutil.rmtree(folder, ignore_errors=True)


def _ask(connection: localhttp.UnixConnection, method: str, path: str, body: dict) -> dict:
    connection.request(method, path, body=json.dumps(body), headers={"content-type": "application/json"})
    answer = connection.getresponse()
    content = answer.read()
    if answer.status >= 300:
        raise EngineError(f"OPA's partial evaluation failed ({method} {path}: {answer.status}): {content.decode(errors='replace')[:400]}")
    return json.loads(content) if content else {}


def _place_point_data(connection: localhttp.UnixConnection, document: dict, placed: set[str]) -> set[str]:
    """The point's data document into the server's store, beside the rule set's own data: each
    top-level document whole, but data.complyroute, whose reference data the rule set holds, by
    key; what an earlier point's document placed and this one lacks is removed. The paths placed."""
    paths = {}
    for name, value in document.items():
        if name == "complyroute":
            paths.update({f"complyroute/{key}": part for key, part in value.items()})
        else:
            paths[name] = value
    for path in sorted(placed - set(paths)):
        connection.request("DELETE", f"/v1/data/{path}")
        connection.getresponse().read()
    for path, value in paths.items():
        _ask(connection, "PUT", f"/v1/data/{path}", value)
    return set(paths)


def dependent(space: dict, labellings: list[Labelling], policies: Path) -> list[Labelling]:
    """Of `labellings` (point, listener, a value per label of `space`: decision_space.rego's
    input), those whose answer OPA cannot evaluate completely without what a table does not hold
    (the module's docstring). RecordShapeChanged when the rule set's record package is not the
    platform's."""
    asks = []
    for point, listener, values in labellings:
        entry = space["points"][point]
        pinned = entry["listeners"][listener]
        labels = {name: value for (name, _), value in zip(space["labels"], values) if value is not None}
        asks.append((entry["data"], {"labels": labels, "sender": pinned["sender"], "step": pinned["step"]}))
    left = residuals(policies, asks)
    found = [labelling for labelling, residual in zip(labellings, left) if residual]
    return sorted(found, key=order)


def residuals(policies: Path, asks: list[tuple[dict, dict]]) -> list[bool]:
    """For each (a point's data document, a hop: {"labels", "sender", "step"}), whether OPA's
    partial evaluation of the decision there leaves a residual: none anywhere when OPA's static
    view finds nothing beyond the space the decision could depend on (beyond_the_space), else
    asked. Two OPAs side by side (two cores here), each asked half of them."""
    copy = asked_copy(policies)  # refuses a record shape of the rule set's own before any OPA starts
    if not asks or beyond_the_space(copy) is None:
        return [False] * len(asks)
    numbered = list(enumerate(asks))
    with ThreadPoolExecutor(max_workers=2) as pool:
        halves = list(pool.map(lambda half: _residuals(copy, half), [numbered[0::2], numbered[1::2]]))
    left = [False] * len(asks)
    for half in halves:
        for number in half:
            left[number] = True
    return left


@functools.cache
def beyond_the_space(copy: Path) -> str | None:
    """What OPA's static view of the decision in `copy` (asked_copy's, named by its content) finds
    it could depend on beyond the decision space: the first document of UNKNOWNS its dependency
    analysis says it can read, or the non-deterministic built-ins its plan can call, or why OPA
    could not tell; None when nothing."""
    with tempfile.TemporaryDirectory(prefix="complyroute-static-") as scratch:
        deps = subprocess.run([str(OPA), "deps", "--format", "json", "--data", str(copy), *ignore_flags(), QUERY],
                              capture_output=True, text=True)
        if deps.returncode != 0:
            return f"OPA's dependency analysis failed: {(deps.stderr or deps.stdout).strip()[:400]}"
        for reference in json.loads(deps.stdout).get("base") or []:
            reached = [unknown for unknown in UNKNOWNS if may_read(reference, unknown)]
            if reached:
                return f"it can read {reached[0]}"
        plan_file = Path(scratch) / "plan.tar.gz"
        plan = subprocess.run([str(OPA), "build", "--target", "plan", *(f"--entrypoint={entrypoint}" for entrypoint in DECIDED.values()),
                               *ignore_flags(), "--output", str(plan_file), str(copy)], capture_output=True, text=True)
        if plan.returncode != 0:
            return f"OPA's planner failed: {(plan.stderr or plan.stdout).strip()[:400]}"
        planned = json.loads(bundles.members(plan_file.read_bytes())["plan.json"])
    called, dynamic = calls(planned, DECIDED.values())
    if dynamic:
        return "its plan calls a function it names at run time"
    nondeterministic = sorted(called & nondeterministic_builtins())
    if nondeterministic:
        return f"it can call {', '.join(nondeterministic)}"
    return None


def may_read(reference: list[dict], unknown: str) -> bool:
    """Whether a base document reference of OPA's dependency analysis (its JSON AST) may read
    `unknown` (a dotted path), a part of it or a document holding it: at each position they share,
    the same name, or a term that is not a constant (a variable: any key)."""
    for position, (term, name) in enumerate(zip(reference, unknown.split("."))):
        if (position == 0 or term["type"] in ("string", "number", "boolean", "null")) and term["value"] != name:
            return False
    return True


def calls(plan: dict, entrypoints) -> tuple[set[str], bool]:
    """The built-ins OPA's plan (its IR, `opa build -t plan`) can call from `entrypoints`, through
    every function it can call, and whether it can call a function named at run time."""
    functions = {function["name"]: function for function in plan["funcs"].get("funcs") or []}
    pending = [entry for entry in plan["plans"]["plans"] if entry["name"] in set(entrypoints)]
    seen: set[str] = set()
    builtins: set[str] = set()
    dynamic = False
    while pending:
        for statement in statements(pending.pop()):
            if statement["type"] == "CallDynamicStmt":
                dynamic = True
            elif statement["type"] == "CallStmt":
                name = statement["stmt"]["func"]
                if name not in functions:
                    builtins.add(name)
                elif name not in seen:
                    seen.add(name)
                    pending.append(functions[name])
    return builtins, dynamic


def statements(node):
    """Every statement within a node of OPA's IR, however deeply its blocks nest."""
    if isinstance(node, dict):
        if isinstance(node.get("type"), str) and "stmt" in node:
            yield node
        for value in node.values():
            yield from statements(value)
    elif isinstance(node, list):
        for value in node:
            yield from statements(value)


@functools.cache
def nondeterministic_builtins() -> frozenset[str]:
    """The built-ins this OPA's capabilities mark non-deterministic (the clock, randomness, the network)."""
    capabilities = subprocess.run([str(OPA), "capabilities", "--current"], capture_output=True, text=True, check=True)
    return frozenset(builtin["name"] for builtin in json.loads(capabilities.stdout)["builtins"] if builtin.get("nondeterministic"))


def _residuals(copy: Path, asks: list[tuple[int, tuple[dict, dict]]]) -> list[int]:
    """residuals' work for one OPA: the numbers of the asks left over, each data document placed once."""
    by_data: dict[str, tuple[dict, list[tuple[int, dict]]]] = {}
    for number, (document, hop) in asks:
        by_data.setdefault(json.dumps(document, sort_keys=True), (document, []))[1].append((number, hop))
    left: list[int] = []
    if not by_data:
        return left
    with _opa_server(copy) as socket_path:
        connection = localhttp.UnixConnection(socket_path, REQUEST_TIMEOUT_S)
        try:
            placed: set[str] = set()
            for document, hops in by_data.values():
                placed = _place_point_data(connection, document, placed)
                for number, hop in hops:
                    result = _ask(connection, "POST", "/v1/compile", {"query": QUERY, "input": hop, "unknowns": list(UNKNOWNS)})
                    if not completely_evaluated(result.get("result", {})):
                        left.append(number)
        finally:
            connection.close()
    return left


def reads_record(policies: Path, document: dict, hop: dict) -> bool:
    """Whether the decision for `hop` (a point's data `document`, {"labels", "sender", "step"})
    depends on the record's content or the request id, the clock and the other non-deterministic
    built-ins evaluated (`opa eval --partial --nondeterminstic-builtins`, which the compile API
    does not offer): what an audit line, which holds the record as a digest only, cannot re-check.
    A residual left by residuals() and none here means the clock alone."""
    with tempfile.TemporaryDirectory(prefix="complyroute-asked-") as scratch:
        data_file = Path(scratch) / "data.json"
        data_file.write_text(json.dumps(document))
        command = [str(OPA), "eval", "--partial", "--nondeterminstic-builtins", "--format", "json",
                   *(f"--unknowns={unknown}" for unknown in UNKNOWNS), "--data", str(asked_copy(policies)), "--data", str(data_file),
                   *ignore_flags(), "--stdin-input", QUERY]
        result = subprocess.run(command, input=json.dumps(hop), capture_output=True, text=True)
    if result.returncode != 0:
        raise EngineError(f"OPA's partial evaluation failed: {(result.stderr or result.stdout).strip()[:400]}")
    partial = json.loads(result.stdout).get("partial", {})
    return not completely_evaluated({"queries": partial.get("queries"), "support": partial.get("modules")})

