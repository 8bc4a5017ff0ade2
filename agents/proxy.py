"""A logging HTTP proxy between a coding agent and Bubo, on 127.0.0.1.

Each request is forwarded as it came (body, headers but the hop-by-hop ones)
and its response streamed back byte for byte; the proxy records, per request,
what was sent, the status, the time to the first byte and to the first
generated token, the token counts the response reported (prompt, cached) and
any error the stream carried after its 200.  It reads each dialect's stream the
way its clients do: Anthropic's events, OpenAI chat chunks, Responses events.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self

import attrs
import httpx

__all__ = ["Exchange", "LocalServer", "LoggingProxy"]

_HOP_BY_HOP = {"host", "content-length", "connection", "transfer-encoding", "accept-encoding", "keep-alive"}


@attrs.define
class Exchange:
    """One request through the proxy and what came back."""

    number: int
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    started: float
    status: int | None = None
    first_byte_s: float | None = None
    first_token_s: float | None = None
    ended_s: float | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    stream_errors: list[str] = attrs.Factory(list)
    keepalives: int = 0  # pings, response.in_progress again, chat chunks with an empty delta
    left_early: bool = False  # the agent closed the connection before the response ended
    response_head: bytes = b""  # the first bytes of the response body (for the report)

    @property
    def endpoint(self) -> str:
        """The path without its query."""
        return self.path.split("?", 1)[0]

    def json_body(self) -> Any:
        """The request body as JSON (None when it is not)."""
        try:
            return json.loads(self.body)
        except ValueError:
            return None


class _Reader:
    """Reads a response as it streams: first token, usage, errors."""

    def __init__(self, exchange: Exchange) -> None:
        self._exchange = exchange
        self._buffer = b""
        self._whole = bytearray()
        self._event: str | None = None
        self._in_progress = 0  # response.in_progress events seen

    def feed(self, chunk: bytes, now: float) -> None:
        self._whole.extend(chunk)
        self._buffer += chunk
        while b"\n" in self._buffer:
            line, self._buffer = self._buffer.split(b"\n", 1)
            self._line(line.rstrip(b"\r").decode("utf-8", "replace"), now)

    def _line(self, line: str, now: float) -> None:
        if line.startswith("event:"):
            self._event = line[6:].strip()
            return
        if not line.startswith("data:"):
            if not line:
                self._event = None
            return
        data = line[5:].strip()
        if data == "[DONE]":
            return
        try:
            payload = json.loads(data)
        except ValueError:
            return
        if isinstance(payload, dict):
            self._payload(self._event or str(payload.get("type", "")), payload, now)

    def _payload(self, event: str, payload: dict[str, Any], now: float) -> None:
        exchange = self._exchange
        if _is_error(event, payload):
            exchange.stream_errors.append(json.dumps(payload)[:300])
        if exchange.first_token_s is None and _is_token(event, payload):
            exchange.first_token_s = now - exchange.started
        if self._is_keepalive(event, payload):
            exchange.keepalives += 1
        usage = _usage(event, payload)
        if usage is not None:
            exchange.prompt_tokens, exchange.cached_tokens = usage

    def _is_keepalive(self, event: str, payload: dict[str, Any]) -> bool:
        """A ping, a repeated ``response.in_progress``, or a chat chunk that adds nothing (not the role's)."""
        if event == "ping":
            return True
        if event == "response.in_progress":
            self._in_progress += 1
            return self._in_progress > 1  # the first is the stream's own
        choices = payload.get("choices")
        return bool(choices) and all(c.get("delta") == {} and c.get("finish_reason") is None for c in choices)

    def finish(self) -> None:
        """The response ended: a JSON body's usage, if it was not a stream."""
        exchange = self._exchange
        exchange.response_head = bytes(self._whole[:2000])
        if exchange.prompt_tokens is not None:
            return
        try:
            payload = json.loads(bytes(self._whole))
        except ValueError:
            return
        if isinstance(payload, dict):
            usage = (
                _usage("", payload) or _usage("", {"response": payload}) or _usage("", {"message": payload})
            )
            if usage is not None:
                exchange.prompt_tokens, exchange.cached_tokens = usage


def _is_error(event: str, payload: dict[str, Any]) -> bool:
    return event in ("error", "response.failed") or ("error" in payload and "choices" not in payload)


def _is_token(event: str, payload: dict[str, Any]) -> bool:
    """Whether the event carries generated text, thinking or a tool call."""
    if event == "content_block_delta" or event.endswith(".delta"):
        return True
    for choice in payload.get("choices") or ():
        delta = choice.get("delta") or {}
        if delta.get("content") or delta.get("reasoning_content") or delta.get("tool_calls"):
            return True
    return False


def _usage(event: str, payload: dict[str, Any]) -> tuple[int, int] | None:
    """``(prompt tokens, cached tokens)`` in any dialect's usage, if the payload holds one."""
    message = payload.get("message") if event in ("message_start", "") else None
    anthropic = (message or {}).get("usage") if isinstance(message, dict) else None
    if event == "message_delta":
        anthropic = payload.get("usage")
    if isinstance(anthropic, dict) and "input_tokens" in anthropic and "cache_read_input_tokens" in anthropic:
        cached = anthropic.get("cache_read_input_tokens") or 0
        return anthropic["input_tokens"] + cached, cached
    response = payload.get("response")
    responses = response.get("usage") if isinstance(response, dict) else None
    if isinstance(responses, dict) and "input_tokens" in responses:
        details = responses.get("input_tokens_details") or {}
        return responses["input_tokens"], details.get("cached_tokens") or 0
    chat = payload.get("usage")
    if isinstance(chat, dict) and "prompt_tokens" in chat:
        details = chat.get("prompt_tokens_details") or {}
        return chat["prompt_tokens"], details.get("cached_tokens") or 0
    timings = payload.get("timings")
    if isinstance(timings, dict) and "prompt_n" in timings and payload.get("choices"):
        finished = any(c.get("finish_reason") for c in payload["choices"])
        if finished:
            return timings["prompt_n"] + timings.get("cache_n", 0), timings.get("cache_n", 0)
    return None


class LocalServer:
    """An HTTP server on a free port of 127.0.0.1, serving *handler* from a daemon thread while entered."""

    def __init__(self, handler: type[BaseHTTPRequestHandler], *, name: str) -> None:
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name=name, daemon=True)

    @property
    def base_url(self) -> str:
        """Where clients are pointed."""
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        """Stop serving, close the socket and wait for the thread (ten seconds at most)."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)


class LoggingProxy(LocalServer):
    """``http://127.0.0.1:PORT`` forwarding to *upstream*, recording every :class:`Exchange`."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.exchanges: list[Exchange] = []
        self._lock = threading.Lock()
        self._numbers = itertools.count()
        super().__init__(self._handler(), name="agent-proxy")

    def _record(self, exchange: Exchange) -> None:
        with self._lock:
            self.exchanges.append(exchange)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _forward(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length) if length else b""
                exchange = Exchange(
                    number=next(proxy._numbers),
                    method=self.command,
                    path=self.path,
                    headers=dict(self.headers.items()),
                    body=body,
                    started=time.monotonic(),
                )
                proxy._record(exchange)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
                reader = _Reader(exchange)
                try:
                    with (
                        httpx.Client(timeout=httpx.Timeout(None, connect=10)) as client,
                        client.stream(
                            self.command, proxy.upstream + self.path, headers=headers, content=body
                        ) as upstream,
                    ):
                        exchange.status = upstream.status_code
                        self.send_response(upstream.status_code)
                        for name, value in upstream.headers.items():
                            if name.lower() not in _HOP_BY_HOP | {"content-encoding"}:
                                self.send_header(name, value)
                        self.send_header("Connection", "close")
                        self.end_headers()
                        for chunk in _chunks(upstream):
                            now = time.monotonic()
                            if exchange.first_byte_s is None:
                                exchange.first_byte_s = now - exchange.started
                            reader.feed(chunk, now)
                            self.wfile.write(chunk)
                            self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError):
                    exchange.left_early = True
                except httpx.HTTPError as error:
                    exchange.stream_errors.append(f"upstream: {error!r}")
                finally:
                    exchange.ended_s = time.monotonic() - exchange.started
                    reader.finish()
                self.close_connection = True

            do_GET = do_POST = do_HEAD = do_DELETE = _forward

            def log_message(self, *_: object) -> None:
                return

        return Handler


def _chunks(response: httpx.Response) -> Iterator[bytes]:
    yield from response.iter_raw()
