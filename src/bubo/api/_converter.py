"""Strict JSON → attrs structuring, with 400 errors that name the field's JSON path.

cattrs coerces by default (``"12"`` becomes ``12``, ``"false"`` becomes
``True``); a public API must not.  :func:`make_converter` keeps cattrs' own
machinery and overrides only what it cannot do:

- primitives are strict: ``int`` takes integers only (not booleans, not
  strings, none beyond 64 bits; ``2.0`` is 2), ``float`` takes numbers,
  ``bool`` and ``str`` only their own type, a ``Literal`` only its values
  (``1`` is not ``True``);
- lists and objects are cattrs' hook factories behind a JSON type check (a
  string is not a list of characters, an array is not an empty mapping);
- unions are cattrs strategies: union passthrough for strings, booleans,
  ``null`` and literals; a tagged union on ``type`` where every member is an
  attrs class with a ``Literal`` ``type`` (the member whose ``type`` may be
  ``None`` is the default for an object without one, and a member whose
  ``type`` is a plain ``str`` takes every tag no other member names); and, for what is left
  (numbers, arrays, objects), the one member that takes the value's JSON type,
  so no union depends on the order of its members;
- unknown keys are ignored and logged at debug level, as real clients send
  fields a server does not know;
- a field whose JSON key is not a Python name (llama-server's flat
  ``"speculative.n_max"``) says so in its metadata (:data:`WIRE_NAME`); the
  response converter (``_json.py``) writes it under the same key.

Every failure becomes :class:`bubo.errors.InvalidRequest` with code
``parse_error`` and ``param`` set to the first bad field's path, e.g.
``expected an integer or null, got string @ $.max_tokens``: a wrong value is
described by the type declared where it was found, the whole union and not
the member that happened to fail.
"""

from __future__ import annotations

import json
import logging
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal, TypeVar, get_args, get_origin

import attrs
import cattrs
from cattrs.cols import list_structure_factory, mapping_structure_factory
from cattrs.errors import (
    AttributeValidationNote,
    ClassValidationError,
    IterableValidationError,
    IterableValidationNote,
)
from cattrs.gen import make_dict_structure_fn, override
from cattrs.strategies import configure_tagged_union, configure_union_passthrough
from cattrs.v import format_exception

from bubo.errors import InvalidRequest

from ._values import NonFiniteNumbers, check_values

__all__ = [
    "WIRE_NAME",
    "UnexpectedValue",
    "WireValueError",
    "build_hooks",
    "make_converter",
    "parse_json_object",
    "structure",
    "wire_name",
]

logger = logging.getLogger(__name__)

T = TypeVar("T")
Hook = Callable[[Any, Any], Any]
_NONE = type(None)
# every integer field ends in a C integer of at most 64 bits (most are narrower: see _numbers.py)
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
TAG = "type"
WIRE_NAME = "wire_name"
"""The metadata key of an attrs field whose JSON key differs from its name."""


def wire_name(key: str) -> dict[str, str]:
    """The metadata of a field written as *key* in JSON (``attrs.field(metadata=wire_name(…))``)."""
    return {WIRE_NAME: key}


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
# how error messages name what a type accepts, in the order they name them
_KIND_NAMES = {
    "boolean": "a boolean",
    "integer": "an integer",
    "number": "a number",
    "string": "a string",
    "array": "an array",
    "object": "an object",
    "null": "null",
}
_PRIMITIVE_KINDS: dict[Any, str] = {
    _NONE: "null",
    bool: "boolean",
    int: "integer",
    float: "number",
    str: "string",
}
# what a union passes through as it is (cattrs' strategy); its other members have a hook of their own
_PASSED_THROUGH_UNION = str | bool | None
_PASSED_THROUGH = frozenset(get_args(_PASSED_THROUGH_UNION))
# what a number field also takes when no member of its union takes the value's own kind
_WIDENED = {int: "number", float: "integer"}


class WireValueError(ValueError):
    """A value a field cannot take; the text is the message."""


class UnexpectedValue(WireValueError):
    """A value of a JSON type, or outside a closed set, that a field does not take.

    ``got`` names the value (its JSON type, or a literal's JSON text).  The
    message is rebuilt from the type declared where the value was found (see
    :func:`_format`), so a union's error names every member, whichever raised.
    """

    def __init__(self, expected: str, got: str) -> None:
        super().__init__(f"expected {expected}, got {got}")
        self.got = got


