"""Every POST route, fed anything: a 2xx with a well-formed body or a 4xx in the route's error shape."""

from __future__ import annotations

import json
from typing import Any

import trio
from hypothesis import given
from hypothesis import strategies as st
from quart_trio import QuartTrio
from tests._asgi import exchange

from ._budget import run_fuzz
from .strategies import VALID, bodies, unusable_bodies

ANTHROPIC = ("/v1/messages", "/v1/messages/count_tokens")
RESPONSE_TIMEOUT_S = 10


async def post(
    app: QuartTrio, path: str, *, body: Any = None, raw: bytes | None = None
) -> tuple[int, str, bytes]:
    client = app.test_client()
    if raw is not None:
        response = await client.post(path, data=raw, headers={"Content-Type": "application/json"})
    else:
        response = await client.post(path, json=body)
    return response.status_code, response.headers.get("Content-Type", ""), await response.get_data()


SERVER_FAULTS = ("internal_error", "engine_error")  # in a stream, where a 500 would have been


def stream_error_code(frame: Any) -> str | None:
    """The code of an in-stream error event (OpenAI and Anthropic nest it, Responses does not)."""
    if not isinstance(frame, dict):
        return None
    if isinstance(frame.get("error"), dict):
        return frame["error"].get("code")
    return frame.get("code") if frame.get("type") == "error" else None


def check(path: str, status: int, content_type: str, data: bytes) -> None:
    assert status < 500, (status, data[:300])
    if content_type.startswith("text/event-stream"):
        assert status == 200
        text = data.decode()
        for line in text.splitlines():
            if line.startswith("data: ") and line != "data: [DONE]":
                assert stream_error_code(json.loads(line[6:])) not in SERVER_FAULTS, line
            else:
                assert line == "" or line.startswith(("event: ", "data: ")), line
        return
    payload = json.loads(data)
    if status < 400:
        return
    if path in ANTHROPIC:
        assert payload["type"] == "error"
        assert payload["error"]["message"]
        assert payload["error"]["type"]
    else:
        error = payload["error"]
        assert error["message"]
        assert error["code"]
        assert error["type"] in ("invalid_request_error", "authentication_error")


async def fuzz(app: QuartTrio, strategy: st.SearchStrategy[Any], send: Any) -> None:
    """Run a Hypothesis test in a worker thread; each example is sent into the app on the trio thread."""

    @given(strategy)
    def example(case: Any) -> None:
        path, status, content_type, data = trio.from_thread.run(send, app, case)
        check(path, status, content_type, data)

    await run_fuzz(example)


async def _json_case(app: QuartTrio, case: tuple[str, Any]) -> tuple[str, int, str, bytes]:
    path, body = case
    return (path, *(await post(app, path, body=body)))


async def _stream_case(app: QuartTrio, case: tuple[str, Any]) -> tuple[str, int, str, bytes]:
    """Streams can be long: read them straight off the ASGI callable (see tests/_asgi.py)."""
    path, body = case
    with trio.fail_after(RESPONSE_TIMEOUT_S):
        async with exchange(app.app, path, json.dumps(body).encode()) as connection:
            data = await connection.read_all()
    assert connection.status is not None
    return path, connection.status, connection.headers.get("content-type", ""), data


async def _raw_case(app: QuartTrio, case: tuple[str, bytes]) -> tuple[str, int, str, bytes]:
    path, raw = case
    return (path, *(await post(app, path, raw=raw)))


ROUTES = sorted(VALID)


async def test_json_bodies(app: QuartTrio) -> None:
    strategy = st.sampled_from(ROUTES).flatmap(lambda path: st.tuples(st.just(path), bodies(path)))
    await fuzz(app, strategy, _json_case)


async def test_bytes_that_are_not_json(app: QuartTrio) -> None:
    strategy = st.tuples(st.sampled_from(ROUTES), st.binary(max_size=200))
    await fuzz(app, strategy, _raw_case)


async def _unusable_case(app: QuartTrio, case: tuple[str, tuple[bytes, bool]]) -> tuple[str, int, str, bytes]:
    path, (raw, must_refuse) = case
    status, content_type, data = await post(app, path, raw=raw)
    assert not must_refuse or status == 400, (path, raw[:300], status, data[:300])
    return path, status, content_type, data


async def test_values_no_field_can_use(app: QuartTrio) -> None:
    """Lone surrogates, infinite numbers, 65-bit integers, deep tool-call arguments: a 400, never a 500."""
    strategy = st.sampled_from(ROUTES).flatmap(lambda path: st.tuples(st.just(path), unusable_bodies(path)))
    await fuzz(app, strategy, _unusable_case)


async def test_streamed_bodies(app: QuartTrio) -> None:
    """The same bodies asking for a stream: SSE frames that are JSON, or a clean error."""
    streaming = [p for p in ROUTES if p not in ("/apply-template", "/tokenize", "/detokenize", ANTHROPIC[1])]
    strategy = st.sampled_from(streaming).flatmap(
        lambda path: st.tuples(
            st.just(path), bodies(path).map(lambda b: {**b, "stream": True} if isinstance(b, dict) else b)
        )
    )
    await fuzz(app, strategy, _stream_case)
