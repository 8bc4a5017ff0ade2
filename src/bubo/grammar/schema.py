"""JSON schemas for constrained output: which keywords are enforced, how big a schema may be, the grammar.

llama.cpp's JSON-schema-to-grammar conversion enforces types, properties,
required, additionalProperties, items/prefixItems with minItems/maxItems,
enum/const, anyOf/oneOf (as a choice), allOf (merging object properties),
``$ref`` inside the schema (resolved by :mod:`._refs`: ``$id``, ``$anchor``,
``$defs``, ``definitions`` and JSON pointers, as Draft 2020-12 says; nothing is
fetched), string pattern, minLength/maxLength and the uuid and date/time
formats; Bubo's engine adds numeric bounds (``minimum``, ``maximum`` and the
exclusive ones on ``integer`` and ``number``) and ``multipleOf`` where a
grammar can write them (:mod:`bubo.grammar.numeric` says where).
``uniqueItems`` no grammar enforces: it is accepted and the finished output is
validated against the whole schema (:mod:`bubo.service.validation`).  The
conversion silently ignores the rest (``not``, ``if``/``then``/``else``,
``patternProperties``, …): a schema using those is refused with a 400 naming
the keyword, never run unconstrained.

The conversion also expands what a schema asks for (``maxLength: n`` becomes
*n* nested optional groups; an enum, one alternative per value), and
llama.cpp's grammar parser recurses once per nesting level: a large bound
crashed the process, a large enum made every sampled token slow.  So a schema
is measured here first, in one pass over it (no recursion, so no depth can
overflow it), against :class:`SchemaLimits`, and refused with a 400 naming the
field over its limit.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

import attrs

from bubo.domain.generation import GrammarSpec
from bubo.errors import InvalidRequest

from ._forms import normal_form
from ._refs import DOCUMENT_URI, SCHEMA_LISTS, SCHEMA_MAPS, Pointer, References, child_schemas
from .gbnf import THINK_BODY, thinking_prefix
from .numeric import NUMERIC_KEYWORDS, NumericRefused, check_numeric
from .pattern import PatternRefused, check_pattern

__all__ = ["LIMITS", "SchemaLimits", "check_schema", "output_grammar", "path_segment"]


@attrs.frozen
class SchemaLimits:
    """What one schema may ask of the grammar conversion (see docs/operations.md for the measurements)."""

    depth: int = 32
    """Schemas nested in schemas (``items``, ``properties``, ``anyOf`` …), the root being 1."""
    subschemas: int = 1000
    """Schemas in all, the root included."""
    properties: int = 256
    """Properties of one object: the converter's time grows with their square (0.17 s at 256)."""
    repetition: int = 1000
    """``minLength``/``maxLength``/``minItems``/``maxItems`` and a pattern's quantifiers.  Each
    repetition is written out, the optional ones as nested groups: llama.cpp accepts a bound up to
    1,000, refuses more, and from ≈ 18,700 its parser overflows the stack (SIGSEGV) first."""
    alternatives: int = 500
    """``enum`` values and ``anyOf``/``oneOf`` branches in all: every sampled token is checked
    against each open alternative (≈ 0.6 ms each per token with a 49k-token vocabulary)."""
    literal_chars: int = 100_000
    """Characters of all ``enum``/``const`` values (as JSON) and property names together."""
    pattern_chars: int = 1000
    """Characters of one ``pattern``."""
    divisors: int = 100
    """The distinct ``multipleOf`` divisors (without trailing zeros) written as remainder rules, added up:
    each costs its value times 16 rules (100: ≈ 250 KB of GBNF, 45 ms to convert and as much to parse)."""
    bound_digits: int = 20
    """Digits of the integer part of a bound (``minimum`` …) or of ``multipleOf``, enough for any 64-bit
    integer: the grammar spells the range digit by digit, in O(digits²) characters and one nested group
    a digit."""


LIMITS = SchemaLimits()

