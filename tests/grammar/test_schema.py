"""Which JSON-schema keywords constrained decoding enforces, and the GBNF helpers."""

from __future__ import annotations

import pytest

from bubo.errors import InvalidRequest
from bubo.grammar import check_schema, literal, output_grammar, thinking_prefix
from bubo.grammar.schema import LIMITS, SchemaLimits

PARAM = "response_format.json_schema.schema"


def refusal(schema: object, limits: SchemaLimits = LIMITS) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as caught:
        check_schema(schema, PARAM, limits)
    return caught.value


def nested(depth: int, keyword: str = "items") -> dict[str, object]:
    """A schema *depth* levels deep, the root included."""
    schema: dict[str, object] = {"type": "string"}
    for _ in range(depth - 1):
        schema = {"type": "array", keyword: schema} if keyword == "items" else {keyword: [schema]}
    return schema


class TestCheckSchema:
    @pytest.mark.parametrize(
        "schema",
        [
            {},
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
            {"type": "object", "properties": {"a": {}}, "additionalProperties": False},
            {"type": "integer", "minimum": 0, "maximum": 150},  # Pydantic's Field(ge=0, le=150)
            {"anyOf": [{"type": "integer", "exclusiveMinimum": 0}, {"type": "null"}]},  # conint(gt=0) | None
            {"type": ["integer", "null"], "exclusiveMaximum": 10.5, "minimum": -(10**19)},
            {"type": "integer", "minimum": 7, "maximum": 7},
            {"type": "number", "minimum": 0.5, "maximum": 9.5},  # Field(ge=0.5, le=9.5) on a float
            {"type": ["number", "null"], "exclusiveMinimum": 0},  # confloat(gt=0) | None
            {"type": ["integer", "number"], "minimum": 0},
            {"type": "number", "multipleOf": 0.01, "minimum": 0},  # condecimal(multiple_of=0.01, ge=0)
            {"type": "number", "multipleOf": 1, "maximum": 10},
            {"type": "integer", "multipleOf": 5},  # conint(multiple_of=5)
            {"type": "integer", "multipleOf": 5.0, "minimum": 0, "maximum": 100},
            {"type": "integer", "multipleOf": 1000, "exclusiveMinimum": 0},
            {"type": "array", "items": {"type": "string"}, "uniqueItems": True},  # set[str]
        ],
    )
    def test_enforced_keywords_pass(self, schema) -> None:
        """Schemas built only from enforced keywords (and annotations) are accepted."""
        check_schema(schema, PARAM)

    @pytest.mark.parametrize(
        ("schema", "path", "words"),
        [
            ({"minimum": 0}, ".minimum", "$.minimum uses 'minimum' without type 'integer' or 'number'"),
            ({"type": ["string", "null"], "multipleOf": 2}, ".multipleOf", "without type 'integer'"),
            ({"type": "number", "multipleOf": 0.5}, ".multipleOf", "only a whole number or 1, 0.1, 0.01"),
            ({"type": "number", "multipleOf": 0.25, "minimum": 0}, ".multipleOf", "(10^-k) are enforced"),
            (
                {"type": "integer", "multipleOf": 0.1},
                ".multipleOf",
                "on an integer it must be a whole number",
            ),
            ({"type": "integer", "multipleOf": 0}, ".multipleOf", "must be above 0"),
            ({"type": "integer", "multipleOf": "2"}, ".multipleOf", "must be a finite number"),
            ({"type": "number", "minimum": 0.7, "maximum": 0.6}, ".minimum", "admits no number"),
            (
                {"type": "number", "exclusiveMinimum": 1, "exclusiveMaximum": 1},
                ".exclusiveMinimum",
                "no number",
            ),
            (
                {"type": "number", "multipleOf": 0.1, "minimum": 0.01, "maximum": 0.09},
                ".minimum",
                "no number",
            ),
            (
                {"type": "integer", "multipleOf": 7, "minimum": 1, "maximum": 6},
                ".minimum",
                "no multiple of 7",
            ),
            ({"type": "number", "enum": [1.5], "maximum": 1}, ".maximum", "beside 'enum'"),
            ({"type": "array", "uniqueItems": "yes"}, ".uniqueItems", "must be a boolean"),
            ({"type": "integer", "enum": [1, 200], "maximum": 100}, ".maximum", "beside 'enum'"),
            ({"type": "integer", "minimum": True}, ".minimum", "must be a finite number"),
            ({"type": "integer", "maximum": "9"}, ".maximum", "must be a finite number"),
            ({"type": "integer", "minimum": float("nan")}, ".minimum", "must be a finite number"),
            ({"type": "integer", "minimum": 3, "maximum": 2}, ".minimum", "admits no integer"),
            ({"type": "integer", "exclusiveMinimum": 2, "maximum": 2.5}, ".exclusiveMinimum", "no integer"),
            (
                {"properties": {"a": {"items": {"type": "string", "contains": {}}}}},
                ".properties.a.items.contains",
                "uses 'contains'",
            ),
            ({"anyOf": [{"type": "string"}, {"if": {}}]}, ".anyOf[1].if", "uses 'if'"),
            ({"type": "decimal"}, ".type", "unknown type 'decimal'"),
            ({"type": "string", "format": "hostname"}, ".format", "'hostname'"),
            ({"properties": []}, ".properties", "is not an object"),
            ("a string", "", "is not an object"),
            (False, "", "admits no value"),
            ({"properties": {"a": False}}, ".properties.a", "admits no value"),
            ({"properties": {"a.b": {"not": {}}}}, '.properties["a.b"].not', "uses 'not'"),
            ({"type": "string", "maxLength": "5"}, ".maxLength", "non-negative integer"),
            ({"type": "array", "minItems": -1}, ".minItems", "non-negative integer"),
            ({"type": "string", "minLength": 4, "maxLength": 3}, ".minLength", "is 4, above maxLength 3"),
            ({"enum": []}, ".enum", "non-empty array"),
            ({"type": "string", "pattern": "^(($"}, ".pattern", "'^(($' has an unclosed ("),
            ({"type": "string", "pattern": 5}, ".pattern", "must be a string"),
            ({"type": "string", "format": {}}, ".format", "is {}"),
            ({"type": ["string", {"a": 1}]}, ".type", "unknown type {'a': 1}"),
        ],
    )
    def test_what_cannot_be_enforced_is_refused_at_its_path(self, schema, path, words) -> None:
        """Anything the conversion would ignore, misread or fail on is a 400 whose param is its path."""
        error = refusal(schema)
        assert (error.code, error.param) == ("unsupported_schema", PARAM + path)
        assert words in error.message

    def test_a_long_value_is_cut_short_in_the_message(self) -> None:
        """A client's 100,000-character value is not sent back whole."""
        error = refusal({"type": "string", "format": "x" * 100_000})
        assert "is 'xxx" in error.message
        assert len(error.message) < 200


