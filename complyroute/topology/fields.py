"""What a topology manifest may hold: its JSON Schema (topologies/topology.schema.json), and the
refusal of a manifest the schema refuses, by the field's path and, for an unknown field, the
nearest known one. manifest.py asks it before it reads a field; editors read the same schema.
"""

from __future__ import annotations

import difflib
import functools
import json
from pathlib import Path

import jsonschema

SCHEMA = Path(__file__).resolve().parents[2] / "topologies" / "topology.schema.json"


@functools.cache
def validator_of(path: Path) -> jsonschema.protocols.Validator:
    """The JSON Schema in the file `path` as a validator, the schema checked once against its
    meta-schema (the manifests', and the reference data's: policy/labels.py)."""
    schema = json.loads(path.read_text())
    validator = jsonschema.validators.validator_for(schema)
    validator.check_schema(schema)
    return validator(schema)


def schema_validator() -> jsonschema.protocols.Validator:
    """The manifests' JSON Schema (SCHEMA)."""
    return validator_of(SCHEMA)


def _subschema(schema: dict, path: list) -> dict:
    """The part of the schema that describes the value at `path` (keys and list indexes)."""
    root = schema_validator().schema
    for part in path:
        if "$ref" in schema:
            schema = root["$defs"][schema["$ref"].rsplit("/", 1)[1]]
        if isinstance(part, int):
            schema = next((option["items"] for option in schema.get("oneOf", [schema]) if "items" in option), {})
        else:
            schema = schema.get("properties", {}).get(part, {})
    if "$ref" in schema:
        schema = root["$defs"][schema["$ref"].rsplit("/", 1)[1]]
    return schema


def refusal(raw: dict) -> str | None:
    """Why the schema refuses the manifest `raw`, None when it does not: an unknown field, named
    with its path and the nearest known field; a value of the wrong type, out of range or not
    among the choices."""
    def specific(error):  # of a value no option of a oneOf takes, what the option that got furthest says
        while error.validator == "oneOf" and error.context:
            deepest = max(len(e.absolute_path) for e in error.context)
            furthest = [e for e in error.context if len(e.absolute_path) == deepest]
            error = jsonschema.exceptions.best_match([e for e in furthest if e.validator != "type"] or furthest)
        return error

    errors = sorted(map(specific, schema_validator().iter_errors(raw)),
                    key=lambda error: (len(error.absolute_path), list(map(str, error.absolute_path))))
    for error in errors:
        path = list(error.absolute_path)
        where = ".".join(f"[{part}]" if isinstance(part, int) else part for part in path).replace(".[", "[")
        if error.validator == "additionalProperties":
            known = sorted(_subschema(schema_validator().schema, path).get("properties", {}))
            for field_name in sorted(set(error.instance) - set(known)):
                named = f"{where}.{field_name}" if where else field_name
                return f"field '{named}': is not a field of a manifest; {_nearest(field_name, known)}"
        if error.validator == "required":
            missing = sorted(set(error.validator_value) - set(error.instance))[0]
            return f"field '{where}.{missing}': is required" if where else f"field '{missing}': is required"
        return f"field '{where or '(the manifest)'}': {error.message}"
    return None


def _nearest(name: str, known: list[str]) -> str:
    """The nearest field to a misspelt `name`: among `known` (the fields where it stands), else
    wherever the schema has it (a field written under the wrong heading), else the fields here."""
    near = difflib.get_close_matches(name, known, n=1)
    if near:
        return f"did you mean '{near[0]}'?"
    elsewhere = [path for path in _field_paths(schema_validator().schema) if path.rsplit(".", 1)[-1] == name]
    if elsewhere:
        return f"it is a field of {elsewhere[0].rsplit('.', 1)[0]}: did you mean '{elsewhere[0]}'?"
    return f"the fields here are {', '.join(known)}"


def _field_paths(schema: dict, prefix: str = "") -> list[str]:
    """Every field the schema describes, by its path ("engine.kind"; a service's as services[].id)."""
    root = schema_validator().schema
    if "$ref" in schema:
        schema = root["$defs"][schema["$ref"].rsplit("/", 1)[1]]
    found = []
    for name, part in schema.get("properties", {}).items():
        path = f"{prefix}.{name}" if prefix else name
        found.append(path)
        found += _field_paths(part, path)
        for option in part.get("oneOf", []):
            if "items" in option:
                found += _field_paths(option["items"], f"{path}[]")
    return found


