"""Strict JSON → attrs structuring, with 400 errors that name the field's JSON path.

cattrs coerces by default (``"12"`` becomes ``12``, ``"false"`` becomes
``True``); a public API must not.  :func:`make_converter` overrides the
primitive hooks so ``int`` takes integers only (not booleans, not strings),
``float`` takes numbers, ``bool`` and ``str`` take only their own type, and
unions are resolved by the JSON type of the value (and, for objects, by their
``type`` tag).  Unknown keys are ignored and logged at debug level, as real
clients send fields a server does not know.

Every failure becomes :class:`bubo.errors.InvalidRequest` with code
``parse_error`` and ``param`` set to the first bad field's path, e.g.
``invalid value for type, expected int @ $.max_tokens``.
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

__all__ = ["WireValueError", "make_converter", "parse_json_object", "structure"]

logger = logging.getLogger(__name__)

T = TypeVar("T")
_NONE = type(None)


class WireValueError(ValueError):
    """A value of the wrong JSON type or outside a closed set; the text is the message."""


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def _describe(tp: Any) -> str:
    """A JSON-ish name for a type, for error messages."""
    origin = get_origin(tp)
    if tp is int:
        return "an integer"
    if tp is float:
        return "a number"
    if tp is bool:
        return "a boolean"
    if tp is str:
        return "a string"
    if tp is _NONE:
        return "null"
    if origin is Literal:
        return "one of " + ", ".join(json.dumps(v) for v in get_args(tp))
    if origin in (list, tuple) or tp in (list, tuple):
        return "an array"
    if origin in (dict, Mapping) or tp is dict or attrs.has(tp):
        return "an object"
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(a) for a in get_args(tp))
    return str(tp)


def _accepts(tp: Any, value: Any) -> bool:
    """Whether *value*'s JSON type can be *tp* at all (before structuring it)."""
    kind = _kind(value)
    origin = get_origin(tp)
    if tp is Any:
        return True
    if tp is _NONE:
        return kind == "null"
    if tp is bool:
        return kind == "boolean"
    if tp is int:
        return kind == "integer" or (kind == "number" and float(value).is_integer())
    if tp is float:
        return kind in ("integer", "number")
    if tp is str:
        return kind == "string"
    if origin is Literal:
        return any(value == a and isinstance(value, bool) == isinstance(a, bool) for a in get_args(tp))
    if origin in (list, tuple) or tp in (list, tuple):
        return kind == "array"
    if origin in (dict, Mapping) or tp is dict or attrs.has(tp):
        return kind == "object"
    return False


def _type_tags(cls: type) -> tuple[Any, ...]:
    """The values a class's ``type`` field may take (a ``Literal`` annotation)."""
    for field in attrs.fields(cls):
        if field.name == "type" and get_origin(field.type) is Literal:
            return get_args(field.type)
    return ()