def _kind(value: Any) -> str:
    return _KIND_OF_VALUE.get(type(value), type(value).__name__)


def _is_union(tp: Any) -> bool:
    return get_origin(tp) in (typing.Union, types.UnionType)


def _is_optional(tp: Any) -> bool:
    """``X | None``: cattrs structures ``X`` or passes ``None`` (its own hook)."""
    return _is_union(tp) and len(get_args(tp)) == 2 and _NONE in get_args(tp)


def _is_literal(tp: Any) -> bool:
    return get_origin(tp) is Literal


def _is_dict(tp: Any) -> bool:
    return tp is dict or get_origin(tp) in (dict, Mapping)


def _is_list(tp: Any) -> bool:
    return tp is list or get_origin(tp) is list


def _members(tp: Any) -> tuple[Any, ...]:
    return get_args(tp) if _is_union(tp) else (tp,)


def _kinds(tp: Any) -> tuple[str, ...]:
    """The JSON kinds *tp* is written as, in the order its members are declared."""
    kinds: list[str] = []
    for member in _members(tp):
        if member is Any:
            return tuple(_KIND_NAMES)
        if _is_literal(member):
            found = [_kind(value) for value in get_args(member)]
        elif member in _PRIMITIVE_KINDS:
            found = [_PRIMITIVE_KINDS[member]]
        elif _is_list(member):
            found = ["array"]
        elif _is_dict(member) or attrs.has(member):
            found = ["object"]
        else:
            found = []
        kinds.extend(k for k in found if k not in kinds)
    return tuple(kinds)


def _kind_order(tp: Any) -> int:
    return min((list(_KIND_NAMES).index(k) for k in _kinds(tp)), default=len(_KIND_NAMES))


def _describe(tp: Any) -> str:
    """A JSON-ish name for a type, for error messages: ``a string or an array or null``.

    Members are named in the order of the JSON kinds they take, whatever order they are declared in.
    """
    pieces: list[str] = []
    for member in sorted(_members(tp), key=_kind_order):
        if _is_literal(member):
            named = ["one of " + ", ".join(json.dumps(v) for v in get_args(member))]
        else:
            named = [_KIND_NAMES[k] for k in _kinds(member)] or [str(member)]
        pieces.extend(piece for piece in named if piece not in pieces)
    return " or ".join(pieces)


# ---- primitives and literals ----------------------------------------------------------------


def _checked(tp: Any) -> Hook:
    """A structure hook for a primitive that rejects every other JSON type (and integers over 64 bits)."""
    kind = _PRIMITIVE_KINDS[tp]
    widened = _WIDENED.get(tp)

    def structure(value: Any, _: Any) -> Any:
        got = _kind(value)
        if got != kind and (got != widened or (tp is int and not float(value).is_integer())):
            raise UnexpectedValue(_describe(tp), got)
        if tp is int:
            number = int(value)
            if not INT64_MIN <= number <= INT64_MAX:
                digits = str(number)
                shown = digits if len(digits) <= 40 else f"{number:.3e}"
                raise WireValueError(f"expected an integer that fits in 64 bits, got {shown}")
            return number
        if tp is float:
            try:
                return float(value)
            except OverflowError:
                raise WireValueError(
                    f"expected a finite number, got an integer of {len(str(abs(value)))} digits"
                ) from None
        return value

    return structure


def _literal_hook(tp: Any) -> Hook:
    """Only the literal's values, of their own JSON type (``1`` is not ``True``).

    A value of the right JSON type is quoted in the error, another is named by its type.
    """
    allowed = [(value, type(value)) for value in get_args(tp)]
    kinds = _kinds(tp)

    def structure(value: Any, _: Any) -> Any:
        if (value, type(value)) not in allowed:
            got = _kind(value)
            raise UnexpectedValue(_describe(tp), json.dumps(value)[:80] if got in kinds else got)
        return value

    return structure


# ---- arrays, objects, attrs classes ------------------------------------------------------------


def _json_type_checked(kind: str, factory: Callable[[Any, cattrs.Converter], Hook]) -> Callable[..., Hook]:
    """The cattrs hook *factory*, for values of one JSON *kind* only.

    cattrs structures any iterable as a list (a string becomes its characters)
    and any pair sequence as a mapping; JSON has no such conversions.
    """

    def make(tp: Any, converter: cattrs.Converter) -> Hook:
        inner = factory(tp, converter)
        expected = _KIND_NAMES[kind]

        def structure(value: Any, cl: Any) -> Any:
            if _kind(value) != kind:
                raise UnexpectedValue(expected, _kind(value))
            return inner(value, cl)

        return structure

    return make


