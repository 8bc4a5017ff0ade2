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
Every schema reaching this point passed ``check_schema``: local references
only, bounded depth and size.
"""

from __future__ import annotations

import decimal
import json
import re
from collections.abc import Hashable, Iterable, Iterator, Mapping
from fractions import Fraction
from typing import Any

import attrs
import jsonschema
from jsonschema.exceptions import ValidationError, best_match

from bubo.domain.messages import ToolSpec
from bubo.domain.output import OutputEvent, TextDelta, ToolCallArgumentsDelta, ToolCallStart
from bubo.errors import OutputSchemaMismatch

__all__ = ["AnswerCheck", "check_output"]

_PRECISION = 400
"""Decimal digits for ``multipleOf`` on a number: far more than any number the grammar writes (36)."""
_SHOWN = 80


_DECIMAL = re.compile(r"Decimal\('([^']*)'\)")


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
            error = best_match(_Validator(exact_schema).iter_errors(instance))
        except (ValueError, RecursionError, ArithmeticError) as failure:
            raise OutputSchemaMismatch(
                f"the model's output could not be checked against the JSON schema: {_cut(str(failure))}",
                param=param,
            ) from None
    if error is not None:
        where = "$" + _path(error.absolute_path)
        reason = _DECIMAL.sub(r"\1", error.message)
        raise OutputSchemaMismatch(
            f"the model's output does not match the JSON schema: at {where}, {_cut(reason)}",
            param=param + _path(error.absolute_schema_path),
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
