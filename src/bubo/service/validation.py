"""A finished structured answer, checked against its schema: what the grammar does not enforce is caught here.

The grammar enforces almost every keyword while sampling; ``uniqueItems`` it
cannot, and a converter's slip would otherwise reach the client unnoticed.  So
an answer the model ended itself (not one a limit or a stop string cut short)
is read and validated with ``jsonschema`` (Draft 2020-12), numbers read as
exact decimals (``0.1`` is 0.1, as the grammar wrote it; the schema's numbers
too), and a mismatch is the model's failure:
:class:`~bubo.errors.OutputSchemaMismatch`, naming where in the output and which
keyword of the schema.

``uniqueItems`` is checked in linear time (each item reduced to a hashable
key, numbers by value: ``1`` and ``1.0`` are the same item, ``true`` and ``1``
are not); jsonschema's own check compares every pair of objects, and an answer
may hold tens of thousands of them.  ``pattern`` is not checked again: the
grammar enforces it exactly (only patterns it translates faithfully pass
:func:`bubo.grammar.check_schema`), and a
backtracking regex engine on a client's pattern is a way to stall the server.
``format`` is an annotation here, as in Draft 2020-12 (the grammar enforces it).

Every schema reaching this point passed :func:`bubo.grammar.check_schema` and is
its bundled form: every ``$ref`` a pointer from the root, no ``$id`` to move the
base URI, bounded depth and size.  The validator's registry holds that document
alone and refuses to retrieve anything else, so a reference that somehow did
not resolve is a failed check, never a request to the network; and any failure
of the check itself is :class:`~bubo.errors.OutputSchemaMismatch` with the code
``output_check_failed``, naming the check, rather than an internal error.
"""

from __future__ import annotations

import decimal
import json
import logging
import re
from collections.abc import Hashable, Iterable, Iterator, Mapping
from fractions import Fraction
from typing import Any

import attrs
import jsonschema
import referencing
import referencing.exceptions
from jsonschema.exceptions import ValidationError, best_match

from bubo.domain.messages import ToolSpec
from bubo.domain.output import OutputEvent, TextDelta, ToolCallArgumentsDelta, ToolCallStart
from bubo.errors import OutputSchemaMismatch
from bubo.grammar import path_segment, resolve_pointer

__all__ = ["AnswerCheck", "check_output"]

_PRECISION = 400
"""Decimal digits for ``multipleOf`` on a number: far more than any number the grammar writes (36)."""
_SHOWN = 80
_MAX_REFERENCE_HOPS = 64  # references to references, followed to find where a keyword is written


_DECIMAL = re.compile(r"Decimal\('([^']*)'\)")

_log = logging.getLogger(__name__)


def _refuse_retrieval(uri: str) -> referencing.Resource[Any]:
    """The registry's retrieval: nothing outside the request's own schema is ever read."""
    raise referencing.exceptions.NoSuchResource(ref=uri)  # type: ignore[call-arg]  # attrs field, unseen by mypy


def _no_pattern(*_: object) -> Iterator[ValidationError]:
    return iter(())


def _unique_items(_: object, unique: object, instance: object, __: object) -> Iterator[ValidationError]:
    if unique is not True or not isinstance(instance, list):
        return
    seen: set[Hashable] = set()
    for item in instance:
        key = _key(item)
        if key in seen:
            yield ValidationError(f"{_show(item)} is in the array more than once (uniqueItems)")
            return
        seen.add(key)


