r"""Grammar specs to GBNF text, with llama.cpp's JSON-schema-to-grammar conversion, bounded for its parser.

The conversion is llama-cpp-python's port of llama.cpp's
``json_schema_to_grammar.py`` (``llama_cpp.llama_grammar.SchemaConverter``).

llama.cpp's GBNF parser reads a parenthesised group with one C++ recursion
per level, on the calling thread's stack: a grammar nested deep enough kills
the process with SIGSEGV before any check of its own can refuse it.  So every
grammar, from a schema, a tool format or ``--grammar-file``, is measured here
first, in one linear pass, and refused above :data:`MAX_GBNF_NESTING` levels
or :data:`MAX_GBNF_CHARS` characters (docs/operations.md has the measurements).

The port's own reference resolution can fetch a schema over HTTP (``requests.get``)
and rewrites the schema it is given in place; :class:`_BoundedConverter` replaces
it: the schemas reaching it are bundled by :func:`bubo.grammar.check_schema`
(every ``$ref`` a JSON pointer from its own root), so a reference is looked up
in the schema's own copy and nothing else, and each reference gets a rule name
of its own (the port names it after the pointer's last token, so
``#/$defs/a/properties/x`` and ``#/$defs/b/properties/x`` shared one rule).

The port's ``char`` rule (``[^"\\]``) admits raw control characters, which JSON
forbids inside a string (RFC 8259 §7): a model wrote a newline into a string and
the answer did not parse.  :data:`JSON_CHAR` is the rule JSON has.

The port ignores numeric bounds and ``multipleOf``; :class:`_BoundedConverter` writes
those (:mod:`.numeric`): integer bounds as llama.cpp's C++ converter does
(:mod:`._integer_range`), number bounds (:mod:`._number_range`) and multiples
(:mod:`._multiples`) the same way, digit by digit.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from typing import Any

from llama_cpp.llama_grammar import (
    PRIMITIVE_RULES,
    RESERVED_NAMES,
    BuiltinRule,
    SchemaConverter,
    _build_repetition,  # the port's own repetition writer, so bounds read as in its item arrays
)

from bubo.domain.generation import GrammarSpec
from bubo.grammar import child_schemas, resolve_pointer
from bubo.grammar.numeric import NUMERIC_KEYWORDS, NumericRefused, numeric_expression

from .errors import Cause, GrammarRejected

__all__ = ["MAX_GBNF_CHARS", "MAX_GBNF_NESTING", "check_gbnf", "to_gbnf"]

MAX_GBNF_NESTING = 1_100
"""Groups inside groups.  Measured (llama.cpp of llama-cpp-python 0.3.36, a trio worker thread, 8 MiB
stack): ≈ 450 bytes of stack a level, SIGSEGV from ≈ 18,700 levels.  The deepest a schema within
:class:`bubo.grammar.schema.SchemaLimits` makes is ≈ 1,035 (1,000 repetitions in 32 groups)."""
MAX_GBNF_CHARS = 4 * 1024 * 1024
"""Characters of GBNF text; llama.cpp parsed 4.4 million in 0.44 s (each request parses its grammar twice)."""

JSON_CHAR = r'[^"\\\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F])'
"""One character of a JSON string: anything but a quote, a backslash or a control character, or an escape."""

# what can hold a parenthesis that is not a group: a "literal", a [class], a # comment; and the groups
# (an unclosed "literal" or [class] runs to the end: the match never fails, so the scan is linear;
# llama.cpp stops at the same place with a parse error, before any group inside it)
_GROUPING = re.compile(
    r'"(?:\\.|[^"\\])*(?:"|\\?\Z)|\[(?:\\.|[^\]\\])*(?:\]|\\?\Z)|#[^\r\n]*|[()]', re.DOTALL
)


def to_gbnf(spec: GrammarSpec) -> str:
    """The GBNF text for *spec*: its own rules plus one rule per schema, checked by :func:`check_gbnf`.

    Raises:
        GrammarRejected: the converter refused a schema (an unanchored ``pattern``,
            a ``$ref`` that does not resolve, …; it reports with ``assert``), or
            the grammar is beyond what llama.cpp's parser can safely read.

    """
    if not spec.schemas:
        check_gbnf(spec.rules)
        return spec.rules
    converter = _BoundedConverter()
    aliases = []
    for name, schema in spec.schemas:
        try:
            resolved = converter.resolve_refs(copy.deepcopy(dict(schema)), name)
            rule = converter.visit(resolved, name)
        except (
            AssertionError,
            AttributeError,
            IndexError,
            KeyError,
            TypeError,
            ValueError,
            RecursionError,
            NumericRefused,
        ) as error:
            raise GrammarRejected(f"the JSON schema cannot be turned into a grammar: {error}") from None
        if rule != name:  # primitives are shared rules ("integer"), named after their type
            aliases.append(f"{name} ::= {rule}")
    text = "\n".join([spec.rules, *aliases, converter.format_grammar()])
    check_gbnf(text)
    return text


def check_gbnf(text: str) -> None:
    """Refuse GBNF that llama.cpp's parser could not read without overflowing its stack, or too large.

    One pass: string literals, character classes and comments are skipped, so a
    parenthesis inside them does not count.

    Raises:
        GrammarRejected: the text is longer than :data:`MAX_GBNF_CHARS` or nests
            groups deeper than :data:`MAX_GBNF_NESTING`.

    """
    if len(text) > MAX_GBNF_CHARS:
        raise GrammarRejected(
            f"the grammar is {len(text)} characters long; at most {MAX_GBNF_CHARS} are supported",
            cause=Cause.GRAMMAR_TOO_COMPLEX,
        )
    depth = deepest = 0
    for token in _GROUPING.finditer(text):
        if token.group() == "(":
            depth += 1
            deepest = max(deepest, depth)
        elif token.group() == ")":
            depth = max(depth - 1, 0)
    if deepest > MAX_GBNF_NESTING:
        raise GrammarRejected(
            f"the grammar nests groups {deepest} deep; at most {MAX_GBNF_NESTING} are supported",
            cause=Cause.GRAMMAR_TOO_COMPLEX,
        )


class _BoundedConverter(SchemaConverter):
    """llama-cpp-python's converter, enforcing numeric bounds and ``multipleOf`` (:mod:`.numeric`).

    Only ``type: integer`` or ``number`` with a bound or ``multipleOf`` and no
    ``$ref``/``anyOf``/``oneOf``/``const``/``enum`` beside it is written here;
    :func:`bubo.grammar.check_schema` refuses those keywords anywhere else.
    A list of types is a choice between the schema with each type: the base converter
    visits ``{"type": t}`` alone, silently dropping ``properties``, ``maxLength``, bounds, ….
    An array with ``minItems``/``maxItems`` and no ``items`` is bounded too: the base converter
    writes such an array unbounded.
    """

    def __init__(self) -> None:
        super().__init__(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)
        self._ref_rules: dict[str, str] = {}  # a reference's key in _refs -> the rule written for it

    def _add_primitive(self, name: str, rule: BuiltinRule) -> str:
        """The port's primitive rules, with JSON's own string character (:data:`JSON_CHAR`)."""
        return str(super()._add_primitive(name, BuiltinRule(JSON_CHAR) if name == "char" else rule))

    def resolve_refs(self, schema: dict[str, Any], url: str) -> dict[str, Any]:
        """Make *schema*'s references (root pointers, ``#/$defs/A``) keys of the converter's table.

        *schema* is the converter's own copy: each ``$ref`` at a schema position
        becomes ``url#/…`` (unique across the grammar's schemas), its target the
        value there.  A reference that is not such a pointer into *schema* fails.
        """
        pending = [schema]
        while pending:
            node = pending.pop()
            if not isinstance(node, dict):
                continue
            reference = node.get("$ref")
            if reference is not None:
                found = resolve_pointer(schema, reference[1:]) if reference.startswith("#") else None
                if found is None:
                    raise ValueError(f"the reference {reference!r} does not point into the schema")
                node["$ref"] = f"{url}{reference}"
                self._refs[node["$ref"]] = found[1]
            pending.extend(child for _, _, child in child_schemas(node))
        return schema

    def _resolve_ref(self, ref: str) -> str:
        """The rule for the schema *ref* points at, written once, named apart from every other rule."""
        name = self._ref_rules.get(ref)
        if name is None:  # reserve the name before visiting, so a recursive reference finds it
            count = len(self._ref_rules)
            name = str(self._add_rule(f"ref{count}", f"reserved-{count}"))
            self._ref_rules[ref] = name
            self._rules[name] = str(self.visit(self._refs[ref], f"{name}-body"))
        return name

    def visit(self, schema: Mapping[str, Any], name: str) -> str:
        """The rule for *schema*: a bounded or stepped number's own, anything else the base converter's."""
        kind = schema.get("type")
        if any(key in schema for key in ("$ref", "anyOf", "oneOf", "const", "enum")):
            return str(super().visit(schema, name))
        rule_name = name + "-" if name in RESERVED_NAMES else name or "root"  # as the base converter names
        if isinstance(kind, list):  # the base converter would visit each type alone, dropping the rest
            branches = [{**schema, "type": one} for one in kind]
            return str(self._add_rule(rule_name, self._generate_union_rule(name, branches)))
        if kind == "array" and _bounded_without_items(schema):
            return str(self._add_rule(rule_name, self._any_items(schema)))
        if kind not in ("integer", "number") or not any(key in schema for key in NUMERIC_KEYWORDS):
            return str(super().visit(schema, name))
        expression = numeric_expression(schema, kind, self._add_rule)
        return str(self._add_rule(rule_name, f"({expression}) space"))

    def _any_items(self, schema: Mapping[str, Any]) -> str:
        """``[`` any JSON values, ``minItems`` to ``maxItems`` of them, ``]``."""
        value = str(self._add_primitive("value", PRIMITIVE_RULES["value"]))
        count = _build_repetition(
            value, schema.get("minItems", 0), schema.get("maxItems"), separator_rule='"," space'
        )
        return f'"[" space {count} "]" space'


def _bounded_without_items(schema: Mapping[str, Any]) -> bool:
    has_items = "items" in schema or "prefixItems" in schema
    return not has_items and ("minItems" in schema or "maxItems" in schema)
