"""The label schema: which labels a rule set reads, and the header each travels in.

A rule set declares its labels in its reference data (policies/complyroute/reference/data.json,
key "labels"; platform.rego documents the fields, and the JSON Schema REFERENCE_SCHEMA, which
this module checks the reference data with, says them too): name -> {"header", "values": the reference
document whose keys are its known values, "multiple", "required", "subsets_of"}. Everything
outside the rule set that handles labels follows this schema, never a list of its own: the
services (which labels they require, log and send on), the Envoy listeners (the size bound on
label headers, the headers a label token's claims are written to), the precomputed decision
space and the compiled routes, the audit and trace. Adding a label takes the schema, the rules
that read it and their tests.

Rule sets written before the schema existed (an older commit that `make policy-diff` compares
with) carry the three labels of the first rule set: LEGACY.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass
from pathlib import Path

from complyroute.topology import fields

REFERENCE_SCHEMA = Path(__file__).with_name("reference.schema.json")

LEGACY = {
    "category": {"header": "x-data-category", "values": "categories", "required": True},
    "consent": {"header": "x-data-consent", "values": "purposes", "multiple": True, "subsets_of": "purposes"},
    "region": {"header": "x-data-region", "values": "regions", "required": True},
}


class LabelSchemaError(ValueError):
    """The rule set's label schema is unusable; the message names the label and the field."""


@dataclass(frozen=True)
class Label:
    name: str
    header: str
    values: str  # the reference document whose keys are the known values
    multiple: bool = False  # a set of values, comma-separated
    required: bool = False  # every record carries it
    subsets_of: str | None = None  # a multiple label: the instance attribute bounding the precomputed sets

    def known(self, reference: dict) -> list[str]:
        """The label's known values, sorted."""
        return sorted(reference.get(self.values, {}))


def reference_of(policies: Path) -> dict:
    """The rule set's reference data (data.complyroute.reference); LabelSchemaError naming the
    file, line and column when it is not JSON (an editor's save seen half-written, a typo)."""
    path = policies / "complyroute" / "reference" / "data.json"
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise LabelSchemaError(f"{path}:{error.lineno}:{error.colno}: not JSON: {error.msg}") from None


def schema(policies: Path) -> tuple[Label, ...]:
    """The rule set's labels, ordered by name (the order the quick path's table and the decision
    space use); LabelSchemaError when the schema is unusable."""
    return schema_of(reference_of(policies))


def refusal(reference: dict) -> str | None:
    """Why REFERENCE_SCHEMA refuses `reference`, by the path of the first part it refuses and
    that part's x-refusal (an unknown field of a label: the nearest known one); None if it does not."""
    errors = sorted(fields.validator_of(REFERENCE_SCHEMA).iter_errors(reference), key=lambda error: (len(error.absolute_path), list(map(str, error.absolute_path))))
    if not errors:
        return None
    error = errors[0]
    where = "reference data" + (": " + ".".join(map(str, error.absolute_path)) if error.absolute_path else "")
    if error.validator == "additionalProperties":
        known = sorted(error.schema.get("properties", {}))
        unknown = sorted(set(error.instance) - set(known))[0]
        nearest = difflib.get_close_matches(unknown, known, n=1)
        return (f"{where}.{unknown}: is not a field of a label (fields: {', '.join(known)})"
                + (f"; did you mean {nearest[0]!r}?" if nearest else ""))
    given = f" {error.instance!r}:" if isinstance(error.instance, str) else ""  # a name or a value the schema refuses
    return f"{where}:{given} {error.schema.get('x-refusal', error.message)}"


def schema_of(reference: dict) -> tuple[Label, ...]:
    problem = refusal(reference)
    if problem:
        raise LabelSchemaError(problem)
    declared = reference.get("labels", LEGACY)
    labels, headers = [], {}
    for name, spec in sorted(declared.items()):
        where = f"reference data: labels.{name}"
        header = spec["header"]
        if header in headers:
            raise LabelSchemaError(f"{where}.header: {header} is labels.{headers[header]}'s header too")
        headers[header] = name
        if not isinstance(reference.get(spec["values"]), dict):
            raise LabelSchemaError(f"{where}.values: {spec['values']!r} names no object of the reference data")
        labels.append(Label(name, header, spec["values"], spec.get("multiple", False), spec.get("required", False), spec.get("subsets_of")))
    return tuple(labels)


def headers(labels: tuple[Label, ...]) -> list[str]:
    return [label.header for label in labels]


def service_setting(labels: tuple[Label, ...]) -> str:
    """The labels as a service instance is told them (COMPLYROUTE_LABELS, services/config.js):
    [{"name", "header", "required"}] in the schema's order."""
    return json.dumps([{"name": label.name, "header": label.header, "required": label.required} for label in labels],
                      separators=(",", ":"))
