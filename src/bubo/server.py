"""``create_app(settings)``: pure wiring of routes, errors, auth and the model's lifecycle.

Creating the app loads nothing.  The model loads in a worker thread started
from ``before_serving`` (in quart-trio's lifespan nursery), so the server
answers ``/health`` and a 503 ``/ready`` while it loads.
"""

from __future__ import annotations

import hmac
import itertools
import logging
import os
import re
import signal
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import attrs
import trio
from quart import Response, current_app, g, request
from quart_cors import cors
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException, RequestEntityTooLarge

from bubo.api import (
    _root,
    anthropic,
    debug,
    gateway,
    llamacpp,
    ollama,
    openai,
    ops,
    prompt_cache,
    responses,
    webui,
)
from bubo.api._access_log import AccessLog, header, request_id_in
from bubo.api._boundary import DEFAULT_ORIGIN_SCHEMES, BrowserBoundary
from bubo.api._context import EXTENSION_KEY, ApiContext, api_context, request_id
from bubo.api._converter import make_converter
from bubo.api._errors import known_error, render_error
from bubo.api._transport import TransportGuard
from bubo.config import ANY_HOST, LOOPBACK_ORIGINS, ServerSettings, Settings
from bubo.domain.ids import new_id
from bubo.errors import (
    AuthenticationFailed,
    BrowserRefused,
    BuboError,
    InternalError,
    InvalidRequest,
    MethodNotAllowed,
    NotFound,
    PayloadTooLarge,
    ServiceUnavailable,
)
from bubo.model import GGUFError
from bubo.service.response_store import ResponseStore
from bubo.service.runtime import Runtime, ServerState, Status

__all__ = [
    "REQUEST_CONVERTER",
    "REQUEST_ID_HEADER",
    "Loader",
    "browser_boundary",
    "create_app",
    "drain",
    "install_edge",
    "package_version",
    "request_bodies",
    "start_draining",
]

logger = logging.getLogger(__name__)

Loader = Callable[[Settings, Callable[[float], None]], Runtime]
"""Builds the runtime, blocking; ``bubo.loader.load_runtime`` unless a test injects another."""

RECOVERY_MAX_DELAY_S = 60.0
# After the shutdown deadline: how long the interrupted decode may take to stop (one token or prefill chunk).
INTERRUPT_WAIT_S = 10.0
REQUEST_ID_HEADER = "X-Request-Id"
_SANE_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")


def package_version() -> str:
    """Bubo's installed version (0.0.0 from a source tree that was not installed)."""
    from importlib.metadata import PackageNotFoundError, version  # noqa: PLC0415

    try:
        return version("bubo")
    except PackageNotFoundError:
        return "0.0.0"


def _load_runtime(settings: Settings, progress: Callable[[float], None]) -> Runtime:
    """The real loader, imported when the model loads: `import bubo.app` stays free of llama.cpp."""
    from bubo.loader import load_runtime  # noqa: PLC0415

    return load_runtime(settings, progress)


def _terminate_process() -> None:
    """Default reaction to a model that cannot load: stop serving (Hypercorn exits on SIGTERM)."""
    os.kill(os.getpid(), signal.SIGTERM)


def request_bodies() -> tuple[Any, ...]:
    """Every type a route structures a request body (or a part of one) as, from each dialect's list."""
    dialects = (openai, anthropic, responses, llamacpp, ollama, debug)
    return tuple(itertools.chain.from_iterable(dialect.REQUEST_BODIES for dialect in dialects))


REQUEST_CONVERTER = make_converter(request_bodies())
"""The one request converter, every app's: its hooks are built as this module is imported, so a
body type that JSON cannot be structured as unambiguously stops the start-up, never a request
(``docs/design.md``, "Converters: one policy")."""


