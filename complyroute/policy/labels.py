"""The label schema: which labels a rule set reads, and the header each travels in.

A rule set declares its labels in its reference data (policies/complyroute/reference/data.json,
key "labels"; compliance.rego documents the fields): name -> {"header", "values": the reference
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

import json
import re
from dataclasses import dataclass
from pathlib import Path

# Claims of the label token that are not labels (envoy.rego label_token_claims): a label may
# not take one's name.
TOKEN_CLAIMS = frozenset({"iss", "exp", "iat", "rid", "digest", "aud", "sub", "nbf", "jti", "kid"})
NAME = re.compile(r"[a-z][a-z0-9_]{0,31}")
# A label header: lowercase (Envoy hands headers to OPA lowercased), not one of complyroute's own.
HEADER = re.compile(r"x-[a-z0-9][a-z0-9-]{0,62}")
OWN_HEADERS = "x-complyroute-"
RESERVED_HEADERS = frozenset({"x-request-id"})  # the record's id, which every part reads as such
FIELDS = {"header", "values", "multiple", "required", "subsets_of", "description"}

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
    """The rule set's reference data (data.complyroute.reference)."""
    return json.loads((policies / "complyroute" / "reference" / "data.json").read_text())


def schema(policies: Path) -> tuple[Label, ...]:
    """The rule set's labels, ordered by name (the order the quick path's table and the decision
    space use); LabelSchemaError when the schema is unusable."""
    return schema_of(reference_of(policies))


def schema_of(reference: dict) -> tuple[Label, ...]:
    declared = reference.get("labels", LEGACY)
    if not isinstance(declared, dict) or not declared:
        raise LabelSchemaError("reference data: labels must be an object naming at least one label")
    labels, headers = [], {}
    for name, spec in sorted(declared.items()):
        where = f"reference data: labels.{name}"
        if not NAME.fullmatch(name) or name in TOKEN_CLAIMS:
            raise LabelSchemaError(f"{where}: a label name is lowercase letters, digits and _ (at most 32), "
                                   f"and none of the label token's own claims {sorted(TOKEN_CLAIMS)}")
        if not isinstance(spec, dict) or set(spec) - FIELDS:
            raise LabelSchemaError(f"{where}: an object with the fields {sorted(FIELDS)}")
        header = spec.get("header")
        if not isinstance(header, str) or not HEADER.fullmatch(header) or header.startswith(OWN_HEADERS) or header in RESERVED_HEADERS:
            raise LabelSchemaError(f"{where}.header: {header!r} is not a lowercase x- header name outside {OWN_HEADERS}* "
                                   f"and {', '.join(sorted(RESERVED_HEADERS))}")
        if header in headers:
            raise LabelSchemaError(f"{where}.header: {header} is labels.{headers[header]}'s header too")
        headers[header] = name
        values = spec.get("values")
        if not isinstance(values, str) or not isinstance(reference.get(values), dict):
            raise LabelSchemaError(f"{where}.values: {values!r} names no object of the reference data")
        for flag in ("multiple", "required"):
            if not isinstance(spec.get(flag, False), bool):
                raise LabelSchemaError(f"{where}.{flag}: true or false")
        subsets_of = spec.get("subsets_of")
        if subsets_of is not None and (not spec.get("multiple") or not isinstance(subsets_of, str)):
            raise LabelSchemaError(f"{where}.subsets_of: an instance attribute's name, for a multiple label only")
        labels.append(Label(name, header, values, spec.get("multiple", False), spec.get("required", False), subsets_of))
    return tuple(labels)


def headers(labels: tuple[Label, ...]) -> list[str]:
    return [label.header for label in labels]


def service_setting(labels: tuple[Label, ...]) -> str:
    """The labels as a service instance is told them (COMPLYROUTE_LABELS, services/config.js):
    [{"name", "header", "required"}] in the schema's order."""
    return json.dumps([{"name": label.name, "header": label.header, "required": label.required} for label in labels],
                      separators=(",", ":"))
