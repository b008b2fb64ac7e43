"""Names a rule reads that nothing provides: a rule that reads them can never fire.

A rule set reads its labels by name (`label.region`, `label_values.consent`,
`input.labels.region`), its reference documents by name (`reference.adequacy`,
`data.complyroute.reference.adequacy`) and a candidate's index fields by name
(`candidate.certifications`, `candidates[id].region`: the platform's and the docs' names for a
candidate). A name the label schema, the reference data or the index of the rule set's example
catalogs (its indexing package over examples/catalog*.json; no catalog, no check) lacks
passes `opa check --strict`, Regal and `opa test` of the other rules, and a deploy: the rule
reading it is undefined for every record, silently. This module finds such names in the rule
set's own modules (`opa parse`, with locations), so that `make policy-test`, deploy and reload
refuse them, naming the rule and the name.

It reads syntax to refuse, never to decide what may be precomputed (engines/independence.py asks
OPA for that): a name it cannot see (computed at run time) is left to the rule set's tests.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from complyroute.policy import labels as label_schema, policydata
from complyroute.policy.policyfiles import EXAMPLES, OPA, RULE_SET, content_digest, is_platform, is_test

# The rule set's own readers of a label by name: the compliance package's helper rules and the
# input itself. A constant key after one of these is a label name.
LABEL_READERS = (("label",), ("label_values",), ("input", "labels"))
# And of a reference document by name.
REFERENCE_READERS = (("reference",), ("data", "complyroute", "reference"))
# Any one key in a reader: candidates[id].
ANY = object()
# And of a candidate's index field by name.
FIELD_READERS = (("candidate",), ("candidates", ANY))


# unknown_names' answers by the digest of what it read: every deploy, render and reload asks, mostly of
# the same rule set, and each ask is an `opa parse` per module (45 ms of CPU each here).
_ANSWERS: dict[str, list[str]] = {}


class UnknownName(ValueError):
    """A rule reads a label or a reference document the rule set does not have; the message names them."""


def _ref_parts(terms: list) -> list:
    """A reference's parts: a var or a string as itself, anything else None."""
    return [term["value"] if term["type"] in ("var", "string") else None for term in terms]


def _reads(node, readers: tuple[tuple[str, ...], ...], found: list[tuple[int, str]]) -> None:
    """Appends (row, name) for every constant key read after one of `readers` under `node`: a
    reference (`label.tenant`, `label["tenant"]`) or object.get's second argument."""
    if isinstance(node, list):
        for item in node:
            _reads(item, readers, found)
        return
    if not isinstance(node, dict):
        return
    if node.get("type") == "ref" and isinstance(node.get("value"), list):
        parts = _ref_parts(node["value"])
        for reader in readers:
            matches = len(parts) > len(reader) and all(want is ANY or want == got for want, got in zip(reader, parts))
            if matches and node["value"][len(reader)]["type"] == "string":
                found.append((node.get("location", {}).get("row", 0), parts[len(reader)]))
    terms = node.get("terms") if isinstance(node.get("terms"), list) else (node.get("value") if node.get("type") == "call" else None)
    if isinstance(terms, list) and len(terms) >= 3 and terms[0].get("type") == "ref" and _ref_parts(terms[0]["value"]) == ["object", "get"]:
        source, key = terms[1], terms[2]
        if source.get("type") in ("ref", "var") and key.get("type") == "string":
            path = tuple(_ref_parts(source["value"])) if source["type"] == "ref" else (source["value"],)
            if path in readers:
                found.append((key.get("location", {}).get("row", 0), key["value"]))
    for value in node.values():
        _reads(value, readers, found)


def _modules(policies: Path) -> list[Path]:
    """The rule set's own modules: not the platform's parts, not tests, not examples."""
    return [module for module in sorted((policies / RULE_SET).rglob("*.rego"))
            if not is_test(module) and not is_platform(module.relative_to(policies))]


def unknown_names(policies: Path) -> list[str]:
    """One line per read of a label the schema lacks or a reference document the data lacks:
    "complyroute/compliance/compliance.rego:312 reads label tenant, which the label schema
    lacks (it has: category, consent, region)"; [] when none."""
    modules = _modules(policies)
    reference = policies / RULE_SET / "reference" / "data.json"
    catalogs = sorted((policies / EXAMPLES).glob("catalog*.json"))
    key = content_digest({str(path): path.read_bytes() for path in [*modules, reference, *catalogs]})
    if key not in _ANSWERS:
        _ANSWERS[key] = _unknown_names(policies, modules)
    return list(_ANSWERS[key])


def indexed_fields(policies: Path) -> list[str] | None:
    """The fields the rule set's index gives a candidate, over its example catalogs; None when it
    has no example catalog or no index to ask."""
    fields: set[str] = set()
    asked = False
    for catalog_file in sorted((policies / EXAMPLES).glob("catalog*.json")):
        catalog = json.loads(catalog_file.read_text()).get("complyroute", {}).get("catalog", {})
        try:
            index = policydata.evaluate("data.complyroute.indexing.index(input)", catalog, policies)
        except policydata.PolicyDataError:
            return None  # opa check and the tests report a broken index
        for step in (index or {}).get("steps", {}).values():
            for candidate in step.values():
                fields |= set(candidate)
        asked = asked or index is not None
    return sorted(fields) if asked else None


def _unknown_names(policies: Path, modules: list[Path]) -> list[str]:
    labels = sorted(label.name for label in label_schema.schema(policies))
    documents = sorted(label_schema.reference_of(policies))
    fields = indexed_fields(policies)
    problems = []
    for module in modules:
        parsed = subprocess.run([str(OPA), "parse", "--format", "json", "--json-include", "locations", str(module)],
                                capture_output=True, text=True)
        if parsed.returncode != 0:
            continue  # opa check reports it, with the author's line
        tree = json.loads(parsed.stdout)
        where = module.relative_to(policies)
        for rule in tree.get("rules", []):
            found_labels: list[tuple[int, str]] = []
            found_documents: list[tuple[int, str]] = []
            _reads(rule, LABEL_READERS, found_labels)
            _reads(rule, REFERENCE_READERS, found_documents)
            found_fields: list[tuple[int, str]] = []
            if fields is not None:
                _reads(rule, FIELD_READERS, found_fields)
            for row, name in found_labels:
                if name not in labels:
                    problems.append(f"{where}:{row} reads label {name}, which the label schema lacks (it has: {', '.join(labels)})")
            for row, name in found_documents:
                if name not in documents:
                    problems.append(f"{where}:{row} reads reference document {name}, which the reference data lacks "
                                    f"(it has: {', '.join(documents)})")
            for row, name in found_fields:
                if name not in fields:
                    problems.append(f"{where}:{row} reads index field {name}, which the index of the example catalogs "
                                    f"lacks (it has: {', '.join(fields)})")
    return sorted(set(problems))


def check(policies: Path) -> None:
    """Refuses (UnknownName) a rule set whose rules read a name nothing provides."""
    problems = unknown_names(policies)
    if problems:
        raise UnknownName("a rule reads what no record or document provides, so it can never fire: " + "; ".join(problems))