def _key(value: object) -> Hashable:
    """A hashable stand-in for a JSON value, equal exactly when JSON Schema calls two values equal."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return (type(value).__name__, value)
    if isinstance(value, int | decimal.Decimal):
        return ("number", Fraction(value))
    if isinstance(value, list):
        return ("array", tuple(_key(item) for item in value))
    assert isinstance(value, dict)
    return ("object", frozenset((name, _key(item)) for name, item in value.items()))


_Validator = jsonschema.validators.extend(  # type: ignore[no-untyped-call]  # untyped in types-jsonschema
    jsonschema.Draft202012Validator, {"pattern": _no_pattern, "uniqueItems": _unique_items}
)


def check_output(text: str, schema: Mapping[str, Any], param: str) -> None:
    """Refuse *text* (the whole answer) unless it is one JSON value matching *schema* (request field *param*).

    Raises:
        OutputSchemaMismatch: it is not JSON, or does not match; the message says where and why.

    """
    with decimal.localcontext() as context:
        context.prec = _PRECISION
        try:
            instance = json.loads(text, parse_float=decimal.Decimal)
            exact_schema = json.loads(json.dumps(schema), parse_float=decimal.Decimal)
        except (ValueError, RecursionError, ArithmeticError) as failure:
            raise OutputSchemaMismatch(
                f"the model's output could not be checked against the JSON schema: {_cut(str(failure))}",
                param=param,
            ) from None
        registry: referencing.Registry[Any] = referencing.Registry(retrieve=_refuse_retrieval)  # type: ignore[call-arg]
        try:
            error = best_match(_Validator(exact_schema, registry=registry).iter_errors(instance))
        except Exception as failure:  # noqa: BLE001  # a bug here must still answer in the dialect's shape
            _log.exception("the answer's check against the JSON schema in %s could not run", param)
            raise OutputSchemaMismatch(
                f"the answer's check against the JSON schema could not run ({type(failure).__name__}: "
                f"{_cut(str(failure))}); the answer is withheld",
                code="output_check_failed",
                param=param,
            ) from None
    if error is not None:
        where = "$" + _path(error.absolute_path)
        reason = _DECIMAL.sub(r"\1", error.message)
        raise OutputSchemaMismatch(
            f"the model's output does not match the JSON schema: at {where}, {_cut(reason)}",
            param=param + "".join(map(path_segment, _location(exact_schema, error.absolute_schema_path))),
        )


@attrs.define
class AnswerCheck:
    """What one finished answer is checked against, and what it has seen of the answer.

    With ``schema`` the answer text must match it (unless the model called a tool
    instead); with ``tools`` (a forced call) each call's arguments must match its
    tool's parameters.
    """

    schema: Mapping[str, Any] | None = None
    param: str = ""
    tools: tuple[ToolSpec, ...] = ()
    _text: list[str] = attrs.field(factory=list, init=False)
    _calls: dict[int, tuple[str, list[str]]] = attrs.field(factory=dict, init=False)

    def see(self, events: list[OutputEvent]) -> None:
        """Keep the answer text and the calls' arguments."""
        for event in events:
            if isinstance(event, TextDelta):
                self._text.append(event.text)
            elif isinstance(event, ToolCallStart):
                self._calls[event.index] = (event.name, [])
            elif isinstance(event, ToolCallArgumentsDelta) and event.index in self._calls:
                self._calls[event.index][1].append(event.fragment)

    def check(self) -> None:
        """Check what was seen (call when the model ended the answer; it may take a while: off the loop).

        Raises:
            OutputSchemaMismatch: as :func:`check_output`.

        """
        if self.tools:
            by_name = {tool.name: tool for tool in self.tools}
            for name, fragments in self._calls.values():
                tool = by_name.get(name)
                if tool is not None:
                    check_output("".join(fragments), tool.parameters, tool.param)
        elif self.schema is not None and not self._calls:
            check_output("".join(self._text), self.schema, self.param)


def _location(schema: Any, keywords: Iterable[str | int]) -> list[str | int]:
    """Where in *schema* the keyword at jsonschema's *keywords* path is written.

    jsonschema's path goes through a ``$ref`` as if the target stood in its place
    (``items.properties.age`` for ``items: {"$ref": "#/$defs/P"}``); the client wants the
    keyword as the schema holds it (``$defs.P.properties.age``), so each step that the
    node itself lacks follows the node's reference (bundled: a pointer from the root).
    """
    node, location = schema, list[str | int]()
    for keyword in keywords:
        for _ in range(_MAX_REFERENCE_HOPS):
            if not (isinstance(node, Mapping) and keyword not in node and isinstance(node.get("$ref"), str)):
                break
            found = resolve_pointer(schema, node["$ref"].removeprefix("#"))
            if found is None:
                return list(keywords)
            location = list(found[0])
            node = found[1]
        inside = (
            keyword in node if isinstance(node, Mapping) else isinstance(keyword, int) and keyword < len(node)
        )
        if not inside:
            return list(keywords)
        node = node[keyword]
        location.append(keyword)
    return location


def _holds(node: Any, keyword: str | int) -> bool:
    if isinstance(node, Mapping):
        return keyword in node
    return isinstance(node, list) and isinstance(keyword, int) and keyword < len(node)


def _path(segments: Iterable[str | int]) -> str:
    """``.name``, ``["odd name"]`` and ``[index]`` segments, as request paths are written."""
    parts = []
    for segment in segments:
        if isinstance(segment, int):
            parts.append(f"[{segment}]")
        elif segment.isidentifier():
            parts.append(f".{segment}")
        else:
            parts.append(f"[{json.dumps(segment)}]")
    return "".join(parts)


def _show(value: object) -> str:
    return _cut(_DECIMAL.sub(r"\1", repr(value)))


def _cut(text: str) -> str:
    return text if len(text) <= _SHOWN * 2 else text[: _SHOWN * 2 - 1] + "…"