_ENFORCED = frozenset(
    {
        "type", "properties", "required", "additionalProperties", "items", "prefixItems", "minItems",
        "maxItems", "enum", "const", "anyOf", "oneOf", "allOf", "$ref", "$defs", "definitions", "pattern",
        "minLength", "maxLength", "format", "uniqueItems", *NUMERIC_KEYWORDS,
    }
)  # fmt: skip
_ANNOTATIONS = frozenset(
    {"title", "description", "default", "examples", "$schema", "$id", "$anchor", "$comment", "deprecated",
     "readOnly", "writeOnly", "strict", "name"}
)  # fmt: skip
_FORMATS = frozenset({"uuid", "uuid1", "uuid2", "uuid3", "uuid4", "uuid5", "date", "time", "date-time"})
_TYPES = frozenset({"object", "array", "string", "number", "integer", "boolean", "null"})
_BOUNDS = (("minLength", "maxLength"), ("minItems", "maxItems"))
_BESIDE_BOUNDS = ("$ref", "anyOf", "oneOf", "const", "enum")  # the converter reads these before the type
_SHOWN = 80  # characters of a client's value repeated in a message
_PLAIN_NAME = re.compile(r"[A-Za-z_$][A-Za-z0-9_$-]*")

UNSUPPORTED = "unsupported_schema"
TOO_COMPLEX = "schema_too_complex"

Path = tuple[str, ...]


def check_schema(schema: Any, param: str, limits: SchemaLimits = LIMITS) -> Mapping[str, Any]:
    """Refuse a schema the grammar conversion would not enforce in full, or that asks it for too much.

    *param* is the request field holding the schema; an error's ``param`` is the
    path of the offending keyword below it (``response_format.json_schema.schema.properties.x.maxLength``).

    Returns:
        The schema to enforce and to validate the answer against: *schema* in its Draft 2020-12
        form (``true`` as ``{}``, tuple ``items`` as ``prefixItems``: :mod:`bubo.grammar._forms`),
        bundled where it declares ``$id``/``$anchor`` or refers with ``$ref`` (every reference a
        pointer from the root; see :mod:`bubo.grammar._refs`).  *schema* is never changed.

    Raises:
        InvalidRequest: ``unsupported_schema`` (a keyword, value or pattern the
            conversion cannot enforce, a reference that does not resolve inside the
            schema) or ``schema_too_complex`` (over a limit), naming the field and,
            for a limit, the limit.

    """
    schema = normal_form(schema)
    walk = _Walk(param, limits)
    walk.run(schema)
    bundled: Mapping[str, Any] = walk.references.bundle(schema)
    return bundled


def _show(value: Any) -> str:
    """A value for a message: its repr, cut short."""
    text = repr(value)
    return text if len(text) <= _SHOWN else text[: _SHOWN - 1] + "…"


def _segment(key: str) -> str:
    return f".{key}" if _PLAIN_NAME.fullmatch(key) else f"[{json.dumps(key)}]"


def path_segment(token: str | int) -> str:
    """One step into a schema as a request path writes it: ``.properties``, ``["odd name"]``, ``[0]``."""
    return f"[{token}]" if isinstance(token, int) else _segment(token)


