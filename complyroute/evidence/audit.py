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
  revision the line names), does not allow that hop into that instance. A rule that reads the
  clock reads the time the line records: decided_at, when the deciding point took the hop (its
  Envoy's start of the request, on its clock; its OPA read the clock after it, within the
  decision timeout), or ts (when the instance received the record) on a line without it; so a
  run gets one verdict whenever it is audited.
- not re-checkable: lines of a hop whose decision depends on the record's content (or the
  request id), as OPA's partial evaluation finds (engines/independence.py): a line holds the
  record as a digest only, so they are counted apart and the verdict is never clean.
- path findings: every instance's lines of the run joined by record id. Each line agrees with
  the token it was written under, so only the join sees a record relabelled or re-sent under
  its real id: lines of one record disagreeing on labels or digest, a record received twice at
  one step, a path whose lines name no gateway as a sender (it did not start at the entry), a
  line whose sender is not the previous hop's receiver (it holds no line of the record, or it
  sends records on to another step).

A baseline run has no deciding point: its chains are checked, its receptions are reported as
received without a policy, not as failures, and its paths are not joined (nothing stamps a
sender, and its entry keeps a client's record id, which need not be unique).

The lines and their chains are read by auditlog.py, the path findings are paths.py's; here each
reception is decided and re-checked, and the run's verdict given.
"""

from __future__ import annotations

import json
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from complyroute.engines import independence
from complyroute.engines.contract import EngineError
from complyroute.evidence.auditlog import Line, Problem, hashable, read_chain
from complyroute.evidence.paths import PATH_FINDINGS, describe_paths, gateways_of, next_steps_of, path_findings, records_of
from complyroute.policy import bundles, policydata
from complyroute.policy.policyfiles import POLICIES
from complyroute.runtime.target import runs_root
RECHECK = Path(__file__).with_name("recheck.rego")
QUERY = "data.complyroute_audit.recheck.allowed"
DECISION_FIELDS = ("sender", "decided_by", "revision")
SHOWN_PROBLEMS = 5  # per run and kind


class AuditError(RuntimeError):
    """A folder that is not a run, or a rule set OPA could not evaluate."""


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
    # Lines whose hop the rules decide by the record's content (or the request id), which a line
    # holds only as a digest: not re-checked, and never called clean.
    unverifiable: int = 0
    records: int = 0  # record ids whose lines were joined into a path
    paths: Counter = field(default_factory=Counter)  # path findings by kind
    revisions: Counter = field(default_factory=Counter)
    problems: list[Problem] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return (self.broken_chains == 0 and self.forbidden == 0 and self.undecided == 0 and self.unverifiable == 0
                and not self.paths.total())

    def summary(self) -> str:
        counts = f"{self.lines} lines checked, chains intact {self.chains - self.broken_chains}/{self.chains}"
        if not self.policy:
            return f"{counts}: no policy (nothing decided its receptions){'' if self.clean else ': CHAIN BROKEN'}"
        counts += f", forbidden receptions {self.forbidden}, receptions without a decision {self.undecided}, {describe_paths(self.paths, self.records)}"
        if self.unverifiable:
            counts += f", not re-checkable {self.unverifiable} (the rules read the record's content, which a line holds as a digest)"
        return f"{counts}: {'clean' if self.clean else 'FAILED'}"


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


def allowed_hops(hops: list[dict], point_data: dict[str, dict], policies: Path = POLICIES) -> set[int]:
    """Which hops the rule set allows into their instance: one `opa eval` for all of them."""
    if not hops:
        return set()
    try:
        allowed = policydata.evaluate(QUERY, {"points": point_data, "hops": hops}, policies, modules=(RECHECK,))
    except policydata.PolicyDataError as error:
        raise AuditError(f"OPA could not re-check the audit lines: {error}") from None
    return set(allowed or [])


def is_milliseconds(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def hop_of(line: Line) -> dict:
    entry = line.entry
    labels = entry.get("labels") if isinstance(entry.get("labels"), dict) else {}
    # The time a rule that reads the clock is asked at (ms since the epoch): when the deciding
    # point took the hop (decided_at, its clock), else, for a line written before points
    # recorded it, when the instance received the record (ts).
    at = entry.get("decided_at") if is_milliseconds(entry.get("decided_at")) else entry.get("ts")
    return {
        "point": entry["decided_by"], "sender": entry["sender"], "step": entry.get("step"), "instance": line.instance,
        "labels": dict(sorted(labels.items())),  # by name, as the rule set's label schema names them
        "time_ns": int(at * 1_000_000) if is_milliseconds(at) else None,
    }


def what_decides(rules: Path, point_data: dict[str, dict], hops: list[dict]) -> list[str]:
    """For each hop, what its decision depends on beyond what its line holds, as OPA's partial
    evaluation finds (engines/independence.py): "nothing" (one re-check stands for every line of
    the hop), "clock" (each line re-checked at its own time) or "record" (the record's content or
    the request id: no line of the hop can be re-checked)."""
    asks = [(point_data[hop["point"]], {"labels": {name: value for name, value in hop["labels"].items() if value is not None},
                                        "sender": hop["sender"], "step": hop["step"]}) for hop in hops]
    try:
        left = independence.residuals(rules, asks)
        return ["record" if residual and independence.reads_record(rules, *ask) else "clock" if residual else "nothing"
                for residual, ask in zip(left, asks)]
    except independence.RecordShapeChanged:  # rules from before the platform's record package, or with their own
        return ["record"] * len(hops)
    except EngineError as error:
        raise AuditError(f"OPA could not say what the audit lines' decisions depend on: {error}") from None


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
    # revision that decided it, unless its decision reads the clock (each line at its own time)
    # or the record (no line can be re-checked).
    distinct: dict[tuple, list[Line]] = {}
    for line, key in decided:
        distinct.setdefault(key, []).append(line)
    by_revision: dict[str, list[tuple]] = {}
    for key, owned in distinct.items():
        by_revision.setdefault(owned[0].entry["revision"], []).append(key)
    with tempfile.TemporaryDirectory(prefix="complyroute-audit-") as scratch:
        for revision, keys in sorted(by_revision.items()):
            if progress:
                progress(f"re-checking {len(keys)} distinct hops decided by revision {revision}")
            firsts = [hop_of(distinct[key][0]) for key in keys]
            rules, point_data = rules_of(run_dir, revision, {hop["point"] for hop in firsts}, policies, Path(scratch))
            asked: list[dict] = []
            answering: list[list[Line]] = []  # the lines each asked hop stands for
            for key, first, depends in zip(keys, firsts, what_decides(rules, point_data, firsts)):
                if depends == "record":
                    for line in distinct[key]:
                        verdict.unverifiable += 1
                        verdict.problems.append(Problem(
                            "unverifiable", line.where,
                            f"request {line.entry.get('request_id')}: the rules of revision {revision} decide {first['sender']} -> "
                            f"{line.instance} by the record's content, which the line holds as a digest: not re-checked"))
                elif depends == "clock":
                    asked += [hop_of(line) for line in distinct[key]]
                    answering += [[line] for line in distinct[key]]
                else:
                    asked.append(first)
                    answering.append(distinct[key])
            allowed = allowed_hops(asked, point_data, rules)
            for number, (hop, owned) in enumerate(zip(asked, answering)):
                if number in allowed:
                    continue
                for line in owned:
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


def run_folders(root: Path | None = None) -> list[Path]:
    """Every run folder under `root` (default the runs' root; its current is a link to one of them)."""
    root = root or runs_root()
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and not p.is_symlink() and (p / "state.json").is_file())


def report(verdict: Verdict, out) -> None:
    revisions = ", ".join(sorted(verdict.revisions)) or "none"
    header = f"{verdict.run.name} ({verdict.description}" + (f"; rule set {revisions})" if verdict.policy else "; no deciding point)")
    print(f"{header}: {verdict.summary()}", file=out)
    for kind in ("chain", "undecided", "forbidden", "unverifiable", *PATH_FINDINGS):
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
