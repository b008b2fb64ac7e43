"""Check what a run's audit lines say: every chain intact, every reception decided and allowed.

Every service instance appends one line per record it accepted to runs/<run>/audit/<instance>.jsonl
(services/src/audit.js): the labels it received, the digest of the record, the request id, who
sent the record, which enforcement point decided the hop and with which revision of the rule set,
and "prev", the SHA-256 of the line before it in the file (GENESIS for the first).

A run's verdict:

- chains intact: in every file, every line's "prev" is the hash of the bytes of the line before
  it. An edited, removed or inserted line breaks the chain at the line after it (the last line
  of a file has no line after it: see docs/architecture.md, Audit lines).
- receptions without a decision: lines that name no deciding point, sender or revision, or name
  a point that does not decide hops from that sender into that instance (the run's state.json
  says which point decides what). A record that bypassed the enforcement points.
- forbidden receptions: the rule set, asked again (recheck.rego, one `opa eval` per revision
  for a run's distinct hops, with the rule set and the data each point decided with under the
  revision the line names), does not allow that hop into that instance.
- path findings: every instance's lines of the run joined by record id. Each line agrees with
  the token it was written under, so only the join sees a record relabelled or re-sent under
  its real id: lines of one record disagreeing on labels or digest, a record received twice at
  one step, a path whose lines name no gateway as a sender (it did not start at the entry), a
  line whose sender is not the previous hop's receiver (it holds no line of the record, or it
  sends records on to another step).

A baseline run has no deciding point: its chains are checked, its receptions are reported as
received without a policy, not as failures, and its paths are not joined (nothing stamps a
sender, and its entry keeps a client's record id, which need not be unique).

Over 400 lines, one idea: the three checks above read the same lines of one run and report
into one result; split, each would take the run's lines, revisions and catalogs apart again.
"""

from __future__ import annotations

import hashlib
import json
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from complyroute.policy import bundles, policydata
from complyroute.policy.policyfiles import POLICIES
from complyroute.topology.manifest import REPO

RUNS = REPO / "runs"
RECHECK = Path(__file__).with_name("recheck.rego")
QUERY = "data.complyroute_audit.recheck.allowed"
GENESIS = "0" * 64  # the "prev" of a file's first line (services/src/audit.js GENESIS)
DECISION_FIELDS = ("sender", "decided_by", "revision")
PROGRESS_EVERY = 100_000  # lines: how often a long run reports how far it got
SHOWN_PROBLEMS = 5  # per run and kind
# What the join of a record's lines can find (path_findings), in the order it looks: lines
# disagreeing on the labels, on the digest; received twice at one step; no line sent by a
# gateway; a line whose sender holds no line of the record.
PATH_FINDINGS = ("labels", "digest", "twice", "entry", "sender")


class AuditError(RuntimeError):
    """A folder that is not a run, or a rule set OPA could not evaluate."""


@dataclass(frozen=True)
class Problem:
    kind: str  # chain | undecided | forbidden | one of PATH_FINDINGS
    where: str  # file:line; for a path finding every line involved, comma-separated
    detail: str


@dataclass
class Line:
    where: str
    instance: str  # the instance whose log holds it
    entry: dict


@dataclass
class Verdict:
    run: Path
    policy: bool  # False: a run without deciding points (the baseline)
    description: str
    lines: int = 0
    chains: int = 0
    broken_chains: int = 0
    forbidden: int = 0
    undecided: int = 0
    records: int = 0  # record ids whose lines were joined into a path
    paths: Counter = field(default_factory=Counter)  # path findings by kind
    revisions: Counter = field(default_factory=Counter)
    problems: list[Problem] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return self.broken_chains == 0 and self.forbidden == 0 and self.undecided == 0 and not self.paths.total()

    def summary(self) -> str:
        counts = f"{self.lines} lines checked, chains intact {self.chains - self.broken_chains}/{self.chains}"
        if not self.policy:
            return f"{counts}: no policy (nothing decided its receptions){'' if self.clean else ': CHAIN BROKEN'}"
        counts += f", forbidden receptions {self.forbidden}, receptions without a decision {self.undecided}, {describe_paths(self.paths, self.records)}"
        return f"{counts}: {'clean' if self.clean else 'FAILED'}"


