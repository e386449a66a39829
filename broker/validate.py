"""Declarative validation of JSON request bodies.

A body schema is a mapping of field name to :class:`Field`.  ``validate`` checks
types, ranges, choices, required fields and rejects unknown fields, raising a
:class:`~broker.errors.ValidationError` that names the first offending field
(dotted path for nested objects, e.g. ``profile.width``).  The same schemas feed
the OpenAPI document, so the documentation cannot drift from what is enforced.

Pure: no I/O.  Invariant: a body that passes has exactly the declared keys
(defaults filled in) with values of the declared types.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from broker.errors import ValidationError

Schema = Mapping[str, "Field"]


@dataclass(frozen=True)
class Field:
    """One JSON field: ``kind`` is one of str, int, number, bool, object, array."""

    kind: str
    required: bool = False
    default: Any = None
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[str, ...] | None = None
    max_length: int | None = None
    pattern_hint: str | None = None
    nullable: bool = False
    schema: Schema | None = None  # for kind == "object"
    items: Field | None = None  # for kind == "array"
    max_items: int | None = None
    description: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict)


def _fail(path: str, detail: str) -> ValidationError:
    return ValidationError(f"{path}: {detail}", field=path)


def _check(path: str, spec: Field, value: Any) -> Any:
    if value is None:
        if spec.nullable:
            return None
        raise _fail(path, "must not be null")
    kind = spec.kind
    if kind == "str":
        if not isinstance(value, str):
            raise _fail(path, "must be a string")
        if spec.max_length is not None and len(value) > spec.max_length:
            raise _fail(path, f"must be at most {spec.max_length} characters")
        if spec.choices is not None and value not in spec.choices:
            raise _fail(path, f"must be one of {', '.join(spec.choices)}")
        return value
    if kind == "bool":
        if not isinstance(value, bool):
            raise _fail(path, "must be a boolean")
        return value
    if kind in ("int", "number"):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise _fail(path, "must be a number" if kind == "number" else "must be an integer")
        if kind == "int" and (isinstance(value, float) and not value.is_integer()):
            raise _fail(path, "must be an integer")
        if isinstance(value, float) and not math.isfinite(value):
            raise _fail(path, "must be finite")
        if spec.minimum is not None and value < spec.minimum:
            raise _fail(path, f"must be >= {spec.minimum:g}")
        if spec.maximum is not None and value > spec.maximum:
            raise _fail(path, f"must be <= {spec.maximum:g}")
        return int(value) if kind == "int" else float(value)
    if kind == "object":
        if not isinstance(value, dict):
            raise _fail(path, "must be an object")
        return validate(value, spec.schema or {}, prefix=path + ".")
    if kind == "array":
        if not isinstance(value, list):
            raise _fail(path, "must be an array")
        if spec.max_items is not None and len(value) > spec.max_items:
            raise _fail(path, f"must have at most {spec.max_items} items")
        item = spec.items or Field("str")
        return [_check(f"{path}[{i}]", item, v) for i, v in enumerate(value)]
    raise AssertionError(f"unknown field kind {kind!r}")


def validate(body: Any, schema: Schema, *, prefix: str = "", partial: bool = False) -> dict[str, Any]:
    """Check ``body`` against ``schema``; return a new dict with defaults filled in.

    ``partial`` skips the required check and default filling (for PATCH-like merges).
    """
    if not isinstance(body, dict):
        raise ValidationError(f"{prefix.rstrip('.') or 'body'}: must be a JSON object",
                              field=prefix.rstrip(".") or "body")
    for key in body:
        if key not in schema:
            raise _fail(prefix + str(key), "unknown field")
    out: dict[str, Any] = {}
    for name, spec in schema.items():
        path = prefix + name
        if name in body:
            out[name] = _check(path, spec, body[name])
        elif partial:
            continue
        elif spec.required:
            raise _fail(path, "is required")
        else:
            out[name] = spec.default
    return out


def to_json_schema(schema: Schema) -> dict[str, Any]:
    """The JSON Schema (OpenAPI 3.1 dialect) of a body schema."""
    props: dict[str, Any] = {}
    required: list[str] = []
    for name, spec in schema.items():
        props[name] = _field_schema(spec)
        if spec.required:
            required.append(name)
    out: dict[str, Any] = {"type": "object", "properties": props, "additionalProperties": False}
    if required:
        out["required"] = required
    return out


_KIND_TYPES = {"str": "string", "int": "integer", "number": "number", "bool": "boolean",
               "object": "object", "array": "array"}


def _field_schema(spec: Field) -> dict[str, Any]:
    if spec.kind == "object":
        out = to_json_schema(spec.schema or {})
    else:
        out = {"type": _KIND_TYPES[spec.kind]}
    if spec.nullable:
        out["type"] = [out["type"], "null"]
    if spec.kind == "array":
        out["items"] = _field_schema(spec.items or Field("str"))
        if spec.max_items is not None:
            out["maxItems"] = spec.max_items
    if spec.minimum is not None:
        out["minimum"] = spec.minimum
    if spec.maximum is not None:
        out["maximum"] = spec.maximum
    if spec.choices is not None:
        out["enum"] = list(spec.choices)
    if spec.max_length is not None:
        out["maxLength"] = spec.max_length
    if spec.default is not None:
        out["default"] = spec.default
    if spec.description:
        out["description"] = spec.description
    out.update(spec.extra)
    return out
