"""What route handlers reach through the app: state, key, the converter (never module globals)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

import attrs
import cattrs
from quart import current_app, g, request

from bubo.service.latency import RequestTimeline
from bubo.service.response_store import ResponseStore
from bubo.service.runtime import Runtime, ServerState
from bubo.service.work import PARSE_BYTES_PER_BYTE

from ._converter import make_converter, parse_json, parse_json_object, structure
from ._latency import LatencyHistograms

__all__ = [
    "ApiContext",
    "api_context",
    "json_body",
    "read_body",
    "request_id",
    "request_timeline",
    "require_runtime",
    "structured_body",
]

W = TypeVar("W")  # a wire model
D = TypeVar("D")  # what a route translates it to

EXTENSION_KEY = "bubo"


@attrs.frozen(kw_only=True)
class ApiContext:
    """Per-app objects the API layer needs; built by ``bubo.server.create_app``."""

    state: ServerState
    api_key: str | None = attrs.field(default=None, repr=False)
    version: str = "0.0.0"
    responses: ResponseStore = attrs.field(factory=ResponseStore)
    debug_hooks: bool = False
    verbose: bool = False  # --verbose: __verbose on answers to requests that reached a loopback address
    effective_settings: dict[str, Any] = attrs.field(factory=dict)  # for /debug/settings, key redacted
    latency: LatencyHistograms = attrs.field(factory=LatencyHistograms)  # /metrics' bubo:*_seconds
    metrics: bool = True  # GET /metrics is served (--metrics)
    slots: bool = True  # GET /slots is served (--slots)
    started: int = attrs.field(factory=lambda: int(time.time()))  # unix time the server started
    sse_keepalive_s: float = 5.0  # a stream silent this long sends a keep-alive; 0: never
    # request bodies to wire models: bubo.server's REQUEST_CONVERTER, its hooks built at import (the
    # router's app, which structures no body, keeps this default)
    converter: cattrs.Converter = attrs.field(factory=make_converter, repr=False, eq=False)

    @property
    def fingerprint(self) -> str:
        """``system_fingerprint`` on OpenAI responses."""
        return f"bubo-{self.version}"


def api_context() -> ApiContext:
    """The running app's :class:`ApiContext`."""
    context: ApiContext = current_app.extensions[EXTENSION_KEY]
    return context


def require_runtime() -> Runtime:
    """The loaded runtime, or the 503 that says why there is none."""
    return api_context().state.require_runtime()


async def json_body(runtime: Runtime, translate: Callable[[dict[str, Any]], D]) -> D:
    """*translate* of the request body, a JSON object (400 ``parse_error`` otherwise), any content type.

    Parsed and translated in one of the runtime's workers, as :func:`read_body`
    does; only what *translate* keeps comes back to the event loop (a large
    body is freed in the worker too).
    """
    raw = await _raw_body()
    return await runtime.workers.run(lambda: translate(parse_json_object(raw)), need_bytes=_parse_bytes(raw))


async def read_body(
    runtime: Runtime,
    cls: type[W],
    translate: Callable[[W], D],
    precheck: Callable[[dict[str, Any]], None] | None = None,
) -> tuple[W, D]:
    """The request body structured as *cls* by the app's converter, and *translate* of it.

    Parsing, structuring and *translate* (wire to domain: a route's
    ``translate.chat_request``) run as one job in one of the runtime's
    workers, admitted against memory first, whatever the body's size: on the
    event loop a body's cost, however small each piece looks, is every other
    request's wait (``/health`` included).  *precheck* sees the parsed JSON
    before it is structured (a size limit that should not wait for millions of
    values to be checked one by one).

    Raises:
        InvalidRequest: the body is not a JSON object, or a field is wrong (naming its path).

    """
    raw = await _raw_body()
    converter = api_context().converter

    def parse() -> tuple[W, D]:
        data = parse_json_object(raw)
        if precheck is not None:
            precheck(data)
        body = structure(converter, data, cls)
        return body, translate(body)

    return await runtime.workers.run(parse, need_bytes=_parse_bytes(raw))


async def structured_body(
    runtime: Runtime, cls: type[W], precheck: Callable[[dict[str, Any]], None] | None = None
) -> W:
    """The request body structured as *cls* (400 naming the field otherwise), as :func:`read_body` parses."""
    body, _ = await read_body(runtime, cls, _as_is, precheck)
    return body


async def structured_array(runtime: Runtime, item: type[W], translate: Callable[[list[W]], D]) -> D:
    """*translate* of the request body, a JSON array structured as a list of *item* (400 naming the field).

    Parsed, structured and translated in one of the runtime's workers, as
    :func:`read_body` does (``POST /lora-adapters``).
    """
    raw = await _raw_body()
    converter = api_context().converter

    def parse() -> D:
        data = parse_json(raw, list, "a JSON array")
        return translate(structure(converter, data, list[item]))  # type: ignore[valid-type] # a runtime type

    return await runtime.workers.run(parse, need_bytes=_parse_bytes(raw))


def _as_is(body: W) -> W:
    return body


def _parse_bytes(raw: bytes) -> int:
    """The memory a parse of *raw* is admitted with (its objects, and the wire and domain models)."""
    return len(raw) * PARSE_BYTES_PER_BYTE


async def _raw_body() -> bytes:
    body = await request.get_data(cache=False, as_text=False)
    return body.encode() if isinstance(body, str) else body


def request_id() -> str:
    """The current request's id (the client's ``X-Request-Id`` when it sent a sane one)."""
    value: str = g.request_id
    return value


def request_timeline() -> RequestTimeline:
    """A latency timeline for the current request, from its arrival, reporting to the app's histograms."""
    received: float = g.received_at
    return RequestTimeline(observer=api_context().latency, received=received)