def describe_paths(paths: Counter, records: int) -> str:
    """The path findings as a verdict prints them: "path findings 3 in 4 records (labels 1, twice 1, sender 1)"."""
    kinds = ", ".join(f"{kind} {paths[kind]}" for kind in PATH_FINDINGS if paths[kind])
    return f"path findings {paths.total()} in {records} records" + (f" ({kinds})" if kinds else "")


def line_hash(raw: bytes) -> str:
    return hashlib.sha256(raw).hexdigest()


def read_chain(path: Path, name: str, progress=None) -> tuple[int, list[Line], list[Problem]]:
    """How many lines one instance's log has, those that are JSON objects, and the links that do not hold.

    After a broken link the chain is followed on from the line that broke it, so each
    edit, removal or insertion is reported once.
    """
    lines, problems = [], []
    expected = GENESIS
    number = 0
    with path.open("rb") as file:
        for number, raw in enumerate(file, 1):
            where = f"{name}:{number}"
            raw = raw.removesuffix(b"\n")
            try:
                entry = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError):
                entry = None
            if not isinstance(entry, dict):
                problems.append(Problem("chain", where, "not a JSON object"))
            elif "prev" not in entry:
                problems.append(Problem("chain", where, "no prev: not a chained audit line"))
            elif entry["prev"] != expected:
                problems.append(Problem("chain", where, "prev is not the hash of the line before it" if number > 1 else "the first line does not start from the genesis"))
            if isinstance(entry, dict):
                lines.append(Line(where, path.stem, entry))
            expected = line_hash(raw)
            if progress and number % PROGRESS_EVERY == 0:
                progress(f"{name}: {number} lines")
    return number, lines, problems


def undecided_because(line: Line, points: dict[str, dict]) -> str | None:
    """Why no deciding point stands behind a line, or None when one does."""
    entry = line.entry
    missing = [name for name in DECISION_FIELDS if not isinstance(entry.get(name), str) or not entry[name]]
    if missing:
        return f"no {', '.join(missing)}: no enforcement point decided this hop"
    if entry.get("instance") != line.instance:
        return f"the line names {entry.get('instance')!r} in the log of {line.instance}"
    point = points.get(entry["decided_by"])
    if point is None:
        return f"{entry['decided_by']!r} is no enforcement point of this run"
    if line.instance not in point["destinations"] or entry["sender"] not in point["senders"]:
        return f"{entry['decided_by']} decides no hop from {entry['sender']} into {line.instance}"
    return None


def gateways_of(points: dict[str, dict]) -> set[str]:
    """The senders no point delivers to: the catalog's gateways, the senders of a record's first hop.

    Every instance of an enforcing run receives its records from a point (its lines are
    otherwise receptions without a decision), so a sender no point names as a destination is
    where records come from outside: the entry's clients.
    """
    senders = {sender for point in points.values() for sender in point["senders"]}
    return senders - {instance for point in points.values() for instance in point["destinations"]}


def next_steps_of(state: dict) -> dict[str, str]:
    """{instance: the step it sends records on to ("" at the last step)}, from the services'
    configuration the run's state.json keeps."""
    services = (part.get("env") or {} for part in state.get("parts", []))
    return {env["INSTANCE_ID"]: env.get("NEXT_STEP", "") for env in services if "INSTANCE_ID" in env}


def records_of(lines: list[Line]) -> dict[str, list[Line]]:
    """Every line by the id of the record it was written for. A service writes a string id on
    every line; a line without one names no record, and is in no path (its chain link and its
    decision are still checked)."""
    records: dict[str, list[Line]] = {}
    for line in lines:
        request_id = line.entry.get("request_id")
        if isinstance(request_id, str):
            records.setdefault(request_id, []).append(line)
    return records