def create_app(
    settings: Settings,
    *,
    load: Loader | None = None,
    on_load_failure: Callable[[], None] = _terminate_process,
) -> QuartTrio:
    """The Quart-trio app serving *settings*' model."""
    app = QuartTrio("bubo", static_folder=None)  # no /static/ route: the chat page's files are webui.py's
    app.config.update(
        RESPONSE_TIMEOUT=60,  # non-streaming bodies; SSE responses set their own None
        BODY_TIMEOUT=60,
        MAX_CONTENT_LENGTH=settings.server.max_body_mib * 1024 * 1024,
        JSON_SORT_KEYS=False,
    )
    state = ServerState()
    context = ApiContext(
        state=state,
        api_key=settings.server.api_key,
        version=package_version(),
        responses=ResponseStore(
            max_entries=settings.server.responses_max_stored,
            max_bytes=settings.server.responses_store_mib * 1024 * 1024,
        ),
        debug_hooks=settings.server.debug_hooks,
        verbose=settings.server.verbose,
        sse_keepalive_s=settings.server.sse_keepalive,
        effective_settings=_redacted(settings) if settings.server.debug_hooks else {},
        metrics=settings.server.metrics,
        slots=settings.server.slots,
        converter=REQUEST_CONVERTER,
    )
    app.extensions[EXTENSION_KEY] = context

    for blueprint in (ops, gateway, prompt_cache, openai, anthropic, responses, llamacpp, ollama, debug):
        app.register_blueprint(blueprint.blueprint)
    # `/`: the chat page (which answers "Ollama is running" to what is not a browser), else that sentence
    app.register_blueprint(webui.blueprint if settings.server.webui else _root.blueprint)
    app = install_edge(app, settings)

    @app.before_serving
    async def start_loading() -> None:
        app.nursery.start_soon(_serve_model, state, settings, load or _load_runtime, on_load_failure)

    @app.after_serving
    async def free_model() -> None:
        if state.runtime is not None:
            runtime, state.runtime = state.runtime, None
            state.status = Status.LOADING
            await runtime.engine.aclose()

    return app


def install_edge(app: QuartTrio, settings: Settings) -> QuartTrio:
    """What every Bubo app does at its edge: CORS, transport, request ids, browser boundary, key, errors.

    Shared by the single-model app and the router (``bubo.router``); the app's
    :class:`ApiContext` carries the key.  Returns the app (CORS wraps it).
    """
    origins = settings.server.cors_origins
    app = cors(
        app,
        allow_origin="*" if "*" in origins else [APP_ORIGIN, *(_origin(o) for o in origins)],
        allow_headers=["Authorization", "Content-Type", "X-Api-Key", "X-Request-Id", "Anthropic-Version"],
        allow_methods=["GET", "POST", "OPTIONS"],
        expose_headers=[REQUEST_ID_HEADER, "Retry-After"],
    )
    # How each response ends (connections closed, keep-alive timers re-armed, HTTP/2 streams kept
    # until the request ends) and WebSocket refused: bubo/api/_transport.py; under it the access log,
    # one line per request however it ended (bubo/api/_access_log.py), which also assigns its id.
    app.asgi_app = TransportGuard(  # type: ignore[method-assign] # Quart's middleware hook
        AccessLog(app.asgi_app, request_id=_request_id_of)
    )
    app.before_request(_note_arrival)
    app.before_request(_assign_request_id)
    app.before_request(_boundary_check(browser_boundary(settings.server)))
    app.before_request(_check_api_key)
    app.after_request(_echo_request_id)
    app.register_error_handler(BuboError, _render)
    app.register_error_handler(HTTPException, _http_error)
    app.register_error_handler(Exception, _unexpected_error)
    return app


APP_ORIGIN = re.compile("(?:" + "|".join(map(re.escape, sorted(DEFAULT_ORIGIN_SCHEMES))) + r")://\S*\Z")
"""The desktop, editor and extension front ends Ollama allows by default (``app://``, ``tauri://``,
``vscode-webview://``, …): answered with CORS headers without ``--cors-origins``, so they read what
they ask, as they do from Ollama.  Web pages (``http``, ``https``) get them only from ``--cors-origins``."""

LOOPBACK_ORIGIN = re.compile(r"https?://(?:localhost|127(?:\.\d{1,3}){3}|\[::1\])(?::\d{1,5})?\Z")
"""What ``--cors-origins localhost`` allows: a page from this machine, any port (llama-server's)."""


def _origin(origin: str) -> str | re.Pattern[str]:
    return LOOPBACK_ORIGIN if origin == LOOPBACK_ORIGINS else origin


def browser_boundary(server: ServerSettings) -> BrowserBoundary:
    """The Host and Origin checks with what ``--allowed-hosts`` and ``--cors-origins`` allow."""
    origins = server.cors_origins
    return BrowserBoundary(
        allowed_hosts=tuple(host for host in server.allowed_hosts if host != ANY_HOST),
        any_host=ANY_HOST in server.allowed_hosts,
        cors_origins=frozenset(o.lower() for o in origins if o not in ("*", LOOPBACK_ORIGINS)),
        any_origin="*" in origins,
        loopback_origins=LOOPBACK_ORIGINS in origins,
    )


