"""Older and shorthand schema forms are read as Draft 2020-12 writes them, as llama-server reads them."""

from __future__ import annotations

import pytest

from bubo.domain.generation import GrammarSpec
from bubo.engine._grammar import to_gbnf
from bubo.grammar import check_schema

from ._gbnf_language import language

PARAM = "response_format.json_schema.schema"


@pytest.mark.parametrize(
    ("schema", "normal"),
    [
        (True, {}),
        ({"type": "array", "items": True}, {"type": "array"}),
        ({"type": "array", "items": {}}, {"type": "array"}),
        ({"items": {}}, {}),
        ({"type": "array", "items": False}, {"type": "array", "prefixItems": [], "maxItems": 0}),
        ({"items": False, "maxItems": 3}, {"prefixItems": [], "maxItems": 0}),
        ({"prefixItems": [{"const": 1}], "items": False}, {"prefixItems": [{"const": 1}]}),
        ({"items": [{"type": "integer"}]}, {"prefixItems": [{"type": "integer"}]}),  # llama.cpp's own suite
        ({"properties": {"a": True, "b": {"items": True}}}, {"properties": {"a": {}, "b": {}}}),
        ({"anyOf": [True, {"type": "null"}]}, {"anyOf": [{}, {"type": "null"}]}),
        ({"type": "object", "additionalProperties": True}, {"type": "object", "additionalProperties": True}),
    ],
)
def test_each_form_becomes_its_2020_12_equal(schema: object, normal: object) -> None:
    assert check_schema(schema, PARAM) == normal


def test_the_schema_sent_is_not_changed() -> None:
    schema = {"properties": {"a": {"items": [{"type": "integer"}]}}}
    check_schema(schema, PARAM)
    assert schema == {"properties": {"a": {"items": [{"type": "integer"}]}}}


def test_a_tuple_is_exactly_its_items() -> None:
    """``items: [integer]``: one integer in brackets, as llama.cpp's converter writes the tuple."""
    schema = check_schema({"items": [{"type": "integer"}]}, PARAM)
    gbnf = to_gbnf(GrammarSpec(rules="root ::= answer", schemas=(("answer", schema),)))
    tuple_language = language(gbnf, "answer")
    assert tuple_language.fullmatch("[-3000]")
    assert not tuple_language.fullmatch("[1,2]")
    assert not tuple_language.fullmatch("[]")


@pytest.mark.parametrize("schema", [{"type": "array", "items": {}}, {"items": {}}, True])
def test_an_empty_items_schema_converts(schema: object) -> None:
    """The converter read ``items: {}`` as absent and failed looking for ``prefixItems``; now it is absent."""
    normal = check_schema(schema, PARAM)
    assert to_gbnf(GrammarSpec(rules="root ::= answer", schemas=(("answer", normal),)))


def test_items_false_admits_only_the_empty_array() -> None:
    schema = check_schema({"type": "array", "items": False}, PARAM)
    gbnf = to_gbnf(GrammarSpec(rules="root ::= answer", schemas=(("answer", schema),)))
    empty_only = language(gbnf, "answer")
    assert empty_only.fullmatch("[]")
    assert not empty_only.fullmatch("[1]")


@pytest.mark.parametrize("items", [{}, True])
def test_any_items_keep_their_bounds(items: object) -> None:
    """``{"type": "array", "items": {}, "maxItems": 2}``: the base converter would write any number of items."""
    schema = check_schema({"type": "array", "items": items, "minItems": 1, "maxItems": 2}, PARAM)
    gbnf = to_gbnf(GrammarSpec(rules="root ::= answer", schemas=(("answer", schema),)))
    rule = next(line for line in gbnf.splitlines() if line.startswith("answer ::="))
    assert rule == 'answer ::= "[" space value ("," space value)? "]" space'  # one value, then one optional
