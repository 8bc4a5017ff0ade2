"""The access log's one line per request: status, bytes, request id, and how an unfinished one ended.

Driven with bare ASGI apps and the messages Hypercorn sends; the same through a
real server (a stream the client closes, ``/ready`` polled) is in
``tests/e2e/test_access_log.py``.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import trio

from bubo.api._access_log import ACCESS_LOGGER, AccessLog, header, request_id_in

App = Callable[[Any, Any, Any], Awaitable[None]]
SCOPE = {
    "type": "http",
    "method": "POST",
    "path": "/api/chat",
    "http_version": "1.1",
    "client": ("127.0.0.1", 50412),
    "headers": [(b"x-request-id", b"req-7")],
}
LINE = re.compile(
    r'(?P<client>\S+) "(?P<method>\S+) (?P<path>\S+) (?P<version>\S+)" (?P<status>\d+|-) (?P<bytes>\d+) '
    r"(?P<seconds>\d+\.\d{6})s request_id=(?P<id>\S+)(?: (?P<outcome>\w+))?\Z"
)


def ids_from_header(scope: Any) -> str:
    return header(scope, b"x-request-id") or "req_new"


async def run(
    app: App, messages: list[dict[str, Any]], caplog: pytest.LogCaptureFixture, scope: dict[str, Any] = SCOPE
) -> re.Match[str]:
    """Run *app* under the access log with *messages* from the client (then it waits); its one line."""
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        if messages:
            return messages.pop(0)
        await trio.sleep_forever()
        raise AssertionError

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    caplog.set_level(logging.INFO, logger=ACCESS_LOGGER)
    with trio.fail_after(5):
        await AccessLog(app, request_id=ids_from_header)(scope, receive, send)
    (record,) = [r for r in caplog.records if r.name == ACCESS_LOGGER]
    match = LINE.fullmatch(record.getMessage())
    assert match is not None, record.getMessage()
    return match


async def answer(send: Any, *, status: int = 200, chunks: tuple[bytes, ...] = (b"{}",)) -> None:
    await send({"type": "http.response.start", "status": status, "headers": []})
    for chunk in chunks:
        await send({"type": "http.response.body", "body": chunk, "more_body": True})
    await send({"type": "http.response.body", "body": b"", "more_body": False})


REQUEST = {"type": "http.request", "body": b"{}", "more_body": False}
DISCONNECT = {"type": "http.disconnect"}


async def test_a_finished_request_is_one_line_with_its_status_bytes_and_id(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        await answer(send, status=201, chunks=(b"abc", b"de"))

    line = await run(app, [REQUEST], caplog)
    assert line.group("client", "method", "path", "version") == (
        "127.0.0.1:50412",
        "POST",
        "/api/chat",
        "1.1",
    )
    assert line.group("status", "bytes", "id", "outcome") == ("201", "5", "req-7", None)


async def test_a_path_cannot_forge_a_line(caplog: pytest.LogCaptureFixture) -> None:
    """The line shows the path as sent (percent-encoded): a decoded ``%0A`` never starts a new line."""

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await answer(send)

    raw = b"/x%0A127.0.0.1:1%20%22GET%20/admin%201.1%22%20200"
    scope = {**SCOPE, "raw_path": raw, "path": '/x\n127.0.0.1:1 "GET /admin 1.1" 200'}
    line = await run(app, [REQUEST], caplog, scope)
    assert line.group("path") == raw.decode()
    assert line.group("id") == "req-7"
    caplog.clear()
    bare = await run(app, [REQUEST], caplog, {**SCOPE, "path": "/x\ny\udc80"})  # no raw_path given
    assert bare.group("path") == "/x\\ny\\udc80"


async def test_the_app_reads_the_id_the_line_carries(caplog: pytest.LogCaptureFixture) -> None:
    seen = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append(request_id_in(scope))
        await answer(send)

    line = await run(app, [REQUEST], caplog)
    assert seen == [line.group("id")] == ["req-7"]


async def test_a_stream_the_client_left_keeps_its_status_and_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The response began with 200; the client closed mid-stream, and the app was cancelled (quart-trio)."""

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True})
        assert (await receive())["type"] == "http.disconnect"

    line = await run(app, [REQUEST, DISCONNECT], caplog)
    assert line.group("status", "bytes", "id", "outcome") == ("200", "9", "req-7", "client_left")


async def test_a_client_that_left_before_any_status_is_logged_too(caplog: pytest.LogCaptureFixture) -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        assert (await receive())["type"] == "http.disconnect"

    line = await run(app, [REQUEST, DISCONNECT], caplog)
    assert line.group("status", "bytes", "outcome") == ("-", "0", "client_left")


async def test_the_disconnect_after_a_finished_response_is_not_the_client_leaving(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Hypercorn queues ``http.disconnect`` inside the last send; reading it afterwards changes nothing."""

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        await answer(send)
        assert (await receive())["type"] == "http.disconnect"

    line = await run(app, [REQUEST, DISCONNECT], caplog)
    assert line.group("status", "outcome") == ("200", None)


async def test_a_client_that_closes_once_it_has_every_byte_of_a_length_did_not_leave(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """With a Content-Length the client has it all at its last byte, and may close before the empty end."""

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"Content-Length", b"2")]})
        await send({"type": "http.response.body", "body": b"{}", "more_body": True})
        assert (await receive())["type"] == "http.disconnect"

    line = await run(app, [REQUEST, DISCONNECT], caplog)
    assert line.group("status", "bytes", "outcome") == ("200", "2", None)


async def test_a_stream_cut_before_its_length_is_the_client_leaving(caplog: pytest.LogCaptureFixture) -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"9")]})
        await send({"type": "http.response.body", "body": b"{}", "more_body": True})
        assert (await receive())["type"] == "http.disconnect"

    line = await run(app, [REQUEST, DISCONNECT], caplog)
    assert line.group("status", "bytes", "outcome") == ("200", "2", "client_left")


async def test_a_response_the_server_cut_is_unfinished(caplog: pytest.LogCaptureFixture) -> None:
    """Cancelled after the status (a shutdown's grace ran out): logged with the status, as unfinished."""
    started = trio.Event()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        started.set()
        await trio.sleep_forever()

    async def send(message: Any) -> None:
        pass

    caplog.set_level(logging.INFO, logger=ACCESS_LOGGER)
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(AccessLog(app, request_id=ids_from_header), SCOPE, trio.sleep_forever, send)
            await started.wait()
            nursery.cancel_scope.cancel()
    (record,) = [r for r in caplog.records if r.name == ACCESS_LOGGER]
    match = LINE.fullmatch(record.getMessage())
    assert match is not None
    assert match.group("status", "outcome") == ("200", "unfinished")


async def test_an_app_that_raised_before_a_status_is_the_500_the_server_sends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        await run(app, [REQUEST], caplog)
    (record,) = [r for r in caplog.records if r.name == ACCESS_LOGGER]
    match = LINE.fullmatch(record.getMessage())
    assert match is not None
    assert match.group("status", "outcome") == ("500", None)


async def test_other_scopes_pass_through_unlogged(caplog: pytest.LogCaptureFixture) -> None:
    called = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        called.append(scope["type"])

    caplog.set_level(logging.INFO, logger=ACCESS_LOGGER)
    await AccessLog(app, request_id=ids_from_header)({"type": "lifespan"}, None, None)
    assert called == ["lifespan"]
    assert not [r for r in caplog.records if r.name == ACCESS_LOGGER]
