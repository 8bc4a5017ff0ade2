"""JSON schemas for constrained output: which keywords are enforced, and the output grammar.

llama.cpp's JSON-schema-to-grammar conversion enforces types, properties,
required, additionalProperties, items/prefixItems with minItems/maxItems,
enum/const, anyOf/oneOf (as a choice), allOf (merging object properties),
local ``$ref``, string pattern, minLength/maxLength and the uuid and date/time
formats.  It silently ignores the rest (numeric bounds, ``not``,
``if``/``then``/``else``, ``patternProperties``, ``uniqueItems``, …): a schema
using those is refused with a 400 naming the keyword, never run unconstrained.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bubo.domain.generation import GrammarSpec
from bubo.errors import InvalidRequest

from .gbnf import THINK_BODY, thinking_prefix

__all__ = ["check_schema", "output_grammar"]

_ENFORCED = frozenset(
    {
        "type", "properties", "required", "additionalProperties", "items", "prefixItems", "minItems",
        "maxItems", "enum", "const", "anyOf", "oneOf", "allOf", "$ref", "$defs", "definitions", "pattern",
        "minLength", "maxLength", "format",
    }
)  # fmt: skip
_ANNOTATIONS = frozenset(
    {"title", "description", "default", "examples", "$schema", "$id", "$comment", "deprecated", "readOnly",
     "writeOnly", "strict", "name"}
)  # fmt: skip
_FORMATS = frozenset({"uuid", "uuid1", "uuid2", "uuid3", "uuid4", "uuid5", "date", "time", "date-time"})
_TYPES = frozenset({"object", "array", "string", "number", "integer", "boolean", "null"})
_SCHEMA_MAPS = ("properties", "$defs", "definitions")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")


def check_schema(schema: Any, param: str) -> None:
    """Refuse a schema the grammar conversion would not enforce in full.

    Raises:
        InvalidRequest: ``unsupported_schema``, naming the keyword and where it is.

    """
    _check(schema, param, "$")


def _refuse(param: str, where: str, reason: str) -> InvalidRequest:
    return InvalidRequest(
        f"the JSON schema at {where} {reason}; constrained decoding cannot enforce it",
        code="unsupported_schema",
        param=param,
    )


def _check(schema: Any, param: str, where: str) -> None:
    if isinstance(schema, bool):
        return
    if not isinstance(schema, Mapping):
        raise _refuse(param, where, "is not an object")
    for keyword, value in schema.items():
        if keyword in _ANNOTATIONS:
            continue
        if keyword not in _ENFORCED:
            raise _refuse(param, where, f"uses {keyword!r}")
        _check_value(keyword, value, param, where)


def _check_value(keyword: str, value: Any, param: str, where: str) -> None:
    """Check one enforced keyword's value, and the schemas nested in it."""
    _check_scalar(keyword, value, param, where)
    if keyword in _SCHEMA_MAPS:
        if not isinstance(value, Mapping):
            raise _refuse(param, where, f"has a {keyword} that is not an object")
        for name, child in value.items():
            _check(child, param, f"{where}.{keyword}.{name}")
    elif keyword in _SCHEMA_LISTS:
        if not isinstance(value, list):
            raise _refuse(param, where, f"has a {keyword} that is not an array")
        for index, child in enumerate(value):
            _check(child, param, f"{where}.{keyword}[{index}]")
    elif keyword in ("items", "additionalProperties") and not isinstance(value, bool):
        _check(value, param, f"{where}.{keyword}")


def _check_scalar(keyword: str, value: Any, param: str, where: str) -> None:
    if keyword == "format" and value not in _FORMATS:
        raise _refuse(param, where, f"uses format {value!r}")
    if keyword == "type":
        unknown = [kind for kind in (value if isinstance(value, list) else [value]) if kind not in _TYPES]
        if unknown:
            raise _refuse(param, where, f"has unknown type {unknown[0]!r}")
    if keyword == "$ref" and not (isinstance(value, str) and value.startswith("#")):
        raise _refuse(param, where, f"refers to {value!r} (only local references are resolved)")


def output_grammar(schema: Mapping[str, Any], *, starts_inside: bool, may_think: bool) -> GrammarSpec:
    """The grammar for an answer that is one JSON value matching *schema*."""
    prefix = thinking_prefix(starts_inside=starts_inside, may_think=may_think)
    return GrammarSpec(rules=f"root ::= {prefix}output\n{THINK_BODY}", schemas=(("output", schema),))
