"""JSON-shaped inputs: anything at all, valid bodies with one field broken, and values no field can use."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import strategies as st

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=30),
)
json_values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4)
    ),
    max_leaves=12,
)

USER = {"role": "user", "content": "Hi"}
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
# one Responses input item of each kind Bubo reads, a message's type omitted
ITEMS = [
    {"role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
    {"type": "reasoning", "summary": [{"type": "summary_text", "text": "Call f."}]},
    {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
    {"type": "function_call_output", "call_id": "c1", "output": "Done."},
    {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Done."}]},
]

# A valid body for each POST route (the fake engine answers them).
VALID: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {
        "model": "bubo", "messages": [USER], "max_tokens": 4, "temperature": 0.5, "tools": [TOOL],
        "stream": False, "stop": ["x"], "response_format": {"type": "text"}, "logprobs": False,
    },
    "/v1/completions": {"model": "bubo", "prompt": "Hi", "max_tokens": 4, "stop": "x", "stream": False},
    "/v1/responses": {"model": "bubo", "input": ITEMS, "max_output_tokens": 4, "instructions": "Be brief."},
    "/v1/messages": {
        "model": "bubo", "max_tokens": 4, "messages": [USER], "system": "Be brief.",
        "tools": [{"name": "f", "input_schema": {"type": "object"}}],
    },
    "/v1/messages/count_tokens": {"model": "bubo", "messages": [USER], "system": "Be brief."},
    "/completion": {"prompt": "Hi", "n_predict": 4, "temperature": 0.5, "stream": False},
    "/apply-template": {"messages": [USER]},
    "/tokenize": {"content": "Hi", "with_pieces": True},
    "/detokenize": {"tokens": [1, 2, 3]},
}  # fmt: skip


@st.composite
def broken_bodies(draw: st.DrawFn, path: str, values: st.SearchStrategy[Any] = json_values) -> Any:
    """The route's valid body with one top-level field replaced by one of *values*, or removed."""
    body = dict(VALID[path])
    key = draw(st.sampled_from([*body, "unknown_field"]))
    if draw(st.booleans()):
        body[key] = draw(values)
    else:
        body.pop(key, None)
    return body


@st.composite
def nested_breakage(draw: st.DrawFn, path: str, values: st.SearchStrategy[Any] = json_values) -> Any:
    """The valid body with a value inside a list or object (a message, a tool) replaced by one of *values*."""
    body = dict(VALID[path])
    containers = [k for k, v in body.items() if isinstance(v, (list, dict))]
    if not containers:
        return body
    key = draw(st.sampled_from(containers))
    value = body[key]
    if isinstance(value, list):
        index = draw(st.integers(min_value=0, max_value=max(len(value) - 1, 0)))
        item = dict(value[index]) if value and isinstance(value[index], dict) else {}
        if item:
            item[draw(st.sampled_from([*item, "extra"]))] = draw(values)
        body[key] = [*value[:index], item, *value[index + 1 :]]
    else:
        inner = dict(value)
        inner[draw(st.sampled_from([*inner, "extra"]))] = draw(values)
        body[key] = inner
    return body


def bodies(path: str) -> st.SearchStrategy[Any]:
    """Anything a client could send to *path* as JSON."""
    return st.one_of(json_values, broken_bodies(path), nested_breakage(path), st.just(VALID[path]))


# ---- values JSON can spell that no field can use -------------------------------------------

# One surrogate between ordinary text: never paired, so never valid Unicode.
lone_surrogate_text = st.tuples(
    st.text(max_size=5), st.characters(categories=["Cs"]), st.text(max_size=5)
).map("".join)
# json.dumps cannot write these; a placeholder string is swapped for one of them in the text.
NUMBER = "@unusable-number@"
UNUSABLE_NUMBERS = ("1e309", "-1e309", "1E+400", "1" + "0" * 400 + ".5", "NaN", "Infinity", "-Infinity")
unusable_values = st.one_of(
    lone_surrogate_text,
    st.lists(lone_surrogate_text, min_size=1, max_size=2),
    st.dictionaries(lone_surrogate_text, scalars, min_size=1, max_size=2),
    st.just(NUMBER),
    st.lists(st.just(NUMBER), min_size=1, max_size=2),
    st.integers(min_value=2**63, max_value=2**80) | st.integers(min_value=-(2**80), max_value=-(2**63) - 1),
)


def _not_unicode(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _refused_anywhere(value: Any) -> bool:
    """Whether *value* holds a lone surrogate or the NUMBER placeholder (both refused wherever they are)."""
    if isinstance(value, str):
        return value == NUMBER or _not_unicode(value)
    if isinstance(value, dict):
        return any(_refused_anywhere(k) or _refused_anywhere(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_refused_anywhere(v) for v in value)
    return False


# tool-call arguments as text, and whether the route must refuse them (deeper than 64 levels)
DEEP = (
    ("[" * 100_000, True),
    ('{"a":' * 1_000, True),
    ("[" * 65, True),
    ("[" * 64, False),
    ("[]" * 50_000, False),
)
# where each route carries tool-call arguments as text
_ARGUMENTS: dict[str, Any] = {
    "/v1/chat/completions": lambda text: {"messages": [USER, _assistant_call(text)]},
    "/apply-template": lambda text: {"messages": [USER, _assistant_call(text)]},
    "/v1/responses": lambda text: {
        "input": [USER, {"type": "function_call", "call_id": "c1", "name": "f", "arguments": text}]
    },
}


def _assistant_call(arguments: str) -> dict[str, Any]:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": arguments}}
    return {"role": "assistant", "content": None, "tool_calls": [call]}


@st.composite
def unusable_bodies(draw: st.DrawFn, path: str) -> tuple[bytes, bool]:
    """The valid body with one value (top-level or nested) made a lone surrogate, an infinite number,
    an integer beyond 64 bits, or tool-call arguments nested deep; and whether it must be a 400.

    Lone surrogates and infinite numbers are refused wherever they are; a big integer only
    where a field reads it (an unknown field ignores it).
    """
    if path in _ARGUMENTS and draw(st.booleans()):
        arguments, must_refuse = draw(st.sampled_from(DEEP))
        body = {**VALID[path], **_ARGUMENTS[path](arguments)}
    else:
        body = draw(st.one_of(broken_bodies(path, unusable_values), nested_breakage(path, unusable_values)))
        must_refuse = _refused_anywhere(body)
    text = json.dumps(body).replace(json.dumps(NUMBER), draw(st.sampled_from(UNUSABLE_NUMBERS)))
    return text.encode(), must_refuse