def _attrs_hook(cls: Any, converter: cattrs.Converter) -> Hook:
    renamed = {a.name: a.metadata[WIRE_NAME] for a in attrs.fields(cls) if WIRE_NAME in a.metadata}
    inner = make_dict_structure_fn(cls, converter, **{n: override(rename=k) for n, k in renamed.items()})  # type: ignore[arg-type] # cattrs types **kw loosely
    known = frozenset(renamed.get(a.name, a.name) for a in attrs.fields(cls))

    def structure(value: Any, _: Any) -> Any:
        if not isinstance(value, dict):
            raise UnexpectedValue("an object", _kind(value))
        if logger.isEnabledFor(logging.DEBUG) and (extra := value.keys() - known):
            logger.debug("ignored unknown fields of %s: %s", cls.__name__, ", ".join(sorted(extra)))
        try:
            return inner(value, cls)
        except ClassValidationError as error:
            if renamed:
                _name_by_wire(error, renamed)
            raise

    return structure


def _name_by_wire(error: ClassValidationError, renamed: Mapping[str, str]) -> None:
    """Name a renamed field's failure by its JSON key, so the error's path is the one the client sent."""
    for exc in error.exceptions:
        notes = getattr(exc, "__notes__", [])
        for i, note in enumerate(notes):
            if isinstance(note, AttributeValidationNote) and note.name in renamed:
                notes[i] = AttributeValidationNote(str(note), renamed[note.name], note.type)


# ---- unions -------------------------------------------------------------------------------------


def _type_tags(cls: Any) -> tuple[Any, ...] | None:
    """The values an attrs class's ``type`` field may take (``None`` among them if it may be omitted).

    ``None`` when the class has no ``Literal`` ``type`` field.
    """
    if not attrs.has(cls):
        return None
    annotation = typing.get_type_hints(cls).get(TAG)
    literals = [m for m in _members(annotation) if _is_literal(m)]
    if len(literals) != 1:
        return None
    may_omit = (None,) if _NONE in _members(annotation) else ()
    return (*get_args(literals[0]), *may_omit)


def _is_catch_all(cls: Any) -> bool:
    """An attrs class whose ``type`` is any string: it takes the tags its union's other members do not."""
    return attrs.has(cls) and typing.get_type_hints(cls).get(TAG) is str


def _taggable(cls: Any) -> bool:
    return _type_tags(cls) is not None or _is_catch_all(cls)


def _is_tagged_union(tp: Any) -> bool:
    """A union of attrs classes, each with a ``Literal`` ``type`` but at most one catch-all."""
    if not _is_union(tp) or not all(_taggable(member) for member in get_args(tp)):
        return False
    return sum(_is_catch_all(member) for member in get_args(tp)) <= 1 < len(get_args(tp))


def _tagged_members(union: Any, members: list[Any]) -> tuple[list[tuple[Any, Any]], Any]:
    """``(tag, member)`` for each tagged member, and the one that may omit its ``type`` (or NOTHING)."""
    tagged, defaults = [], []
    for member in members:
        member_tags = _type_tags(member) or ()
        named = [tag for tag in member_tags if tag is not None]
        if len(named) != 1:
            msg = f"{member.__name__} in {union} needs exactly one type tag"
            raise TypeError(msg)
        tagged.append((named[0], member))
        defaults.extend([member] if None in member_tags else [])
    if len(defaults) > 1:
        msg = f"{union}: only one member may omit its type"
        raise TypeError(msg)
    return tagged, defaults[0] if defaults else attrs.NOTHING


