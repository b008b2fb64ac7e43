"""What a rule set's decision reads beyond the decision space (precompute.py enumerates).

The allowed table holds the rule set's answers for every labelling of a listener's space, so
it may be built only when no rule the compliance entrypoints depend on reads what the space
does not enumerate: the record beyond its being a JSON object, the request id, the clock or
another non-deterministic built-in. `unenumerated_reads` finds such reads from each module's
syntax tree (`opa parse`), following every reference from the entrypoints.
"""

from __future__ import annotations

import functools
import json
import subprocess
from collections import defaultdict
from pathlib import Path

from complyroute.engines.contract import EngineError
from complyroute.policy.policyfiles import OPA, content_digest, is_test

ENTRYPOINTS = ("data.complyroute.compliance.decision", "data.complyroute.compliance.canonical_labels")

# unenumerated_reads' answers by the digest of the modules it read: every deployment, render and
# reload of a compiled engine asks, mostly of the same rule set, and each ask is an `opa parse`
# per module (45 ms of CPU each here). A copy of a rule set elsewhere is the same rule set.
_READS: dict[str, list[str]] = {}


@functools.cache  # what the one OPA binary marks; it does not change while a process runs
def nondeterministic_builtins() -> frozenset[str]:
    """The built-ins OPA itself marks non-deterministic (http.send, time.now_ns, rand.intn, ...)."""
    result = subprocess.run([str(OPA), "capabilities", "--current"], capture_output=True, text=True, check=True)
    return frozenset(builtin["name"] for builtin in json.loads(result.stdout)["builtins"] if builtin.get("nondeterministic"))


def _ref_path(terms: list) -> list:
    return [term["value"] if term["type"] in ("var", "string") else None for term in terms]


def _reads(node, nondeterministic: set[str], found: list[str], where: str) -> None:
    """Appends to `found` every read under `node` (a module's JSON AST) that the space does not
    enumerate. `input.record` whole as the argument of is_object or type_name is a read of its
    being an object: the quick path checks the body for that."""
    if isinstance(node, list):
        for item in node:
            _reads(item, nondeterministic, found, where)
        return
    if not isinstance(node, dict):
        return
    terms = node.get("terms") if "terms" in node else (node.get("value") if node.get("type") == "call" else None)
    if isinstance(terms, list) and terms and isinstance(terms[0], dict) and terms[0].get("type") == "ref":
        operator = ".".join(str(part) for part in _ref_path(terms[0]["value"]))
        if operator in nondeterministic:
            found.append(f"{where} calls {operator}")
        args = terms[1:]
        if (operator in ("is_object", "type_name") and len(args) == 1 and args[0].get("type") == "ref"
                and _ref_path(args[0]["value"]) == ["input", "record"]):
            args = []  # whether the record is an object: the quick path checks it
        for arg in args:
            _reads(arg, nondeterministic, found, where)
        for key, value in node.items():
            if key not in ("terms", "value"):
                _reads(value, nondeterministic, found, where)
        return
    if node.get("type") == "var" and node["value"] == "input":  # the whole input, as a value
        found.append(f"{where} reads input")
        return
    if node.get("type") == "ref":
        path = _ref_path(node["value"])
        if path[0] == "input":
            field = path[1] if len(path) > 1 else None
            if field not in ("labels", "sender", "step"):  # the space enumerates these
                shown = ".".join(part if part is not None else "[...]" for part in path)
                found.append(f"{where} reads {shown}")
        _reads(node["value"][1:], nondeterministic, found, where)  # dynamic keys
        return
    for value in node.values():
        _reads(value, nondeterministic, found, where)


def _rule_modules(policies: Path) -> list[Path]:
    """The rule set's modules, tests and examples left out."""
    return [module for module in sorted(policies.rglob("*.rego"))
            if not is_test(module) and "examples" not in module.relative_to(policies).parts]


def _parsed_rules(policies: Path, modules: list[Path]) -> dict[str, list[tuple[dict, str, dict]]]:
    """Every rule of the rule set's `modules`, by its path ("data.pkg.name"): [(rule, where,
    names)], names being what a bare name means in its module (its package's rules, its imports)."""
    parsed_modules = []
    for module in modules:
        result = subprocess.run([str(OPA), "parse", "--format", "json", "--json-include", "locations", str(module)],
                                capture_output=True, text=True)
        if result.returncode != 0:
            raise EngineError(f"OPA could not parse {module}: {result.stderr.strip()}")
        parsed_modules.append((module, json.loads(result.stdout)))
    rules: dict[str, list] = defaultdict(list)
    for module, tree in parsed_modules:
        package = ".".join(str(part) for part in _ref_path(tree["package"]["path"]))
        names = {}
        for imported in tree.get("imports", []):
            path = [str(part) for part in _ref_path(imported["path"]["value"])]
            names[imported.get("alias") or path[-1]] = ".".join(path)
        own = [(rule, ".".join(str(part) for part in _ref_path(rule["head"].get("ref") or [{"type": "var", "value": rule["head"]["name"]}])))
               for rule in tree.get("rules", [])]
        names.update({name.split(".")[0]: f"{package}.{name.split('.')[0]}" for _, name in own})
        for rule, name in own:
            row = rule.get("location", {}).get("row", "?")
            rules[f"{package}.{name}"].append((rule, f"{module.relative_to(policies)}:{row} {name}", names))
    return rules


def _referenced(node, names: dict[str, str], found: set[str]) -> None:
    """Adds to `found` the data paths every reference under `node` names (a bare name through
    `names`: a rule of its package, an import)."""
    if isinstance(node, list):
        for item in node:
            _referenced(item, names, found)
        return
    if not isinstance(node, dict):
        return
    if node.get("type") == "var" and node["value"] in names:  # a bare name
        found.add(names[node["value"]])
    elif node.get("type") == "ref" and node["value"] and node["value"][0].get("type") == "var":
        path = []
        for part in _ref_path(node["value"]):
            if part is None:
                break
            path.append(str(part))
        head = path[0]
        if head == "data":
            found.add(".".join(path))
        elif head in names:
            found.add(".".join([names[head], *path[1:]]))
    for value in node.values():
        _referenced(value, names, found)


def unenumerated_reads(policies: Path) -> list[str]:
    """What the rules the compliance entrypoints depend on read beyond the decision space, one
    line each ("compliance.rego:309 exclusions reads input.record.age"); [] when a table may
    be built.

    The rules are found from each module's syntax tree (`opa parse`), following every reference
    from the entrypoints (`opa deps` follows no `else`); a name that could be a rule is taken
    for one."""
    modules = _rule_modules(policies)
    key = content_digest({str(module.relative_to(policies)): module.read_bytes() for module in modules})
    if key not in _READS:
        _READS[key] = _reads_of(policies, modules)
    return list(_READS[key])


def _reads_of(policies: Path, modules: list[Path]) -> list[str]:
    """unenumerated_reads of `modules`, asking OPA."""
    rules = _parsed_rules(policies, modules)
    closure: set[str] = set()
    pending = list(ENTRYPOINTS)
    while pending:
        wanted = pending.pop()
        for path in rules:  # a reference names a rule, a part of one, or a package of rules
            if path in closure or not (wanted == path or wanted.startswith(path + ".") or path.startswith(wanted + ".")):
                continue
            closure.add(path)
            found: set[str] = set()
            for rule, _, names in rules[path]:
                _referenced(rule, names, found)
            pending += found
    nondeterministic = nondeterministic_builtins()
    reads: list[str] = []
    for path in sorted(closure):
        for rule, where, _ in rules[path]:
            _reads(rule, nondeterministic, reads, where)
    return sorted(set(reads))
