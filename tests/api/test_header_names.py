"""Response header names in their usual capitals on HTTP/1.x, in lower case on HTTP/2 (RFC 9113 §8.2.1)."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from bubo.api._transport import TransportGuard

HEADERS = [(b"content-type", b"application/json"), (b"access-control-allow-origin", b"*")]


async def app(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": HEADERS})
    await send({"type": "http.response.body", "body": b"{}", "more_body": False})


async def sent_headers(http_version: str) -> list[tuple[bytes, bytes]]:
    sent: list[dict[str, Any]] = []
    requests = [{"type": "http.request", "body": b"", "more_body": False}]

    async def receive() -> dict[str, Any]:
        if requests:
            return requests.pop()
        await trio.sleep_forever()  # the client stays; the guard stops reading once it has answered
        raise AssertionError

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    with trio.fail_after(5):
        await TransportGuard(app)({"type": "http", "http_version": http_version}, receive, send)
    (start,) = [m for m in sent if m["type"] == "http.response.start"]
    return list(start["headers"])


@pytest.mark.parametrize("version", ["1.0", "1.1"])
async def test_http1_names_are_capitalised(version: str) -> None:
    """A client copying the headers into a plain dict (llama.cpp's test harness does) finds `Content-Type`."""
    assert await sent_headers(version) == [
        (b"Content-Type", b"application/json"),
        (b"Access-Control-Allow-Origin", b"*"),
    ]


async def test_http2_names_stay_lower_case() -> None:
    assert await sent_headers("2") == HEADERS