@attrs.define
class _Walk:
    """One pass over a schema, depth first, with an explicit stack; counts against the limits."""

    param: str
    limits: SchemaLimits
    subschemas: int = 0
    alternatives: int = 0
    literal_chars: int = 0
    divisors: set[int] = attrs.field(factory=set)
    references: References = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self.references = References(self.refuse)

    def refuse(self, path: Path, reason: str, code: str = UNSUPPORTED) -> InvalidRequest:
        """The 400: the message says where (``$.properties.a``) and why; ``param`` is the full path."""
        where = "$" + "".join(path)
        return InvalidRequest(
            f"the JSON schema at {where} {reason}", code=code, param=self.param + "".join(path)
        )

    def run(self, root: Any) -> None:
        pending: list[tuple[Any, Path, Pointer, str, int]] = [(root, (), (), DOCUMENT_URI, 1)]
        while pending:
            schema, path, pointer, base, depth = pending.pop()
            self.subschemas += 1
            if self.subschemas > self.limits.subschemas:
                limit = self.limits.subschemas
                raise self.refuse(
                    path, f"is schema number {limit + 1}; at most {limit} are supported", TOO_COMPLEX
                )
            if depth > self.limits.depth:
                raise self.refuse(
                    path,
                    f"is nested {depth} deep; at most {self.limits.depth} levels are supported",
                    TOO_COMPLEX,
                )
            if schema is False:
                raise self.refuse(path, "is false, which admits no value, so no answer could be written")
            if not isinstance(schema, Mapping):
                raise self.refuse(path, "is not an object")
            base = self.references.enter(schema, pointer, path, base)
            self._check(schema, path)
            children = [
                (child, (*path, *map(path_segment, tokens)), (*pointer, *tokens))
                for _, tokens, child in child_schemas(schema)
            ]
            pending.extend((child, child_path, child_pointer, base, depth + 1)
                           for child, child_path, child_pointer in reversed(children))  # fmt: skip

    def _check(self, schema: Mapping[str, Any], path: Path) -> None:
        """Check one schema's own keywords (its child schemas are walked on their own)."""
        for keyword, value in schema.items():
            if keyword in _ANNOTATIONS:
                continue
            here = (*path, _segment(keyword))
            if keyword not in _ENFORCED:
                raise self.refuse(here, f"uses {keyword!r}; constrained decoding cannot enforce it")
            self._check_value(keyword, value, here)
            self._check_holder(keyword, value, here)
        self._check_bounds(schema, path)
        self._check_numeric(schema, path)

    def _check_holder(self, keyword: str, value: Any, here: Path) -> None:
        """A keyword that holds schemas: its shape, and what it counts against the limits."""
        if keyword in SCHEMA_MAPS:
            if not isinstance(value, Mapping):
                raise self.refuse(here, "is not an object")
            if keyword == "properties":
                if len(value) > self.limits.properties:
                    raise self.refuse(
                        here, f"has {len(value)} properties; at most {self.limits.properties} are supported",
                        TOO_COMPLEX,
                    )  # fmt: skip
                for name in value:
                    self._count_literal(len(json.dumps(name)), here)
        elif keyword in SCHEMA_LISTS:
            if not isinstance(value, list):
                raise self.refuse(here, "is not an array")
            if keyword in ("anyOf", "oneOf"):
                self._count_alternatives(len(value), here)

    def _check_value(self, keyword: str, value: Any, here: Path) -> None:
        """The value of a keyword that is not a schema itself."""
        if keyword == "format" and not (isinstance(value, str) and value in _FORMATS):
            raise self.refuse(here, f"is {_show(value)}; constrained decoding cannot enforce it")
        if keyword == "type":
            kinds = value if isinstance(value, list) else [value]
            unknown = [kind for kind in kinds if not (isinstance(kind, str) and kind in _TYPES)]
            if unknown:
                raise self.refuse(here, f"names the unknown type {_show(unknown[0])}")
        elif keyword in ("minLength", "maxLength", "minItems", "maxItems"):
            self._check_count(value, here)
        elif keyword == "pattern":
            self._check_pattern(value, here)
        elif keyword in ("enum", "const"):
            self._check_literals(keyword, value, here)
        elif keyword == "uniqueItems" and not isinstance(value, bool):
            raise self.refuse(here, "must be a boolean")

    def _check_literals(self, keyword: str, value: Any, here: Path) -> None:
        if keyword == "const":
            self._count_values([value], here)
            return
        if not isinstance(value, list) or not value:
            raise self.refuse(here, "must be a non-empty array")
        self._count_alternatives(len(value), here)
        self._count_values(value, here)

    def _check_count(self, value: Any, here: Path) -> None:
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise self.refuse(here, "must be a non-negative integer")
        if value > self.limits.repetition:
            raise self.refuse(
                here, f"is {value}; at most {self.limits.repetition} is supported (each repetition is "
                "written out in the grammar)", TOO_COMPLEX,
            )  # fmt: skip

    def _check_bounds(self, schema: Mapping[str, Any], path: Path) -> None:
        for low, high in _BOUNDS:
            minimum, maximum = schema.get(low, 0), schema.get(high)
            if maximum is not None and minimum > maximum:
                raise self.refuse((*path, f".{low}"), f"is {minimum}, above {high} {maximum}")

    def _check_numeric(self, schema: Mapping[str, Any], path: Path) -> None:
        """Bounds and ``multipleOf``: on integers and numbers, beside no keyword the converter reads first.

        And only as a grammar can write them (:func:`bubo.grammar.numeric.check_numeric`).
        """
        used = [keyword for keyword in NUMERIC_KEYWORDS if keyword in schema]
        if not used:
            return
        here = (*path, _segment(used[0]))
        kind = schema.get("type")
        kinds = [k for k in (kind if isinstance(kind, list) else [kind]) if k in ("integer", "number")]
        if not kinds:
            raise self.refuse(
                here, f"uses {used[0]!r} without type 'integer' or 'number'; constrained decoding enforces "
                "it only on those",
            )  # fmt: skip
        beside = next((keyword for keyword in _BESIDE_BOUNDS if keyword in schema), None)
        if beside is not None:
            raise self.refuse(
                here, f"uses {used[0]!r} beside {beside!r}; constrained decoding cannot enforce both"
            )
        for keyword in used:
            self._bound(schema[keyword], (*path, _segment(keyword)), positive=keyword == "multipleOf")
        for one in kinds:
            try:
                divisor = check_numeric(schema, one)
            except NumericRefused as refused:
                code = TOO_COMPLEX if refused.too_complex else UNSUPPORTED
                raise self.refuse((*path, _segment(refused.keyword)), refused.reason, code) from None
            if divisor is not None:
                self.divisors.add(divisor)
                if sum(self.divisors) > self.limits.divisors:
                    raise self.refuse(
                        (*path, ".multipleOf"), f"brings the distinct divisors (without trailing zeros) to "
                        f"{sum(self.divisors)} in all; at most {self.limits.divisors} are supported (each "
                        "is a rule per remainder and digit)", TOO_COMPLEX,
                    )  # fmt: skip

    def _bound(self, value: Any, here: Path, *, positive: bool = False) -> None:
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise self.refuse(here, "must be a finite number")
        if positive and value <= 0:
            raise self.refuse(here, "must be above 0")
        if len(str(abs(math.trunc(value)))) > self.limits.bound_digits:
            raise self.refuse(
                here, f"is {_show(value)}; at most {self.limits.bound_digits} digits are supported",
                TOO_COMPLEX,
            )  # fmt: skip

    def _check_pattern(self, pattern: Any, here: Path) -> None:
        if not isinstance(pattern, str):
            raise self.refuse(here, "must be a string")
        if len(pattern) > self.limits.pattern_chars:
            raise self.refuse(
                here, f"is {len(pattern)} characters long; at most {self.limits.pattern_chars} are supported",
                TOO_COMPLEX,
            )  # fmt: skip
        try:
            check_pattern(pattern, max_repeat=self.limits.repetition)
        except PatternRefused as refused:
            raise self.refuse(here, f"{_show(pattern)} {refused.reason}") from None

    def _count_alternatives(self, count: int, here: Path) -> None:
        self.alternatives += count
        if self.alternatives > self.limits.alternatives:
            raise self.refuse(
                here,
                f"brings the enum values and anyOf/oneOf branches to {self.alternatives}; at most "
                f"{self.limits.alternatives} are supported (every token is checked against each)",
                TOO_COMPLEX,
            )

    def _count_values(self, values: list[Any], here: Path) -> None:
        for value in values:
            try:
                size = len(json.dumps(value))
            except (RecursionError, ValueError):
                raise self.refuse(here, "holds a value nested too deeply to write out", TOO_COMPLEX) from None
            self._count_literal(size, here)

    def _count_literal(self, size: int, here: Path) -> None:
        self.literal_chars += size
        if self.literal_chars > self.limits.literal_chars:
            raise self.refuse(
                here, f"brings the enum/const values and property names to {self.literal_chars} characters; "
                f"at most {self.limits.literal_chars} are supported", TOO_COMPLEX,
            )  # fmt: skip


def output_grammar(schema: Mapping[str, Any], *, starts_inside: bool, may_think: bool) -> GrammarSpec:
    """The grammar for an answer that is one JSON value matching *schema*."""
    prefix = thinking_prefix(starts_inside=starts_inside, may_think=may_think)
    return GrammarSpec(rules=f"root ::= {prefix}output\n{THINK_BODY}", schemas=(("output", schema),))