def _tagged_union_hook(union: Any, converter: cattrs.Converter) -> Hook:
    """The cattrs tagged-union strategy on ``type``, behind a JSON object check and a known-tag check.

    The member whose ``type`` may be ``None`` is the default (an object without
    ``type``).  An unknown tag goes to the catch-all member (``type: str``), if
    there is one; else it is an error at ``….type`` that lists the known ones
    (cattrs would send it to the default or fail with a bare ``KeyError``).
    """
    catch_all = next((m for m in get_args(union) if _is_catch_all(m)), None)
    tagged, default = _tagged_members(union, [m for m in get_args(union) if m is not catch_all])
    # in the tags' order: equal unions written in another order share one hook, and list the tags alike
    tags = {member: tag for tag, member in sorted(tagged, key=lambda pair: json.dumps(pair[0]))}
    # configure_tagged_union registers the union's hook on a converter: on one holding only the
    # members' strict hooks, so the hook is read back without re-entering this factory.
    registry = cattrs.Converter()
    for member in tags:
        registry.register_structure_hook(member, converter.get_structure_hook(member))
    known_union: Any = typing.Union[tuple(tags)]  # noqa: UP007 - a union built at run time
    if _is_union(known_union):
        configure_tagged_union(
            known_union, registry, tag_generator=tags.__getitem__, tag_name=TAG, default=default
        )
    by_tag = registry.get_structure_hook(known_union)
    known: Any = Literal[tuple(tags.values())]
    check_tag = _literal_hook(known)
    other = None if catch_all is None else converter.get_structure_hook(catch_all)

    def structure(value: Any, _: Any) -> Any:
        if not isinstance(value, dict):
            raise UnexpectedValue("an object", _kind(value))
        tag = value.get(TAG)
        if tag is None and default is not attrs.NOTHING:
            return by_tag(value, known_union)
        if tag is None:
            raise _at_tag(WireValueError(f"required field missing, {_describe(known)}"), union, known)
        try:
            check_tag(tag, known)
        except UnexpectedValue as error:
            if other is None or not isinstance(tag, str):
                raise _at_tag(error, union, known) from None
            return other(value, catch_all)
        return by_tag(value, known_union)

    return structure


def _at_tag(error: Exception, union: Any, known: Any) -> ClassValidationError:
    """*error* as found in the ``type`` field of a union's object."""
    error.add_note(AttributeValidationNote(f"Structuring {union!r} by its {TAG}", TAG, known))
    return ClassValidationError(f"While structuring {union!r}", [error], union)


def _by_json_kind(union: Any, converter: cattrs.Converter) -> Hook:
    """A union passthrough and the tagged strategy leave: the one member that takes the value's JSON type.

    A value goes to the member of its own JSON type (an integer to ``int``, a
    number to ``float``), else to one that widens to it; several attrs classes
    form a tagged union; several array types are told apart by their first item.
    A union where a JSON value could go to two members is refused when its hook is built.
    """
    routes = _routes(union)

    def structure(value: Any, _: Any) -> Any:
        target = routes.get(_kind(value))
        if target is None:
            raise UnexpectedValue(_describe(union), _kind(value))
        if isinstance(target, _Arrays):
            return target.structure(value, converter)
        return converter.structure(value, target)

    return structure


@attrs.frozen
class _Arrays:
    """Several array members of a union, told apart by the JSON type of their first item."""

    by_item: Mapping[str, Any]  # an item's JSON kind -> the list type whose items take it
    items: Any  # every member's item type, as one union (for the error naming the first item)

    def structure(self, value: list[Any], converter: cattrs.Converter) -> Any:
        if not value:
            return []
        target = self.by_item.get(_kind(value[0]))
        if target is None:
            error = UnexpectedValue(_describe(self.items), _kind(value[0]))
            error.add_note(IterableValidationNote("Structuring the first item", 0, self.items))
            raise IterableValidationError("While structuring an array", [error], list)
        return converter.structure(value, target)


def _takers(kind: str, types: tuple[Any, ...]) -> list[Any]:
    """The *types* that take a JSON *kind* as their own, else those that widen to it."""
    exact = [t for t in types if kind in _kinds(t)]
    return exact or [t for t in types if any(_WIDENED.get(m) == kind for m in _members(t))]


def _routes(union: Any) -> dict[str, Any]:
    """For each JSON kind, the one type (a member, a union of tagged members, arrays) that structures it."""
    routes: dict[str, Any] = {}
    for kind in _KIND_NAMES:
        chosen = _takers(kind, get_args(union))
        if len(chosen) <= 1:
            routes.update({kind: chosen[0]} if chosen else {})
        elif all(_taggable(m) for m in chosen):
            routes[kind] = typing.Union[tuple(chosen)]  # noqa: UP007 - a union built at run time
        elif all(_is_list(m) and get_args(m) for m in chosen):
            routes[kind] = _arrays(union, chosen)
        else:
            msg = f"{union}: several members take a JSON {kind}"
            raise TypeError(msg)
    return routes