class TestLimits:
    """Each limit: at the limit passes, one over is a 400 schema_too_complex naming the field and the limit."""

    @pytest.mark.parametrize("keyword", ["minLength", "maxLength"])
    def test_string_lengths(self, keyword: str) -> None:
        check_schema({"type": "string", keyword: LIMITS.repetition}, PARAM)
        error = refusal({"properties": {"x": {"type": "string", keyword: 20_000}}})
        assert (error.code, error.param) == ("schema_too_complex", f"{PARAM}.properties.x.{keyword}")
        assert f"is 20000; at most {LIMITS.repetition}" in error.message

    @pytest.mark.parametrize("keyword", ["minItems", "maxItems"])
    def test_array_lengths(self, keyword: str) -> None:
        check_schema({"type": "array", "items": {}, keyword: LIMITS.repetition}, PARAM)
        error = refusal({"type": "array", "items": {}, keyword: 50_000})
        assert (error.code, error.param) == ("schema_too_complex", f"{PARAM}.{keyword}")

    def test_pattern_quantifiers(self) -> None:
        check_schema({"type": "string", "pattern": f"^a{{0,{LIMITS.repetition}}}$"}, PARAM)
        error = refusal({"type": "string", "pattern": "^a{0,20000}$"})
        assert (error.code, error.param) == ("unsupported_schema", f"{PARAM}.pattern")
        assert f"at most {LIMITS.repetition} repetitions" in error.message

    @pytest.mark.parametrize("keyword", ["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"])
    def test_integer_bounds(self, keyword: str) -> None:
        widest = 10**LIMITS.bound_digits - 1
        check_schema({"type": "integer", keyword: widest}, PARAM)
        check_schema({"type": "integer", keyword: -widest}, PARAM)
        error = refusal({"type": "integer", keyword: 10**LIMITS.bound_digits})
        assert (error.code, error.param) == ("schema_too_complex", f"{PARAM}.{keyword}")
        assert f"at most {LIMITS.bound_digits} digits" in error.message

    def test_number_bounds(self) -> None:
        """A number's bound has as many integer digits as an integer's; its fraction is rounded inwards."""
        widest = 10**LIMITS.bound_digits - 1
        check_schema({"type": "number", "minimum": -widest, "maximum": 0.123456789012345678}, PARAM)
        error = refusal({"type": "number", "exclusiveMaximum": 1e20})
        assert (error.code, error.param) == ("schema_too_complex", f"{PARAM}.exclusiveMaximum")

    def test_multiple_of(self) -> None:
        """A divisor of at most 100 (trailing zeros aside); at most 16 fraction digits; bounds beside it
        that only fix the sign or leave at most 500 multiples."""
        for accepted in (
            {"type": "integer", "multipleOf": 100},
            {"type": "integer", "multipleOf": 99 * 10**18},
            {"type": "number", "multipleOf": 1e-16},
            {"type": "integer", "multipleOf": 3, "minimum": 0},
            {"type": "integer", "multipleOf": 3, "exclusiveMaximum": 0},
            {"type": "integer", "multipleOf": 3, "minimum": 1, "maximum": 1500},
        ):
            check_schema(accepted, PARAM)
        for schema, keyword, words in (
            ({"type": "integer", "multipleOf": 101}, "multipleOf", "at most 100"),
            ({"type": "number", "multipleOf": 1e-17}, "multipleOf", "at most 16 fraction digits"),
            ({"type": "integer", "multipleOf": 3, "minimum": 1, "maximum": 1503}, "minimum", "at most 500"),
            ({"type": "integer", "multipleOf": 3, "minimum": 5}, "minimum", "fix the sign"),
        ):
            error = refusal(schema)
            assert (error.code, error.param) == ("schema_too_complex", f"{PARAM}.{keyword}")
            assert words in error.message

    def test_pattern_length(self) -> None:
        check_schema({"type": "string", "pattern": "^" + "a" * (LIMITS.pattern_chars - 2) + "$"}, PARAM)
        error = refusal({"type": "string", "pattern": "^" + "a" * LIMITS.pattern_chars + "$"})
        assert (error.code, error.param) == ("schema_too_complex", f"{PARAM}.pattern")

    @pytest.mark.parametrize("keyword", ["items", "anyOf"])
    def test_depth(self, keyword: str) -> None:
        check_schema(nested(LIMITS.depth, keyword), PARAM)
        error = refusal(nested(500, keyword))
        assert error.code == "schema_too_complex"
        assert f"at most {LIMITS.depth} levels" in error.message
        step = ".items" if keyword == "items" else ".anyOf[0]"
        assert error.param == PARAM + step * LIMITS.depth

    def test_depth_is_not_bounded_by_the_interpreter(self) -> None:
        """100,000 levels: refused at the limit, no RecursionError on the way."""
        assert refusal(nested(100_000)).code == "schema_too_complex"

    def test_subschemas(self) -> None:
        limits = SchemaLimits(subschemas=10)
        check_schema({"anyOf": [{"type": "null"}] * 9}, PARAM, limits)
        error = refusal({"anyOf": [{"type": "null"}] * 10}, limits)
        assert (error.code, error.param) == ("schema_too_complex", f"{PARAM}.anyOf[9]")
        assert "at most 10 are supported" in error.message

    def test_properties(self) -> None:
        many = {"type": "object", "properties": {f"p{i}": {} for i in range(LIMITS.properties)}}
        check_schema(many, PARAM)
        many["properties"]["one-more"] = {}
        error = refusal({"properties": {"inner": many}})
        assert (error.code, error.param) == ("schema_too_complex", f"{PARAM}.properties.inner.properties")

    def test_enum_values(self) -> None:
        check_schema({"enum": list(range(LIMITS.alternatives))}, PARAM)
        error = refusal({"properties": {"x": {"enum": [f"v{i}" for i in range(100_000)]}}})
        assert (error.code, error.param) == ("schema_too_complex", f"{PARAM}.properties.x.enum")
        assert f"to 100000; at most {LIMITS.alternatives}" in error.message

    def test_enum_values_and_branches_add_up(self) -> None:
        limits = SchemaLimits(alternatives=5)
        check_schema({"anyOf": [{"enum": [1, 2]}, {"const": 3}]}, PARAM, limits)  # 2 branches, 2 values
        error = refusal({"oneOf": [{"enum": [1, 2]}, {"anyOf": [{"const": 3}, {"const": 4}]}]}, limits)
        assert error.param == f"{PARAM}.oneOf[1].anyOf"

    def test_literal_characters(self) -> None:
        """enum and const values are counted as JSON text, property names too."""
        limits = SchemaLimits(literal_chars=10)
        check_schema({"properties": {"ab": {"const": "cdef"}}}, PARAM, limits)  # "ab" + "cdef": 4 + 6
        error = refusal({"properties": {"ab": {"const": "cdefg"}}}, limits)
        assert (error.code, error.param) == ("schema_too_complex", f"{PARAM}.properties.ab.const")
        assert "to 11 characters; at most 10" in error.message


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
