"""Hostile JSON schemas in every field that carries one, and random regex patterns through llama.cpp.

Shapes that once crashed, hung or failed the server: huge repetition bounds
(``maxLength``/``maxItems`` up to 10^6, ``{0,n}`` in patterns), deep nesting
(``items``, ``anyOf``, ``properties``, patterns' groups), huge enums, and
patterns built from regex metacharacters.  Invariants: a 2xx, or a 4xx in the
route's shape (never a 5xx, never a hang); and every pattern the pattern check
accepts, llama.cpp's converter turns into GBNF that llama.cpp's own parser
accepts.
"""

from __future__ import annotations

import json
from http import HTTPStatus
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from quart_trio import QuartTrio

from bubo.domain.generation import GrammarSpec
from bubo.engine import GrammarRejected
from bubo.engine.llama import LlamaEngine
from bubo.grammar.pattern import PatternRefused, check_pattern
from bubo.grammar.schema import LIMITS

from ._budget import run_fuzz
from .test_http_routes import fuzz

USER = [{"role": "user", "content": "Hi"}]

# A regex alphabet rich in what the converter reads specially, with bounds around the limits.
PATTERN_PIECES = [
    *'^$()[]{}|*+?.-,\\"ab0', "\\d", "\\.", "\\(", "\\\\", "[a-z]", "[^a]", "(?:", "{0,", "}", "{2}",
    "{1,3}", "{0,1000}", "{0,1001}", "{20000}", "\\x41", "\\u00e9", "é",
]  # fmt: skip
patterns = st.lists(st.sampled_from(PATTERN_PIECES), max_size=24).map("".join)

# Well-formed regexes too, so that many pass the check and reach llama.cpp's parser.
_classes = st.sampled_from(["[a-z]", "[^a]", "[0-9.]", "[\\-a]", "[\\x41-\\x5A]", "[ \\t\\n]", '["]'])
_atoms = st.sampled_from([*'ab0,-é"', ".", "\\(", "\\.", "\\d", "\\n", "\\\\"]) | _classes
_quantifiers = st.sampled_from(["", "", "*", "+", "?", "*?", "{2}", "{0,3}", "{1,}", "{0,1000}", "{2,1001}"])
regexes = st.deferred(
    lambda: st.lists(
        st.tuples(
            _atoms | st.lists(regexes, min_size=1, max_size=3).map(lambda alts: "(" + "|".join(alts) + ")"),
            _quantifiers,
        ).map("".join),
        max_size=4,
    ).map("".join)
)
anchored = (patterns | regexes).map(lambda body: f"^{body}$")


def _deep(keyword: str, depth: int, leaf: dict[str, Any]) -> dict[str, Any]:
    schema = leaf
    for _ in range(depth - 1):
        if keyword == "items":
            schema = {"type": "array", "items": schema}
        elif keyword == "anyOf":
            schema = {"anyOf": [schema, {"type": "null"}]}
        elif keyword == "properties":
            schema = {"type": "object", "properties": {"a": schema}}
        else:
            schema = {"type": "object", "additionalProperties": schema}
    return schema


def build(shape: str, size: Any, variant: str) -> Any:
    """The schema a drawn description stands for (examples stay short to print, schemas need not)."""
    builders = {
        "string": lambda: {"type": "string", variant: size},
        "array": lambda: {"type": "array", "items": {"type": "integer"}, variant: size},
        "deep": lambda: _deep(variant, size, {"type": "string", "maxLength": 1000}),
        "enum": lambda: {"enum": [f"value {i}" for i in range(size)]},
        "anyOf": lambda: {"anyOf": [{"const": i} for i in range(size)]},
        "properties": lambda: {
            "type": "object",
            "properties": {f"p{i}": {"type": "string"} for i in range(size)},
        },
        "pattern": lambda: {"type": "string", "pattern": variant},
    }
    return builders[shape]()


HUGE = st.sampled_from([0, 1, 999, 1000, 1001, 20_000, 50_000, 10**6])
AROUND = {  # sizes at, just past and far past each limit
    "enum": [1, LIMITS.alternatives, LIMITS.alternatives + 1, 100_000],
    "anyOf": [LIMITS.alternatives, LIMITS.subschemas, 5000],
    "properties": [LIMITS.properties, LIMITS.properties + 1, 2000],
    "deep": [LIMITS.depth - 1, LIMITS.depth, 100, 500],  # deeper is no longer JSON Python can write
}


