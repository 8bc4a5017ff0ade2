"""Stop strings are bounded in every dialect: a 400 naming the dialect's field and the limit.

Before, ``/v1/completions`` took 100,000 stop strings and every one was searched
for every token on the decode thread all streams share (issue 36).  The engine
now matches them with one automaton; the bound keeps building and holding it
in proportion to what real clients send (``api/_stops.py``).
"""

from __future__ import annotations

from typing import Any

import pytest

from bubo.api._stops import MAX_STOP_CHARS, MAX_STOP_STRINGS
from bubo.engine.fake import FakeEngine

USER = {"role": "user", "content": "hi"}


def chat(stop: Any) -> dict[str, Any]:
    return {"model": "bubo", "messages": [USER], "max_tokens": 4, "stop": stop}


def completions(stop: Any) -> dict[str, Any]:
    return {"model": "bubo", "prompt": "hi", "max_tokens": 4, "stop": stop}


def messages(stop: Any) -> dict[str, Any]:
    return {"model": "bubo", "max_tokens": 4, "messages": [USER], "stop_sequences": stop}


def ollama_generate(stop: Any) -> dict[str, Any]:
    return {"model": "bubo", "prompt": "hi", "stream": False, "options": {"num_predict": 4, "stop": stop}}


def ollama_chat(stop: Any) -> dict[str, Any]:
    return {"model": "bubo", "messages": [USER], "stream": False, "options": {"num_predict": 4, "stop": stop}}


def llama_completion(stop: Any) -> dict[str, Any]:
    return {"prompt": "hi", "n_predict": 4, "stop": stop}


# (route, body with the given stop list, the field the 400 names)
DIALECTS = [
    ("/v1/chat/completions", chat, "stop"),
    ("/v1/completions", completions, "stop"),
    ("/v1/messages", messages, "stop_sequences"),
    ("/api/generate", ollama_generate, "options.stop"),
    ("/api/chat", ollama_chat, "options.stop"),
    ("/completion", llama_completion, "stop"),
]
IDS = [path for path, _, _ in DIALECTS]


def field_named(path: str, payload: Any, param: str, limit: int) -> None:
    """The dialect's error names *param* (in ``param`` where its envelope has one) and the limit."""
    if path.startswith("/api/"):  # Ollama: {"error": message}
        message = payload["error"]
    elif path == "/v1/messages":  # Anthropic: no param in the envelope
        message = payload["error"]["message"]
    else:
        assert payload["error"]["param"] == param
        message = payload["error"]["message"]
    assert param in message
    assert f"{limit:,}".replace(",", "") in message


async def post(app, path: str, data: dict[str, Any]) -> tuple[int, Any]:
    response = await app.test_client().post(path, json=data)
    return response.status_code, await response.get_json()


@pytest.mark.parametrize(("path", "make", "param"), DIALECTS, ids=IDS)
async def test_too_many_stop_strings(app, fake_engine: FakeEngine, path: str, make, param: str) -> None:
    """One string past the count is refused before anything is queued."""
    status, payload = await post(app, path, make([f"<{index}>" for index in range(MAX_STOP_STRINGS + 1)]))
    assert status == 400, payload
    field_named(path, payload, param, MAX_STOP_STRINGS)
    assert not fake_engine.requests


@pytest.mark.parametrize(("path", "make", "param"), DIALECTS, ids=IDS)
async def test_too_many_characters(app, fake_engine: FakeEngine, path: str, make, param: str) -> None:
    """Two strings that hold one character past the total are refused."""
    half = MAX_STOP_CHARS // 2
    status, payload = await post(app, path, make(["x" * half, "y" * (half + 1)]))
    assert status == 400, payload
    field_named(path, payload, param, MAX_STOP_CHARS)
    assert not fake_engine.requests


@pytest.mark.parametrize(("path", "make", "param"), DIALECTS, ids=IDS)
async def test_the_bounds_themselves_reach_the_engine(
    app, fake_engine: FakeEngine, path: str, make, param: str
) -> None:
    """The most strings and characters the bounds allow are accepted and all reach the engine."""
    stops = [
        f"{index:03d}~" + "z" * (MAX_STOP_CHARS // MAX_STOP_STRINGS - 4) for index in range(MAX_STOP_STRINGS)
    ]
    assert sum(len(stop) for stop in stops) == MAX_STOP_CHARS
    status, payload = await post(app, path, make(stops))
    assert status == 200, payload
    assert fake_engine.requests[-1].stop == tuple(stops)


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions", "/completion"])
async def test_one_string_too_long(app, path: str) -> None:
    """``stop`` given as one string counts its characters too."""
    make = {path: make for path, make, _ in DIALECTS}[path]
    status, payload = await post(app, path, make("s" * (MAX_STOP_CHARS + 1)))
    assert status == 400, payload
    field_named(path, payload, "stop", MAX_STOP_CHARS)