def path_findings(request_id: str, lines: list[Line], gateways: set[str], next_steps: dict[str, str]) -> list[Problem]:
    """What the lines of one record, written by the instances it reached, say of its path.

    Each line agrees with the token it was written under; a record sent on again under its
    real id with another (forged) token leaves lines that are each allowed, and only their
    join tells. A path cut short (denied at a later hop, or its next hop failed) is a whole
    path as far as it goes: nothing is asked of the lines that are not there.
    """
    findings = []
    entries = [line.entry for line in lines]
    for kind in ("labels", "digest"):
        values = [entry.get(kind) for entry in entries]
        if values.count(values[0]) < len(values):
            findings.append(path_problem(kind, request_id, lines, f"its lines disagree on the {kind}: " + "; ".join(
                f"{value} at {', '.join(where)}" for value, where in grouped(lines, kind).items())))

    steps = [hashable(entry.get("step")) for entry in entries]
    if len(set(steps)) < len(steps):
        for step in dict.fromkeys(steps):
            received = [line for line, at in zip(lines, steps) if at == step]
            if len(received) > 1:
                findings.append(path_problem("twice", request_id, received, f"received {len(received)} times at step {received[0].entry.get('step')}: " + ", ".join(
                    line.instance for line in by_time(received))))

    # The path starts where a gateway sent the record (the entry decided that hop); every
    # later hop's sender is an instance that received the record itself, so holds a line of
    # it, and sends records on to this line's step (the step is checked here because where one
    # point decides every hop, the central entity, the decision check cannot tell which step it
    # decides a sender's hops into).
    senders = [hashable(entry.get("sender")) for entry in entries]
    receivers = [line.instance for line in lines]
    start = None
    if not any(sender in gateways for sender in senders):
        start = by_time(lines)[0]
        findings.append(path_problem("entry", request_id, [start],
                                     f"no line of it was sent by a gateway ({', '.join(sorted(gateways)) or 'none in this run'}): "
                                     f"its earliest, at {start.instance}, was sent by {start.entry.get('sender')}"))
    for line, sender in zip(lines, senders):
        if sender in gateways or line is start:  # the start of a path not from the entry is reported once, above
            continue
        # A line's own instance is no sender of it: it needs another line of that instance.
        if sender not in receivers or (sender == line.instance and receivers.count(sender) == 1):
            findings.append(path_problem("sender", request_id, [line],
                                         f"{line.instance} received it from {line.entry.get('sender')}, which holds no line of it: not the previous hop's receiver"))
        elif sender in next_steps and next_steps[sender] != line.entry.get("step"):
            findings.append(path_problem("sender", request_id, [line], f"{line.instance} received it at step {line.entry.get('step')} from {sender}, "
                                         f"which sends records on to step {next_steps[sender] or '(none: the last)'}: not the previous hop's receiver"))
    return findings


def path_problem(kind: str, request_id: str, lines: list[Line], detail: str) -> Problem:
    return Problem(kind, ", ".join(line.where for line in by_time(lines)), f"request {request_id}: {detail}")


def hashable(value):
    """A field of a line as a key: a string (or null) as it is; anything else a forged line may
    hold (a list, a number) as its JSON text in a tuple, which equals no string."""
    return value if value is None or isinstance(value, str) else (json.dumps(value, sort_keys=True),)


def grouped(lines: list[Line], name: str) -> dict[str, list[str]]:
    """{a field's value as JSON: where the lines holding it are}, in order of time."""
    groups: dict[str, list[str]] = {}
    for line in by_time(lines):
        groups.setdefault(json.dumps(line.entry.get(name), sort_keys=True), []).append(line.where)
    return groups


def by_time(lines: list[Line]) -> list[Line]:
    """In order of reception ("ts", when the instance received the record)."""
    return sorted(lines, key=reception_time)


def reception_time(line: Line) -> float:
    ts = line.entry.get("ts")
    return ts if isinstance(ts, (int, float)) else float("inf")  # a line without a time: last


def allowed_hops(hops: list[dict], point_data: dict[str, dict], policies: Path = POLICIES) -> set[int]:
    """Which hops the rule set allows into their instance: one `opa eval` for all of them."""
    if not hops:
        return set()
    try:
        allowed = policydata.evaluate(QUERY, {"points": point_data, "hops": hops}, policies, modules=(RECHECK,))
    except policydata.PolicyDataError as error:
        raise AuditError(f"OPA could not re-check the audit lines: {error}") from None
    return set(allowed or [])