@st.composite
def hostile_schemas(draw: st.DrawFn) -> tuple[str, Any, str]:
    """A description of one of the shapes that once hurt the server: (shape, size, variant)."""
    shape = draw(st.sampled_from(["string", "array", "deep", "enum", "anyOf", "pattern", "properties"]))
    if shape == "string":
        size = draw(HUGE | st.integers() | st.text(max_size=3))
        return shape, size, draw(st.sampled_from(["minLength", "maxLength"]))
    if shape == "array":
        return shape, draw(HUGE), draw(st.sampled_from(["minItems", "maxItems"]))
    if shape == "pattern":
        return shape, 0, draw(anchored | patterns)
    variant = draw(st.sampled_from(["items", "anyOf", "properties", "additionalProperties"]))
    return shape, draw(st.sampled_from(AROUND[shape])), variant


def _placed(schema: Any, field: str) -> tuple[str, dict[str, Any]]:
    """*schema* in one of the six fields that carry a schema."""
    chat = {"model": "bubo", "messages": USER, "max_tokens": 4}
    responses = {"model": "bubo", "input": "Hi", "max_output_tokens": 4}
    messages = {"model": "bubo", "max_tokens": 4, "messages": USER}
    tool = {"type": "function", "function": {"name": "f", "parameters": schema}}
    response_format = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    text_format = {"type": "json_schema", "name": "x", "schema": schema}
    return {
        "response_format": ("/v1/chat/completions", {**chat, "response_format": response_format}),
        "chat tool": ("/v1/chat/completions", {**chat, "tools": [tool], "tool_choice": "required"}),
        "text.format": ("/v1/responses", {**responses, "text": {"format": text_format}}),
        "responses tool": (
            "/v1/responses",
            {
                **responses,
                "tools": [{"type": "function", "name": "f", "parameters": schema}],
                "tool_choice": "required",
            },
        ),
        "output_config": (
            "/v1/messages",
            {**messages, "output_config": {"format": {"type": "json_schema", "schema": schema}}},
        ),
        "anthropic tool": (
            "/v1/messages",
            {**messages, "tools": [{"name": "f", "input_schema": schema}], "tool_choice": {"type": "any"}},
        ),
    }[field]


FIELDS = ["response_format", "chat tool", "text.format", "responses tool", "output_config", "anthropic tool"]


async def _case(app: QuartTrio, case: tuple[str, tuple[str, Any, str]]) -> tuple[str, int, str, bytes]:
    """One schema in one field; the fake engine's answer breaking the schema reads as an answer.

    The fake engine replays its script whatever the grammar, so an accepted schema may
    get a reply that does not match it: the server's documented answer to a model that
    broke its schema is a 500 ``output_schema_mismatch`` (docs/structured-output.md),
    which is what the schema fuzz must accept as "an answer".  Any other 5xx still fails.
    """
    field, description = case
    path, body = _placed(build(*description), field)
    client = app.test_client()
    response = await client.post(path, json=body)
    status, data = response.status_code, await response.get_data()
    if status == HTTPStatus.INTERNAL_SERVER_ERROR and _error_code(data) == "output_schema_mismatch":
        status = HTTPStatus.OK
    return path, status, response.headers.get("Content-Type", ""), data


def _error_code(data: bytes) -> str | None:
    error = json.loads(data).get("error")
    return error.get("code") if isinstance(error, dict) else None


async def test_hostile_schemas_in_every_field(app: QuartTrio) -> None:
    """Each field, each hostile shape: a clean 4xx in the route's shape, or an answer."""
    await fuzz(app, st.tuples(st.sampled_from(FIELDS), hostile_schemas()), _case)


@pytest.mark.llama
async def test_accepted_patterns_become_grammars_llama_cpp_parses(engine: LlamaEngine) -> None:
    """A pattern the check accepts converts and parses; one it refuses would not have been safe to try."""

    @given(anchored)
    def example(pattern: str) -> None:
        try:
            check_pattern(pattern, max_repeat=LIMITS.repetition)
        except PatternRefused:
            return
        schema = {"type": "string", "pattern": pattern}
        try:
            engine.compile_grammar(GrammarSpec(rules="root ::= value", schemas=(("value", schema),)))
        except GrammarRejected as error:  # pragma: no cover - a failure names the pattern
            pytest.fail(f"{pattern!r} passed the check but was rejected: {error.message}")

    await run_fuzz(example)