def make_converter() -> cattrs.Converter:
    """A converter with strict primitives, JSON-type unions and lenient extra keys."""
    converter = cattrs.Converter(detailed_validation=True, forbid_extra_keys=False)

    def structure_int(value: Any, _: type) -> int:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise WireValueError(f"expected an integer, got {_kind(value)}")
        if isinstance(value, float):
            if not value.is_integer():
                raise WireValueError(f"expected an integer, got {value!r}")
            return int(value)
        return value

    def structure_float(value: Any, _: type) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise WireValueError(f"expected a number, got {_kind(value)}")
        return float(value)

    def structure_bool(value: Any, _: type) -> bool:
        if not isinstance(value, bool):
            raise WireValueError(f"expected a boolean, got {_kind(value)}")
        return value

    def structure_str(value: Any, _: type) -> str:
        if not isinstance(value, str):
            raise WireValueError(f"expected a string, got {_kind(value)}")
        return value

    def structure_any(value: Any, _: type) -> Any:
        return value

    converter.register_structure_hook(int, structure_int)
    converter.register_structure_hook(float, structure_float)
    converter.register_structure_hook(bool, structure_bool)
    converter.register_structure_hook(str, structure_str)
    converter.register_structure_hook(Any, structure_any)

    def literal_hook(tp: Any) -> Callable[[Any, type], Any]:
        def structure_literal(value: Any, _: type) -> Any:
            if not _accepts(tp, value):
                raise WireValueError(f"expected {_describe(tp)}, got {json.dumps(value)[:80]}")
            return value

        return structure_literal

    converter.register_structure_hook_factory(lambda tp: get_origin(tp) is Literal, literal_hook)

    def dict_hook(tp: Any) -> Callable[[Any, type], Any]:
        args = get_args(tp)
        value_type = args[1] if len(args) == 2 else Any

        def structure_dict(value: Any, _: type) -> dict[str, Any]:
            if not isinstance(value, dict):
                raise WireValueError(f"expected an object, got {_kind(value)}")
            if value_type is Any:
                return value
            return {k: converter.structure(v, value_type) for k, v in value.items()}

        return structure_dict

    converter.register_structure_hook_factory(
        lambda tp: tp is dict or get_origin(tp) in (dict, Mapping), dict_hook
    )

    def list_hook(tp: Any) -> Callable[[Any, type], Any]:
        element = get_args(tp)[0]
        make = tuple if get_origin(tp) is tuple else list

        def structure_list(value: Any, cl: type) -> Any:
            if not isinstance(value, list):
                raise WireValueError(f"expected an array, got {_kind(value)}")
            out = []
            errors: list[Exception] = []
            for index, item in enumerate(value):
                try:
                    out.append(converter.structure(item, element))
                except Exception as error:  # noqa: BLE001 - collected with its index, re-raised below
                    error.add_note(IterableValidationNote(f"Structuring {cl} @ index {index}", index, element))
                    errors.append(error)
            if errors:
                raise IterableValidationError(f"While structuring {cl!r}", errors, cl)
            return make(out)

        return structure_list

    converter.register_structure_hook_factory(
        lambda tp: get_origin(tp) in (list, tuple) and get_args(tp) != (), list_hook
    )

    def union_hook(tp: Any) -> Callable[[Any, type], Any]:
        members = get_args(tp)

        def structure_union(value: Any, _: type) -> Any:
            candidates = [m for m in members if _accepts(m, value)]
            if not candidates:
                raise WireValueError(f"expected {_describe(tp)}, got {_kind(value)}")
            if len(candidates) > 1 and isinstance(value, dict):
                tagged = [c for c in candidates if attrs.has(c) and value.get("type") in _type_tags(c)]
                if not tagged:
                    tags = [t for c in candidates if attrs.has(c) for t in _type_tags(c)]
                    raise WireValueError(
                        f"expected an object whose type is one of {', '.join(map(json.dumps, tags))}, "
                        f"got type {json.dumps(value.get('type'))}"
                    )
                candidates = tagged
            return converter.structure(value, candidates[0])

        return structure_union

    converter.register_structure_hook_factory(
        lambda tp: get_origin(tp) in (typing.Union, types.UnionType), union_hook
    )

    def attrs_hook(cls: type) -> Callable[[Any, type], Any]:
        inner = make_dict_structure_fn(cls, converter)
        known = frozenset(a.name for a in attrs.fields(cls))

        def structure_attrs(value: Any, _: type) -> Any:
            if not isinstance(value, dict):
                raise WireValueError(f"expected an object, got {_kind(value)}")
            if logger.isEnabledFor(logging.DEBUG) and (extra := value.keys() - known):
                logger.debug("ignored unknown fields of %s: %s", cls.__name__, ", ".join(sorted(extra)))
            return inner(value, cls)

        return structure_attrs

    converter.register_structure_hook_factory(attrs.has, attrs_hook)
    return converter


def _format(exc: BaseException, tp: type | None) -> str:
    if isinstance(exc, WireValueError):
        return str(exc)
    if isinstance(exc, KeyError):
        return "required field missing"
    return format_exception(exc, tp)


def structure(converter: cattrs.Converter, data: Any, cls: type[T]) -> T:
    """Structure *data* as *cls* or raise a 400 naming every bad field.

    Raises:
        InvalidRequest: ``parse_error``, ``param`` the first bad field's path.
    """
    try:
        return converter.structure(data, cls)
    except (cattrs.BaseValidationError, WireValueError, ValueError, TypeError) as error:
        messages = cattrs.transform_error(error, path="$", format_exception=_format)
        first = messages[0] if messages else "invalid request"
        path = first.rpartition(" @ ")[2] if " @ " in first else "$"
        param = path.removeprefix("$").removeprefix(".") or None
        raise InvalidRequest("; ".join(messages), code="parse_error", param=param) from None


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def parse_json_object(body: bytes) -> dict[str, Any]:
    """The request body as a JSON object.

    Raises:
        InvalidRequest: empty, not UTF-8, not JSON (``NaN`` included), or not an object.
    """
    if not body.strip():
        raise InvalidRequest("the request body is empty; send a JSON object", code="parse_error")
    try:
        data = json.loads(body, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as error:
        raise InvalidRequest(f"the request body is not valid JSON: {error}", code="parse_error") from None
    if not isinstance(data, dict):
        raise InvalidRequest(
            f"the request body must be a JSON object, got {_kind(data)}", code="parse_error"
        )
    return data
