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
    "request_id",
    "request_timeline",
    "require_runtime",
    "structured_body",
]

T = TypeVar("T")

EXTENSION_KEY = "bubo"
# Bodies up to this size are parsed on the event loop (a thread hop costs more than they do);
# larger ones in a worker (json.loads of 256 KiB: about 2 ms).
INLINE_BODY_BYTES = 256 * 1024


@attrs.frozen(kw_only=True)
class ApiContext:
    """Per-app objects the API layer needs; built by ``bubo.server.create_app``."""

    state: ServerState
    api_key: str | None = attrs.field(default=None, repr=False)
    version: str = "0.0.0"
    responses: ResponseStore = attrs.field(factory=ResponseStore)
    debug_hooks: bool = False
    effective_settings: dict[str, Any] = attrs.field(factory=dict)  # for /debug/settings, key redacted
    latency: LatencyHistograms = attrs.field(factory=LatencyHistograms)  # /metrics' bubo:*_seconds
    metrics: bool = True  # GET /metrics is served (--metrics)
    slots: bool = True  # GET /slots is served (--slots)
    started: int = attrs.field(factory=lambda: int(time.time()))  # unix time the server started
    sse_keepalive_s: float = 5.0  # a stream silent this long sends a keep-alive; 0: never
    # request bodies to wire models; cattrs caches the hooks it builds inside, so it is the app's
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


async def json_body() -> dict[str, Any]:
    """The request body as a JSON object (400 ``parse_error`` otherwise), whatever its content type."""
    return parse_json_object(await _raw_body())


async def structured_body(
    runtime: Runtime, cls: type[T], precheck: Callable[[dict[str, Any]], None] | None = None
) -> T:
    """The request body structured as *cls* by the app's converter (400 naming the field otherwise).

    A large body is parsed in one of the runtime's workers, admitted against
    memory first, so that it does not freeze the event loop.  *precheck* sees
    the parsed JSON before it is structured (a size limit that should not wait
    for millions of values to be checked one by one).
    """
    raw = await _raw_body()
    converter = api_context().converter

    def parse() -> T:
        data = parse_json_object(raw)
        if precheck is not None:
            precheck(data)
        return structure(converter, data, cls)

    if len(raw) <= INLINE_BODY_BYTES:
        return parse()
    return await runtime.workers.run(parse, need_bytes=len(raw) * PARSE_BYTES_PER_BYTE)


async def structured_array(item: type[T]) -> list[T]:
    """The request body, a JSON array, structured as a list of *item* (400 naming the bad field otherwise).

    For small bodies only (``POST /lora-adapters``): it is parsed on the event loop.
    """
    data = parse_json(await _raw_body(), list, "a JSON array")
    return structure(api_context().converter, data, list[item])  # type: ignore[valid-type] # a runtime type


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