def _arrays(union: Any, lists: list[Any]) -> _Arrays:
    item_types = {get_args(m)[0]: m for m in lists}
    by_item = {}
    for kind in _KIND_NAMES:
        takers = _takers(kind, tuple(item_types))
        if len(takers) > 1:
            msg = f"{union}: an array's first item cannot tell its members apart"
            raise TypeError(msg)
        by_item.update({kind: item_types[takers[0]]} if takers else {})
    return _Arrays(by_item=by_item, items=typing.Union[tuple(item_types)])  # noqa: UP007 - built at run time


def make_converter(models: Iterable[Any] = ()) -> cattrs.Converter:
    """A converter with strict primitives, order-free unions and lenient extra keys.

    The structure hooks of *models* (every request body the routes read) are built now, each with
    every type inside it (:func:`build_hooks`): a union that no JSON value can choose a member of
    raises TypeError as the converter is made (``bubo.server``'s, at import), never a client's 400.
    """
    converter = cattrs.Converter(detailed_validation=True, forbid_extra_keys=False)
    for primitive in (int, float, bool, str):
        converter.register_structure_hook(primitive, _checked(primitive))
    converter.register_structure_hook_factory(_is_literal, _literal_hook)
    converter.register_structure_hook_factory(
        _is_dict, _json_type_checked("object", mapping_structure_factory)
    )
    converter.register_structure_hook_factory(_is_list, _json_type_checked("array", list_structure_factory))
    converter.register_structure_hook_factory(attrs.has, _attrs_hook)
    # the later a factory is registered, the earlier cattrs asks it: X | None stays cattrs' own
    converter.register_structure_hook_factory(lambda t: _is_union(t) and not _is_optional(t), _by_json_kind)
    converter.register_structure_hook_factory(_is_tagged_union, _tagged_union_hook)
    configure_union_passthrough(_PASSED_THROUGH_UNION, converter)
    for model in models:
        build_hooks(converter, model)
    return converter


def build_hooks(converter: cattrs.Converter, model: Any) -> None:
    """Build *converter*'s structure hook for *model* and for every type inside it, now.

    cattrs builds a hook when it first meets its type, which for a union inside an optional
    field or a list is when a request first sends one: a declaration error (:func:`_routes`)
    would be that request's 400.  Walking the fields and the members builds them all here.

    Raises:
        TypeError: a type inside *model* has no hook that takes JSON unambiguously.

    """
    seen: set[Any] = set()
    pending = [model]
    while pending:
        tp = pending.pop()
        if tp in seen or tp is _NONE:  # None is a member of a union, structured by the union's hook
            continue
        seen.add(tp)
        converter.get_structure_hook(tp)
        if attrs.has(tp):
            pending += [field.type for field in attrs.fields(attrs.resolve_types(tp))]
        elif not _is_literal(tp):  # a Literal's arguments are its values, not types
            pending += get_args(tp)
        if _is_union(tp):  # the union passthrough hands what it does not take to the rest's own hook
            rest = [m for m in get_args(tp) if m not in _PASSED_THROUGH and not _is_literal(m)]
            if 1 < len(rest) < len(get_args(tp)):
                pending.append(typing.Union[tuple(rest)])  # noqa: UP007 - a union built at run time


# ---- errors -------------------------------------------------------------------------------------


def _format(exc: BaseException, tp: Any) -> str:
    """A failure's message; *tp* is the type declared where it happened (``None`` at the top)."""
    if isinstance(exc, UnexpectedValue) and tp is not None:
        return f"expected {_describe(tp)}, got {exc.got}"
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
        # an error with no type declared where it happened is at *path* itself, declared as *cls*
        messages = cattrs.transform_error(
            error, path=path, format_exception=lambda exc, tp: _format(exc, cls if tp is None else tp)
        )
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
    return parse_json(body, dict, "a JSON object")


def parse_json(body: bytes, kind: type[T], described: str) -> T:
    """The request body as JSON of *kind* (``dict``, ``list``), *described* in errors.

    Raises:
        InvalidRequest: empty, not UTF-8, not JSON (``NaN`` included), not *kind*, or
            holding a lone surrogate or a number too large to be finite (``1e309``).

    """
    if not body.strip():
        raise InvalidRequest(f"the request body is empty; send {described}", code="parse_error")
    numbers = NonFiniteNumbers()
    try:
        data = json.loads(body, parse_constant=_reject_constant, parse_float=numbers)
    except (ValueError, RecursionError) as error:
        raise InvalidRequest(f"the request body is not valid JSON: {error}", code="parse_error") from None
    if not isinstance(data, kind):
        raise InvalidRequest(f"the request body must be {described}, got {_kind(data)}", code="parse_error")
    check_values(data, body, numbers)
    return data