def _boundary_check(boundary: BrowserBoundary) -> Callable[[], Awaitable[None]]:
    async def check_browser_boundary() -> None:
        """Refuse what a web page must not send, before the key and the body (bubo/api/_boundary.py)."""
        headers = request.headers
        error = boundary.refuse_host(headers.getlist("Host"), request.scope.get("server"))
        if error is None:
            error = boundary.refuse_origin(
                origins=headers.getlist("Origin"),
                host=headers.get("Host"),
                method=request.method,
                fetch_site=headers.get("Sec-Fetch-Site"),
                fetch_mode=headers.get("Sec-Fetch-Mode"),
                fetch_dest=headers.get("Sec-Fetch-Dest"),
            )
        if error is not None:
            logger.warning("refused %s %r: %s", request.method, request.path, error.message)
            raise error

    return check_browser_boundary


def start_draining(app: QuartTrio) -> None:
    """Answer ``/ready`` 503 ``stopping`` from now on while still admitting requests (``--drain-delay``).

    A gateway that polls ``/ready`` (smg's health check, a Kubernetes readiness
    probe) stops sending here within its check interval; the requests it sends
    meanwhile are served, not refused.  :func:`drain` then refuses the rest.
    """
    app.extensions[EXTENSION_KEY].state.draining = True


async def drain(app: QuartTrio, grace_s: float) -> None:
    """Admit no new request, let running and queued ones finish within *grace_s* seconds, then end the rest.

    Called on SIGINT/SIGTERM before Hypercorn stops serving: Hypercorn's own
    grace period also waits for idle keep-alive connections (every agent keeps
    one), so Bubo waits for its work here and gives Hypercorn only a short
    grace to flush what finished.  What is still running or waiting at the
    deadline ends with a 503 ``not_ready``: an error response for a request
    that has sent no headers yet, the dialect's error event in a stream.
    """
    state = app.extensions[EXTENSION_KEY].state
    state.stopping = True
    with trio.move_on_after(grace_s):
        await _until_idle(state)
    runtime = state.runtime
    if runtime is None or not state.busy:
        return
    logger.warning("requests still running after %.0f s: they end with 503 not_ready", grace_s)
    runtime.engine.interrupt(
        ServiceUnavailable(
            f"the server is shutting down and this request did not finish within {grace_s:g} s "
            "(--shutdown-timeout)",
            code="not_ready",
        )
    )
    with trio.move_on_after(INTERRUPT_WAIT_S):
        await _until_idle(state)


async def _until_idle(state: ServerState) -> None:
    if state.runtime is not None:
        await state.runtime.engine.wait_idle()


def _redacted(settings: Settings) -> dict[str, Any]:
    """*settings* as JSON-ready data, with the API key replaced (``/debug/settings``)."""
    data = attrs.asdict(settings, value_serializer=lambda _i, _a, v: str(v) if isinstance(v, Path) else v)
    if data["server"]["api_key"] is not None:
        data["server"]["api_key"] = "<redacted>"
    return data


async def _note_arrival() -> None:
    """When the server began handling the request: latencies are measured from here (``request_timeline``)."""
    g.received_at = trio.current_time()


def _request_id_of(scope: Mapping[str, Any]) -> str:
    """The client's ``X-Request-Id`` when it sent a sane one, else a new ``req_…`` (the access log's too)."""
    supplied = header(scope, REQUEST_ID_HEADER.lower().encode())
    return supplied if _SANE_REQUEST_ID.fullmatch(supplied) else new_id("req_")


async def _assign_request_id() -> None:
    g.request_id = request_id_in(request.scope)


async def _echo_request_id(response: Response) -> Response:
    response.headers[REQUEST_ID_HEADER] = request_id()
    return response


async def _check_api_key() -> None:
    """With ``--api-key``, every route needs it; compared in constant time.

    A CORS preflight is the exception: browsers send it without credentials,
    and refusing it would block the real request that carries the key.  So
    are the chat page's static files: they hold nothing secret, and the page
    they make asks for the key (bubo/api/webui.py).
    """
    expected = api_context().api_key
    if expected is None or _is_preflight() or webui.is_public(request.blueprint):
        return
    supplied = _supplied_key()
    if supplied is None or not hmac.compare_digest(supplied.encode(), expected.encode()):
        raise AuthenticationFailed


async def _http_error(error: HTTPException) -> Response:
    return await _render(_from_http(error))


async def _unexpected_error(error: Exception) -> Response:
    known = known_error(error)  # the engine's errors name a cause, which the API makes a response
    if known is not None:
        return await _render(known)
    logger.error("unhandled error on %s %s", request.method, request.path, exc_info=error)
    return await _render(InternalError("the server failed to handle the request"))


async def _render(error: BuboError) -> Response:
    """The error in the envelope of the dialect that owns the path.

    A request refused at the browser boundary is answered without reading its
    body: a hostile page's upload is not read to refuse it, the connection is
    closed instead.
    """
    body_read = False if isinstance(error, BrowserRefused) else await _finish_reading_body()
    if _under(request.path, anthropic.PATH_PREFIX):
        response = anthropic.render_error(error, request_id())
    elif _under(request.path, ollama.PATH_PREFIX):
        response = ollama.render_error(error)
    else:
        response = render_error(error, llama_server=request.blueprint == llamacpp.blueprint.name)
    if not body_read:
        response.headers["Connection"] = "close"
    return response


