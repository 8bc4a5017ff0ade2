"""Which JSON-schema keywords constrained decoding enforces, and the GBNF helpers."""

from __future__ import annotations

import pytest

from bubo.errors import InvalidRequest
from bubo.grammar import check_schema, literal, output_grammar, thinking_prefix


class TestCheckSchema:
    @pytest.mark.parametrize(
        "schema",
        [
            {},
            True,
            {
                "type": "object",
                "properties": {"a": {"type": "string", "minLength": 1, "maxLength": 5}},
                "required": ["a"],
            },
            {"type": ["string", "null"]},
            {"anyOf": [{"type": "integer"}, {"enum": ["x", "y"]}]},
            {"type": "array", "items": {"const": 3}, "minItems": 1, "maxItems": 2},
            {"$defs": {"p": {"type": "string", "pattern": "^[a-z]+$"}}, "$ref": "#/$defs/p"},
            {"type": "string", "format": "date-time", "title": "When", "description": "ISO time"},
            {"type": "object", "additionalProperties": {"type": "boolean"}},
        ],
    )
    def test_enforced_keywords_pass(self, schema) -> None:
        """Schemas built only from enforced keywords (and annotations) are accepted."""
        check_schema(schema, "response_format")

    @pytest.mark.parametrize(
        ("schema", "where"),
        [
            ({"type": "number", "maximum": 3}, "$ uses 'maximum'"),
            (
                {"properties": {"a": {"items": {"type": "string", "contains": {}}}}},
                "$.properties.a.items uses 'contains'",
            ),
            ({"anyOf": [{"type": "string"}, {"if": {}}]}, "$.anyOf[1] uses 'if'"),
            ({"type": "decimal"}, "unknown type 'decimal'"),
            ({"type": "string", "format": "hostname"}, "format 'hostname'"),
            ({"properties": []}, "properties that is not an object"),
            ("a string", "is not an object"),
        ],
    )
    def test_other_keywords_are_refused_with_their_place(self, schema, where) -> None:
        """Anything the conversion would ignore is a 400 naming the keyword and where it is."""
        with pytest.raises(InvalidRequest) as caught:
            check_schema(schema, "text.format.schema")
        assert caught.value.code == "unsupported_schema"
        assert caught.value.param == "text.format.schema"
        assert where in caught.value.message


class TestGbnf:
    def test_literal_escapes(self) -> None:
        """Quotes, backslashes and control characters are escaped in GBNF literals."""
        assert literal('a"b\\c\nd\te') == '"a\\"b\\\\c\\nd\\te"'

    def test_thinking_prefix(self) -> None:
        """Inside <think> the reasoning must close first; before it, thinking is optional."""
        assert thinking_prefix(starts_inside=True, may_think=True).startswith('think-body "</think>"')
        assert thinking_prefix(starts_inside=False, may_think=True).startswith('( "<think>"')
        assert thinking_prefix(starts_inside=False, may_think=False) == ""

    def test_output_grammar(self) -> None:
        """The answer grammar names the schema rule the engine will generate."""
        grammar = output_grammar({"type": "object"}, starts_inside=False, may_think=False)
        assert grammar.rules.startswith("root ::= output\n")
        assert grammar.schemas == (("output", {"type": "object"}),)
