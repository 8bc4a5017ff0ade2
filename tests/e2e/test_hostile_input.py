"""Hostile bodies against a real server: each a 4xx, and the server keeps serving (issue 10).

The API tests (tests/api/test_hostile_input.py) hold the full table; this sends
a representative set through Hypercorn to the real engine, where a 500 or a
crash would show.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from .conftest import Server

USER = {"role": "user", "content": "Say hi."}
CHAT = "/v1/chat/completions"


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": "bubo", "messages": [USER], "max_tokens": 4, **fields}


def assistant_call(arguments: str) -> dict[str, Any]:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": arguments}}
    return {"role": "assistant", "content": None, "tool_calls": [call]}


# (route, JSON text as sent, the param the 400 names)
HOSTILE = [
    (CHAT, json.dumps(chat(messages=[{"role": "user", "content": "a\ud800b"}])), "messages[0].content"),
    ("/tokenize", json.dumps({"content": "\ud800"}), "content"),
    ("/apply-template", json.dumps({"messages": [{"role": "user", "content": "\udfff"}]}), "messages[0].content"),
    ("/completion", json.dumps({"prompt": "hi", "stop": ["\ud800"], "n_predict": 4}), "stop[0]"),
    ("/v1/completions", json.dumps({"model": "bubo", "prompt": "hi", "stop": [f"s{i}" for i in range(100_000)]}),
     "stop"),
    (CHAT, json.dumps(chat(messages=[USER, assistant_call("[" * 100_000)])),
     "messages[1].tool_calls[0].function.arguments"),
    (CHAT, json.dumps(chat(temperature=0.5)).replace("0.5", "1e309"), "temperature"),
    (CHAT, json.dumps(chat(max_tokens=2**70)), "max_tokens"),
    ("/completion", json.dumps({"prompt": "hi", "n_predict": 2**31}), "n_predict"),
    (CHAT, json.dumps(chat(top_k=2**32 + 5)), "top_k"),
    (CHAT, json.dumps(chat(repeat_penalty=0)), "repeat_penalty"),
]  # fmt: skip


def assert_serving(http: httpx.Client, server: Server) -> None:
    assert server.process.poll() is None, server.output()[-3000:]
    assert http.get("/health").json() == {"status": "ok"}
    answer = http.post(CHAT, json=chat())
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["message"]["content"] is not None


@pytest.mark.parametrize(("path", "text", "param"), HOSTILE, ids=[f"{p}:{q}" for p, _, q in HOSTILE])
def test_refused_and_still_serving(
    http: httpx.Client, server: Server, path: str, text: str, param: str
) -> None:
    """Each hostile body is a 400 naming the field; the same server then answers normally."""
    response = http.post(path, content=text.encode(), headers={"Content-Type": "application/json"})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param
    assert_serving(http, server)


def test_extreme_settings_in_range_reach_llama_cpp(http: httpx.Client, server: Server) -> None:
    """The widest values the ranges admit go through llama.cpp's sampler without harm."""
    for fields in (
        {"temperature": 3.4e38, "top_k": 2**31 - 1, "top_p": 1, "min_p": 0},
        {"presence_penalty": -3.4e38, "frequency_penalty": 3.4e38, "repeat_penalty": 3.4e38},
        {"repeat_penalty": 1e-30, "repeat_last_n": -1, "seed": 2**63 - 1, "temperature": 0.7},
        {"logit_bias": {"15": 3.4e38, "16": -3.4e38}, "temperature": 0.7},
    ):
        response = http.post(CHAT, json=chat(**fields))
        assert response.status_code == 200, (fields, response.text)
    assert_serving(http, server)
