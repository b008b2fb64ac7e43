"""The checks of `make policy-test`: `check` (opa check --strict and Regal, with the platform's
parts a rule set lacks) and `test` (the policy tests, their coverage, no name a rule reads that
nothing provides, and the fast paths of each example catalog against the rules)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from complyroute.policy import policyfiles


def check(path: str, opa: str = str(policyfiles.OPA), regal: str = str(policyfiles.REGAL)) -> int:
    """`opa check --strict`, then Regal with the project's configuration, of a rule set's folder
    with the platform's parts it lacks, each read where it is: an error names the author's own
    file and line, not a copy's, and a reference to the platform's rules resolves."""
    folder = policyfiles.source_of(path)
    platform = [str(module) for part in policyfiles.missing_platform(folder) for module in policyfiles.platform_files(part)
                if module.suffix == ".rego" and not policyfiles.is_test(module)]  # the platform's tests are the shipped rules'
    checked = subprocess.run([opa, "check", "--strict", str(folder), *platform])
    if checked.returncode != 0:
        return checked.returncode
    return subprocess.run([regal, "lint", "--config-file", str(policyfiles.REGAL_CONFIG), "--format", "pretty", str(folder), *platform]).returncode


def test(paths_given: list[str], opa: str = str(policyfiles.OPA), threshold: float = 95) -> int:
    """Run the policy tests, then again with coverage; one line per file, failing under the threshold.
    A rule set of rule-sets/ is tested with the platform's parts it runs with (policyfiles.rule_set);
    its coverage counts its own modules. Any other folder of policies is tested as it is."""
    paths, platform = [], set()
    for path in paths_given:
        try:
            complete = policyfiles.rule_set(path)
        except policyfiles.RuleSetError:
            complete = Path(path)  # not a rule set: policies of another kind
        if complete != Path(path) and complete != policyfiles.source_of(path):
            platform |= {str(complete / part) for part in policyfiles.PLATFORM}
        paths.append(str(complete))
    tests = subprocess.run([opa, *policyfiles.test_args(paths)])
    if tests.returncode != 0:
        return tests.returncode
    run = subprocess.run([opa, *policyfiles.test_args(paths, coverage=True)], capture_output=True, text=True)
    try:
        report = json.loads(run.stdout)
    except json.JSONDecodeError:
        print(run.stdout + run.stderr, file=sys.stderr)
        return run.returncode or 1
    own = {path: info for path, info in report.get("files", {}).items()
           if not any(path == part or path.startswith(part + "/") for part in platform)}
    for path, info in sorted(own.items()):
        if not path.endswith("_test.rego"):
            runs = line_runs(info.get("not_covered", []))
            uncovered = [f"{first}-{last}" for first, last in runs]
            rules = rules_at(opa, Path(path), [first for first, _ in runs])
            print(f"  {info.get('coverage', 0):6.2f}%  {path}" + (f"  (not covered: lines {', '.join(uncovered)};"
                                                                    f" rules {', '.join(rules)})" if uncovered else ""))
    total = report.get("coverage", 0)
    if platform:  # the platform's modules are tested with the shipped rule set
        counted = [info for path, info in own.items() if not path.endswith("_test.rego")]
        covered = sum(info.get("covered_lines", 0) for info in counted)
        total = 100 * covered / max(1, covered + sum(info.get("not_covered_lines", 0) for info in counted))
    print(f"policy coverage: {total:.2f}% of lines (threshold {threshold}%)")
    if run.returncode != 0:
        print(run.stderr, file=sys.stderr)
        return run.returncode
    if total < threshold:
        return 1
    return check_names(paths) or check_fast_paths(paths)


def check_names(paths: list[str]) -> int:
    """No rule of a rule set of `paths` reads a label or reference document it lacks (policy/names.py)."""
    from complyroute.policy import names

    failed = 0
    for folder in map(Path, paths):
        if (folder / policyfiles.RULE_SET / "reference" / "data.json").is_file():
            for problem in names.unknown_names(folder):
                print(f"policy-test: {problem}: the rule can never fire", file=sys.stderr)
                failed = 1
    return failed


def line_runs(ranges: list[dict]) -> list[tuple[int, int]]:
    """OPA's not-covered ranges of a module as runs of whole lines, first and last: OPA reports
    spans of columns, several on one line (a rule's head and its body apart)."""
    runs: list[tuple[int, int]] = []
    for row in sorted({row for span in ranges for row in range(span["start"]["row"], span["end"]["row"] + 1)}):
        if runs and row == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], row)
        else:
            runs.append((row, row))
    return runs


def rules_at(opa: str, module: Path, rows: list[int]) -> list[str]:
    """The names of the rules of `module` that hold the given rows (a rule runs from its first
    row to the row before the next rule's)."""
    if not rows:
        return []
    parsed = subprocess.run([opa, "parse", "--format", "json", "--json-include", "locations", str(module)], capture_output=True, text=True)
    if parsed.returncode != 0:
        return ["(unparsed)"]
    starts = sorted((rule["location"]["row"], rule["head"]["name"] if "name" in rule["head"] else rule["head"]["ref"][0]["value"])
                    for rule in json.loads(parsed.stdout).get("rules", []))
    names = []
    for row in rows:
        holding = [name for start, name in starts if start <= row]
        name = holding[-1] if holding else "(before the first rule)"
        if name not in names:
            names.append(name)
    return names


def check_fast_paths(paths: list[str]) -> int:
    """The allowed table and the compiled routes of each example catalog agree with the rules
    (the deploy-time guards, engines/catalog_check.py), for each rule set of `paths`."""
    from complyroute.engines import EngineError, catalog_check

    for folder in map(Path, paths):
        for catalog_file in sorted((folder / policyfiles.EXAMPLES).glob("catalog*.json")):
            catalog = json.loads(catalog_file.read_text())["complyroute"]["catalog"]
            try:
                allowed = catalog_check.check_catalog(catalog, folder)
            except EngineError as error:
                print(f"policy-test: the fast paths disagree with the rules over {catalog_file}: {error}", file=sys.stderr)
                return 1
            print(f"fast paths: {catalog_file}: the allowed table and the compiled routes agree with the rules "
                  f"({allowed} allowed labellings)")
    return 0
