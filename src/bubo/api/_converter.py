"""Strict JSON → attrs structuring, with 400 errors that name the field's JSON path.

cattrs coerces by default (``"12"`` becomes ``12``, ``"false"`` becomes
``True``); a public API must not.  :func:`make_converter` overrides the
primitive hooks so ``int`` takes integers only (not booleans, not strings,
none beyond 64 bits), ``float`` takes numbers, ``bool`` and ``str`` take only
their own type, and unions are resolved by the JSON type of the value (and, for
objects, by their ``type`` tag).  Unknown keys are ignored and logged at debug level, as real
clients send fields a server does not know.

Every failure becomes :class:`bubo.errors.InvalidRequest` with code
``parse_error`` and ``param`` set to the first bad field's path, e.g.
``expected an integer, got string @ $.max_tokens``.
"""

from __future__ import annotations

import json
import logging
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, Literal, TypeVar, get_args, get_origin

import attrs
import cattrs
from cattrs.errors import IterableValidationError, IterableValidationNote
from cattrs.gen import make_dict_structure_fn
from cattrs.v import format_exception

from bubo.errors import InvalidRequest

from ._values import NonFiniteNumbers, check_values

__all__ = ["WireValueError", "make_converter", "parse_json_object", "structure"]

logger = logging.getLogger(__name__)

T = TypeVar("T")
Hook = Callable[[Any, Any], Any]
_NONE = type(None)
# every integer field ends in a C integer of at most 64 bits (most are narrower: see _numbers.py)
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

# the JSON kind of a parsed value, by its exact Python type (json.loads makes no subclasses)
_KIND_OF_VALUE = {
    _NONE: "null",
    bool: "boolean",
    int: "integer",
    float: "number",
    str: "string",
    list: "array",
    dict: "object",
}
# how error messages name what a type accepts
_KIND_NAMES = {
    "null": "null",
    "boolean": "a boolean",
    "integer": "an integer",
    "number": "a number",
    "string": "a string",
    "array": "an array",
    "object": "an object",
}
_PRIMITIVE_KINDS: dict[Any, tuple[str, ...]] = {
    _NONE: ("null",),
    bool: ("boolean",),
    int: ("integer",),
    float: ("number",),
    str: ("string",),
}


class WireValueError(ValueError):
    """A value of the wrong JSON type or outside a closed set; the text is the message."""


def _kind(value: Any) -> str:
    return _KIND_OF_VALUE.get(type(value), type(value).__name__)


def _is_union(tp: Any) -> bool:
    return get_origin(tp) in (typing.Union, types.UnionType)


def _is_sequence(tp: Any) -> bool:
    return get_origin(tp) in (list, tuple) or tp in (list, tuple)


def _is_mapping(tp: Any) -> bool:
    return get_origin(tp) in (dict, Mapping) or tp is dict or attrs.has(tp)


def _is_literal(tp: Any) -> bool:
    return get_origin(tp) is Literal


def _is_dict(tp: Any) -> bool:
    return tp is dict or get_origin(tp) in (dict, Mapping)


def _is_list(tp: Any) -> bool:
    return get_origin(tp) in (list, tuple) and get_args(tp) != ()


def _kinds(tp: Any) -> tuple[str, ...]:
    """The JSON kinds a non-union, non-Literal type is written as."""
    if tp in _PRIMITIVE_KINDS:
        return _PRIMITIVE_KINDS[tp]
    if _is_sequence(tp):
        return ("array",)
    if _is_mapping(tp):
        return ("object",)
    return ()


def _describe(tp: Any) -> str:
    """A JSON-ish name for a type, for error messages."""
    if _is_union(tp):
        return " or ".join(_describe(member) for member in get_args(tp))
    if get_origin(tp) is Literal:
        return "one of " + ", ".join(json.dumps(v) for v in get_args(tp))
    return " or ".join(_KIND_NAMES[k] for k in _kinds(tp)) or str(tp)


def _accepts(tp: Any, value: Any) -> bool:
    """Whether *value*'s JSON type can be *tp* at all (before structuring it)."""
    if tp is Any:
        return True
    if get_origin(tp) is Literal:
        return any(value == a and isinstance(value, bool) == isinstance(a, bool) for a in get_args(tp))
    kind = _kind(value)
    if tp is int and kind == "number":
        return float(value).is_integer()
    if tp is float and kind == "integer":
        return True
    return kind in _kinds(tp)


def _type_tags(cls: type) -> tuple[Any, ...]:
    """The values a class's ``type`` field may take (a ``Literal`` annotation)."""
    annotation = typing.get_type_hints(cls).get("type")
    return get_args(annotation) if get_origin(annotation) is Literal else ()


def _checked(tp: Any) -> Hook:
    """A structure hook for a primitive that rejects every other JSON type (and integers over 64 bits)."""

    def structure(value: Any, _: Any) -> Any:
        if not _accepts(tp, value):
            raise WireValueError(f"expected {_describe(tp)}, got {_kind(value)}")
        if tp is int:
            number = int(value)
            if not INT64_MIN <= number <= INT64_MAX:
                digits = str(number)
                shown = digits if len(digits) <= 40 else f"{number:.3e}"
                raise WireValueError(f"expected an integer that fits in 64 bits, got {shown}")
            return number
        return float(value) if tp is float else value

    return structure


def _literal_hook(tp: Any) -> Hook:
    def structure(value: Any, _: Any) -> Any:
        if not _accepts(tp, value):
            raise WireValueError(f"expected {_describe(tp)}, got {json.dumps(value)[:80]}")
        return value

    return structure