def hop_of(line: Line) -> dict:
    entry = line.entry
    labels = entry.get("labels") if isinstance(entry.get("labels"), dict) else {}
    return {
        "point": entry["decided_by"], "sender": entry["sender"], "step": entry.get("step"), "instance": line.instance,
        "labels": dict(sorted(labels.items())),  # by name, as the rule set's label schema names them
    }


def hop_key(line: Line) -> tuple:
    """What makes a decided line's hop (hop_of) and the revision that decided it distinct, as a key."""
    entry = line.entry
    labels = entry.get("labels") if isinstance(entry.get("labels"), dict) else {}
    return (entry["revision"], entry["decided_by"], entry["sender"], hashable(entry.get("step")), line.instance,
            *((name, hashable(value)) for name, value in sorted(labels.items())))


def audit_run(run_dir: Path, policies: Path = POLICIES, progress=None) -> Verdict:
    """The verdict over one run folder (it holds state.json and audit/)."""
    state_file = run_dir / "state.json"
    if not state_file.is_file():
        raise AuditError(f"{run_dir} is not a run folder (no state.json)")
    state = json.loads(state_file.read_text())
    points = {p["name"]: p for p in state.get("points", []) if p.get("senders")}
    # Runs recorded before the state said whether they enforce: only the baseline did not.
    policy = state.get("enforces", state.get("kind") != "baseline")
    verdict = Verdict(run_dir, policy, f"{state.get('topology', '?')}, {state.get('engine', 'envoy-opa')}")

    lines: list[Line] = []
    for path in sorted((run_dir / "audit").glob("*.jsonl")):
        count, read, broken = read_chain(path, f"audit/{path.name}", progress)
        lines += read
        verdict.lines += count
        verdict.chains += 1
        verdict.broken_chains += bool(broken)
        verdict.problems += broken
    if not policy:
        return verdict

    decided: list[tuple[Line, tuple]] = []  # each with its hop's key
    for line in lines:
        reason = undecided_because(line, points)
        if reason:
            verdict.undecided += 1
            verdict.problems.append(Problem("undecided", line.where, f"request {line.entry.get('request_id')}: {reason}"))
        else:
            decided.append((line, hop_key(line)))
            verdict.revisions[line.entry["revision"]] += 1

    # Most lines repeat a few hops: each distinct one is asked once, with the rule set of the
    # revision that decided it.
    distinct: dict[tuple, tuple[str, int]] = {}
    hops: dict[str, list[dict]] = {}
    for line, key in decided:
        if key not in distinct:
            revision = line.entry["revision"]
            distinct[key] = (revision, len(hops.setdefault(revision, [])))
            hops[revision].append(hop_of(line))
    allowed: dict[str, set[int]] = {}
    with tempfile.TemporaryDirectory(prefix="complyroute-audit-") as scratch:
        for revision, asked in sorted(hops.items()):
            if progress:
                progress(f"re-checking {len(asked)} distinct hops decided by revision {revision}")
            rules, point_data = rules_of(run_dir, revision, {hop["point"] for hop in asked}, policies, Path(scratch))
            allowed[revision] = allowed_hops(asked, point_data, rules)
    for line, key in decided:
        revision, number = distinct[key]
        if number not in allowed[revision]:
            hop = hops[revision][number]
            verdict.forbidden += 1
            verdict.problems.append(Problem(
                "forbidden", line.where,
                f"request {line.entry.get('request_id')}: the rules do not allow {hop['sender']} -> {line.instance} "
                f"(step {hop['step']}, labels {json.dumps(hop['labels'])}), decided by {hop['point']} under revision {revision}",
            ))

    records = records_of(lines)
    verdict.records = len(records)
    gateways, next_steps = gateways_of(points), next_steps_of(state)
    for request_id, joined in records.items():
        for finding in path_findings(request_id, joined, gateways, next_steps):
            verdict.paths[finding.kind] += 1
            verdict.problems.append(finding)
    return verdict