def _under(path: str, prefix: str) -> bool:
    return path == prefix or path.startswith(prefix + "/")


async def _finish_reading_body() -> bool:
    """Read what the handler left of the request body; False when it is over the limit.

    Errors raised before the handler reads the body (401, 404, 405, 503) would
    otherwise leave it unread, and Hypercorn can then stall the keep-alive
    connection: the client's next request on it is never answered.  A body over
    the limit is not read on (a 413): the connection is closed instead.
    """
    try:
        async for _ in request.body:
            pass
    except RequestEntityTooLarge:
        return False
    return True


def _is_preflight() -> bool:
    return request.method == "OPTIONS" and "Access-Control-Request-Method" in request.headers


def _supplied_key() -> str | None:
    """``Authorization: Bearer KEY``, or Anthropic's ``x-api-key``."""
    authorization = request.headers.get("Authorization", "")
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return request.headers.get("x-api-key")


def _from_http(error: HTTPException) -> BuboError:
    if error.code == 404:
        return NotFound(f"no such endpoint: {request.method} {request.path}")
    if error.code == 405:
        allowed = ", ".join(sorted(getattr(error, "valid_methods", None) or ()))
        return MethodNotAllowed(
            f"{request.path} does not accept {request.method}" + (f"; use {allowed}" if allowed else ""),
            headers={"Allow": allowed} if allowed else None,
        )
    if error.code == 413:
        limit = current_app.config["MAX_CONTENT_LENGTH"]
        return PayloadTooLarge(
            f"the request body exceeds {limit // (1024 * 1024)} MiB (the server's --max-body-mib)"
        )
    status = error.code or 500
    description = error.description or "the request failed"
    if status < 500:
        return InvalidRequest(
            description, code=(error.name or "invalid_request").lower().replace(" ", "_"), status=status
        )
    return InternalError(description, status=status)


async def _serve_model(
    state: ServerState,
    settings: Settings,
    load: Loader,
    on_load_failure: Callable[[], None],
) -> None:
    """Load the model, serve its idle work, and watch it: a lost engine is reported (and reloaded)."""

    def progress(fraction: float) -> None:
        state.load_progress = fraction

    try:
        runtime = await _load(settings, load, progress)
    except Exception as error:
        state.failure = str(error)
        state.settle(Status.FAILED)
        expected = known_error(error) is not None or isinstance(error, GGUFError | OSError)
        logger.critical("the model failed to load: %s", error, exc_info=not expected)
        on_load_failure()
        return
    while True:
        state.runtime = runtime
        state.settle(Status.READY)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(runtime.sleeper.run, runtime.engine)  # frees the model while idle
            await runtime.engine.wait_retired()  # closed (shutdown) or lost
            nursery.cancel_scope.cancel()
        if not runtime.engine.lost:
            return
        state.status = Status.DEVICE_LOST
        logger.critical("the engine is lost: every request now gets 503 device_lost")
        if not settings.server.device_recovery:
            return
        state.status = Status.RECOVERING
        await runtime.engine.aclose()
        runtime = await _reload(settings, load, progress)


async def _load(settings: Settings, load: Loader, progress: Callable[[float], None]) -> Runtime:
    """Load in a worker thread; a shutdown that arrives meanwhile waits for it, then frees what it loaded.

    A loading thread cannot be interrupted (llama.cpp owns it), so trio would
    discard its result on cancellation and leak the model until exit.
    """
    with trio.CancelScope(shield=True):
        runtime = await trio.to_thread.run_sync(load, settings, progress)
    try:
        await trio.lowlevel.checkpoint_if_cancelled()
    except trio.Cancelled:
        with trio.CancelScope(shield=True):
            await runtime.engine.aclose()
        raise
    return runtime


async def _reload(settings: Settings, load: Loader, progress: Callable[[float], None]) -> Runtime:
    """Load the model again, backing off from 1 s to 60 s between failed attempts."""
    delay = 1.0
    for attempt in itertools.count(1):
        try:
            runtime = await _load(settings, load, progress)
        except Exception:
            logger.exception("reloading the model failed (attempt %d); next try in %.0f s", attempt, delay)
            await trio.sleep(delay)
            delay = min(delay * 2, RECOVERY_MAX_DELAY_S)
        else:
            logger.warning("the model was reloaded after the engine was lost (attempt %d)", attempt)
            return runtime
    raise AssertionError("unreachable")