def _dict_hook(converter: cattrs.Converter) -> Callable[[Any], Hook]:
    def factory(tp: Any) -> Hook:
        args = get_args(tp)
        value_type = args[1] if len(args) == 2 else Any

        def structure(value: Any, _: Any) -> Any:
            if not isinstance(value, dict):
                raise WireValueError(f"expected an object, got {_kind(value)}")
            if value_type is Any:
                return value
            return {key: converter.structure(item, value_type) for key, item in value.items()}

        return structure

    return factory


def _list_hook(converter: cattrs.Converter) -> Callable[[Any], Hook]:
    def factory(tp: Any) -> Hook:
        element = get_args(tp)[0]
        make = tuple if get_origin(tp) is tuple else list

        def structure(value: Any, cl: Any) -> Any:
            if not isinstance(value, list):
                raise WireValueError(f"expected an array, got {_kind(value)}")
            out = []
            errors: list[Exception] = []
            for index, item in enumerate(value):
                try:
                    out.append(converter.structure(item, element))
                except Exception as error:  # noqa: BLE001 - collected with its index, raised below
                    error.add_note(
                        IterableValidationNote(f"Structuring {cl} @ index {index}", index, element)
                    )
                    errors.append(error)
            if errors:
                raise IterableValidationError(f"While structuring {cl!r}", errors, cl)
            return make(out)

        return structure

    return factory


def _union_hook(converter: cattrs.Converter) -> Callable[[Any], Hook]:
    def factory(tp: Any) -> Hook:
        members = get_args(tp)
        tags = {member: _type_tags(member) for member in members if attrs.has(member)}

        def structure(value: Any, _: Any) -> Any:
            if value is None and _NONE in members:
                return None
            candidates = [m for m in members if _accepts(m, value)]
            if not candidates:
                raise WireValueError(f"expected {_describe(tp)}, got {_kind(value)}")
            if len(candidates) > 1 and isinstance(value, dict):
                tagged = [c for c in candidates if value.get("type") in tags.get(c, ())]
                if not tagged:
                    known = ", ".join(json.dumps(t) for c in candidates for t in tags.get(c, ()))
                    got = json.dumps(value.get("type"))
                    raise WireValueError(f"expected an object whose type is one of {known}, got type {got}")
                candidates = tagged
            return converter.structure(value, candidates[0])

        return structure

    return factory


def _attrs_hook(converter: cattrs.Converter) -> Callable[[Any], Hook]:
    def factory(cls: Any) -> Hook:
        inner = make_dict_structure_fn(cls, converter)
        known = frozenset(a.name for a in attrs.fields(cls))

        def structure(value: Any, _: Any) -> Any:
            if not isinstance(value, dict):
                raise WireValueError(f"expected an object, got {_kind(value)}")
            if logger.isEnabledFor(logging.DEBUG) and (extra := value.keys() - known):
                logger.debug("ignored unknown fields of %s: %s", cls.__name__, ", ".join(sorted(extra)))
            return inner(value, cls)

        return structure

    return factory


def make_converter() -> cattrs.Converter:
    """A converter with strict primitives, JSON-type unions and lenient extra keys."""
    converter = cattrs.Converter(detailed_validation=True, forbid_extra_keys=False)
    for primitive in (int, float, bool, str):
        converter.register_structure_hook(primitive, _checked(primitive))
    converter.register_structure_hook(Any, lambda value, _: value)
    converter.register_structure_hook_factory(_is_literal, _literal_hook)
    converter.register_structure_hook_factory(_is_dict, _dict_hook(converter))
    converter.register_structure_hook_factory(_is_list, _list_hook(converter))
    converter.register_structure_hook_factory(_is_union, _union_hook(converter))
    converter.register_structure_hook_factory(attrs.has, _attrs_hook(converter))
    return converter


def _format(exc: BaseException, tp: type | None) -> str:
    if isinstance(exc, WireValueError):
        return str(exc)
    if isinstance(exc, KeyError):
        return "required field missing"
    return format_exception(exc, tp)


def structure(converter: cattrs.Converter, data: Any, cls: type[T], path: str = "$") -> T:
    """Structure *data* (found at JSON *path*) as *cls* or raise a 400 naming every bad field.

    Raises:
        InvalidRequest: ``parse_error``, ``param`` the first bad field's path.

    """
    try:
        return converter.structure(data, cls)
    except (cattrs.BaseValidationError, ValueError, TypeError) as error:
        messages = cattrs.transform_error(error, path=path, format_exception=_format)
        first = messages[0] if messages else "invalid request"
        where = first.rpartition(" @ ")[2] if " @ " in first else path
        param = where.removeprefix("$").removeprefix(".") or None
        raise InvalidRequest("; ".join(messages), code="parse_error", param=param) from None


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def parse_json_object(body: bytes) -> dict[str, Any]:
    """The request body as a JSON object.

    Raises:
        InvalidRequest: empty, not UTF-8, not JSON (``NaN`` included), not an object, or
            holding a lone surrogate or a number too large to be finite (``1e309``).

    """
    if not body.strip():
        raise InvalidRequest("the request body is empty; send a JSON object", code="parse_error")
    numbers = NonFiniteNumbers()
    try:
        data = json.loads(body, parse_constant=_reject_constant, parse_float=numbers)
    except (ValueError, RecursionError) as error:
        raise InvalidRequest(f"the request body is not valid JSON: {error}", code="parse_error") from None
    if not isinstance(data, dict):
        raise InvalidRequest(f"the request body must be a JSON object, got {_kind(data)}", code="parse_error")
    check_values(data, body, numbers)
    return data