def rules_of(run_dir: Path, revision: str, points: set[str], policies: Path, scratch: Path) -> tuple[Path, dict[str, dict]]:
    """The rule set and each point's data that revision `revision` decided with.

    A deployment keeps every bundle it served (run folder: revisions/<revision>/<point>.tar.gz,
    bundles.py), so lines decided before a reload are checked with the rules of their time.
    A run from before bundles has none: its points' data files and `policies` stand in.
    """
    archived = run_dir / bundles.REVISIONS / revision
    if archived.is_dir():
        rules = scratch / revision
        point_data = {}
        for name in sorted(points):
            bundle = archived / bundles.bundle_name(name)
            if not bundle.is_file():
                raise AuditError(f"{run_dir}: no {bundle.relative_to(run_dir)}, the bundle point {name} decided with under revision {revision}")
            point_data[name] = bundles.unpack(bundle.read_bytes(), rules)
        return rules, point_data
    point_data = {}
    for name in sorted(points):
        data_file = run_dir / "points" / name / "data" / "data.json"
        if not data_file.is_file():
            raise AuditError(f"{run_dir}: no bundle of revision {revision} and no {data_file.relative_to(run_dir)}, the data point {name} decided with")
        point_data[name] = json.loads(data_file.read_text())
    return policies, point_data


def run_folders(root: Path = RUNS) -> list[Path]:
    """Every run folder under runs/ (runs/current is a link to one of them)."""
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and not p.is_symlink() and (p / "state.json").is_file())


def report(verdict: Verdict, out) -> None:
    revisions = ", ".join(sorted(verdict.revisions)) or "none"
    header = f"{verdict.run.name} ({verdict.description}" + (f"; rule set {revisions})" if verdict.policy else "; no deciding point)")
    print(f"{header}: {verdict.summary()}", file=out)
    for kind in ("chain", "undecided", "forbidden", *PATH_FINDINGS):
        problems = [p for p in verdict.problems if p.kind == kind]
        for problem in problems[:SHOWN_PROBLEMS]:
            print(f"  {kind}: {problem.where}: {problem.detail}", file=out)
        if len(problems) > SHOWN_PROBLEMS:
            print(f"  {kind}: ... and {len(problems) - SHOWN_PROBLEMS} more", file=out)


def main(run_dirs: list[Path], policies: Path = POLICIES, out=sys.stdout, err=sys.stderr) -> int:
    """Audit every run folder given (default: every one under runs/); 0 when every verdict is clean."""
    folders = run_dirs or run_folders()
    if not folders:
        print("audit: no run folders (deploy a topology, or run the end-to-end tests, first)", file=out)
        return 0
    verdicts, unreadable = [], []
    for number, folder in enumerate(folders, 1):
        print(f"audit: [{number}/{len(folders)}] {folder}", file=err)
        try:
            verdicts.append(audit_run(folder, policies, progress=lambda message: print(f"audit:   {message}", file=err)))
        except AuditError as error:  # one folder that cannot be audited does not hide the others' verdicts
            unreadable.append(folder)
            print(f"{folder.name}: cannot be audited: {error}", file=out)
            continue
        report(verdicts[-1], out)
    enforced = [v for v in verdicts if v.policy]
    total = (
        f"{sum(v.lines for v in verdicts)} lines checked, "
        f"chains intact {sum(v.chains - v.broken_chains for v in verdicts)}/{sum(v.chains for v in verdicts)}, "
        f"forbidden receptions {sum(v.forbidden for v in enforced)}, "
        f"receptions without a decision {sum(v.undecided for v in enforced)}, "
        f"{describe_paths(sum((v.paths for v in enforced), Counter()), sum(v.records for v in enforced))}"
    )
    failed = len([v for v in verdicts if not v.clean]) + len(unreadable)
    print(f"audit: {len(verdicts)} runs ({len(verdicts) - len(enforced)} without policy"
          f"{f', {len(unreadable)} more that cannot be audited' if unreadable else ''}): {total}: "
          f"{'clean' if not failed else f'FAILED ({failed} runs)'}", file=out)
    return 1 if failed else 0
