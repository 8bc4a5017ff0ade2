"""JSON-shaped inputs: anything at all, and valid bodies with one field broken."""

from __future__ import annotations

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

# A valid body for each POST route (the fake engine answers them).
VALID: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {
        "model": "bubo", "messages": [USER], "max_tokens": 4, "temperature": 0.5, "tools": [TOOL],
        "stream": False, "stop": ["x"], "response_format": {"type": "text"}, "logprobs": False,
    },
    "/v1/completions": {"model": "bubo", "prompt": "Hi", "max_tokens": 4, "stop": "x", "stream": False},
    "/v1/responses": {"model": "bubo", "input": "Hi", "max_output_tokens": 4, "instructions": "Be brief."},
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
def broken_bodies(draw: st.DrawFn, path: str) -> Any:
    """The route's valid body with one top-level field replaced by anything, or removed."""
    body = dict(VALID[path])
    key = draw(st.sampled_from([*body, "unknown_field"]))
    if draw(st.booleans()):
        body[key] = draw(json_values)
    else:
        body.pop(key, None)
    return body


@st.composite
def nested_breakage(draw: st.DrawFn, path: str) -> Any:
    """The valid body with a value inside a list or object (a message, a tool) replaced."""
    body = dict(VALID[path])
    containers = [k for k, v in body.items() if isinstance(v, (list, dict))]
    if not containers:
        return body
    key = draw(st.sampled_from(containers))
    value = body[key]
    if isinstance(value, list):
        item = dict(value[0]) if value and isinstance(value[0], dict) else {}
        if item:
            item[draw(st.sampled_from([*item, "extra"]))] = draw(json_values)
        body[key] = [item, *value[1:]]
    else:
        inner = dict(value)
        inner[draw(st.sampled_from([*inner, "extra"]))] = draw(json_values)
        body[key] = inner
    return body


def bodies(path: str) -> st.SearchStrategy[Any]:
    """Anything a client could send to *path* as JSON."""
    return st.one_of(json_values, broken_bodies(path), nested_breakage(path), st.just(VALID[path]))
