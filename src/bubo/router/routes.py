"""The router's routes: its own (health, readiness, ``/models``, load, unload, props) and forwarding.

Every route of the single-model app that the router does not answer itself
is forwarded to a model's child: a POST by its body's ``model``, any other
method by ``?model=``; with no model named, to the one loaded model, if
exactly one is.  ``?autoload=true|false`` overrides ``--models-autoload``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import httpx
import trio
from quart import Blueprint, Response, request
from werkzeug.routing import Rule

from bubo.api import ollama, webui
from bubo.api._context import api_context, request_id
from bubo.api._converter import parse_json_object
from bubo.api._json import json_response
from bubo.api.anthropic import PATH_PREFIX as ANTHROPIC_PREFIX
from bubo.domain.addresses import is_loopback
from bubo.errors import BuboError, InvalidRequest, NotFound, ServiceUnavailable
from bubo.service.work import PARSE_BYTES_PER_BYTE

from . import ollama as router_ollama
from .command import extra_args
from .context import RouterContext, router_context
from .proxy import Dialect, forward, forwarded_headers
from .registry import Instance, ModelRecord

__all__ = ["OWN_PATHS", "blueprint", "forwarding_blueprint"]

blueprint = Blueprint("router", __name__)

DEBUG_PREFIX = "/debug"  # --debug-hooks' routes (api/debug.py): forwarded for loopback clients only
RESPONSES_PATHS = frozenset({"/v1/responses", "/responses"})  # OpenAI's Responses API streams
# A request its child dropped waits this long for the child's exit, to say how it ended.
EXIT_NOTICE_S = 2.0

# Paths the router answers itself (Ollama's listing, pull and unloading too: router/ollama.py); every
# other route of the single-model app is forwarded.
OWN_PATHS = router_ollama.OWN_PATHS | {
    "/health",
    "/v1/health",
    "/healthz",
    "/ready",
    "/v1/ready",
    "/readyz",
    "/models",
    "/v1/models",
    "/models/load",
    "/models/unload",
    "/props",
    "/",  # the chat page, or "Ollama is running"
}


@blueprint.get("/health")
@blueprint.get("/v1/health")
@blueprint.get("/healthz")
async def health() -> Response:
    """Liveness of the router itself."""
    return json_response({"status": "ok"})


@blueprint.get("/ready")
@blueprint.get("/v1/ready")
@blueprint.get("/readyz")
async def ready() -> Response:
    """The router takes requests (models load on demand); 503 once it is shutting down."""
    router = router_context()
    if router.stopping or router.draining:
        return json_response({"status": "stopping", "role": "router"}, status=503)
    return json_response({"status": "ready", "role": "router"})


@blueprint.get("/models")
@blueprint.get("/v1/models")
async def models() -> Response:
    """Every model with its ``status`` (llama-server's shape); ``?reload=1`` reads the catalog again."""
    router = router_context()
    if request.args.get("reload", "0") not in ("0", "false", ""):
        await router.reload()
    data = [record.describe(router.created) for record in router.registry.listed()]
    return json_response({"data": data, "object": "list"})


@blueprint.post("/models/load")
async def load() -> Response:
    """Start loading a model (``model``; ``extra_args`` with ``--models-allow-extra-args``)."""
    router = router_context()
    _check_open(router)
    body = await _json_body()
    record = router.registry.get(_model_field(body))
    extra: tuple[str, ...] = ()
    if "extra_args" in body:
        if not router.allow_extra_args:
            raise InvalidRequest(
                "extra_args needs the router to be started with --models-allow-extra-args",
                code="extra_args_not_allowed",
                param="extra_args",
            )
        card = router.cards.get(record.name)
        extra = extra_args(body["extra_args"], trained_context=card.context_length if card else 0)
    if record.running or router.supervisor.queued(record):
        state = record.state.value if record.running else "waiting to load"
        raise InvalidRequest(
            f"model {record.name!r} is already {state}", code="model_already_loaded", param="model"
        )
    router.supervisor.request_load(record, extra)
    return json_response({"success": True})


@blueprint.post("/models/unload")
async def unload() -> Response:
    """Stop a model's child; it finishes its running requests first."""
    router = router_context()
    record = router.registry.get(_model_field(await _json_body()))
    if not record.running:
        raise InvalidRequest(f"model {record.name!r} is not loaded", code="model_not_loaded", param="model")
    router.supervisor.unload(record)
    return json_response({"success": True})


@blueprint.get("/props")
async def props() -> Response:
    """With ``?model=``, that model's ``/props``; without, the router's own (llama-server's shape)."""
    if request.args.get("model"):
        return await forward_request()
    router = router_context()
    return json_response(
        {
            "role": "router",
            "max_instances": router.models_max,
            "models_autoload": router.autoload,
            "model_alias": "bubo",
            "model_path": "none",
            "default_generation_settings": {"params": {}, "n_ctx": 0},
            "build_info": api_context().fingerprint,
        }
    )


async def forward_request(**_path: Any) -> Response:
    """Forward the request to the child of the model it names (loading it first when allowed).

    ``/debug/*`` goes only to a client on this machine: a child sees the router's own loopback
    address as every request's, so its own check (api/debug.py) cannot tell; without, it is the
    404 of a path that does not exist, as the child answers without ``--debug-hooks``.
    """
    router = router_context()
    if _under(request.path, DEBUG_PREFIX) and not _from_loopback():
        raise NotFound(f"no such endpoint: {request.method} {request.path}")
    _check_open(router)
    body = b""
    if request.method == "POST":
        body = await _raw_body()
        record = await _record_of_body(router, body)
    else:
        name = request.args.get("model")
        record = router.registry.get(name) if name else router.registry.only_loaded()
    return await _forward(router, record, body)


async def _forward(router: RouterContext, record: ModelRecord, body: bytes) -> Response:
    autoload = _autoload(router)
    instance = await router.supervisor.acquire(record, autoload=autoload)  # with a lease on it
    if request.method == "POST":  # what keeps a model from LRU unloading (as in llama-server)
        record.last_used = trio.current_time()
    upstream = router.client.build_request(
        request.method,
        httpx.URL(instance.base_url + request.path, query=request.query_string),
        headers=forwarded_headers(request.headers.items(), router.supervisor.child_headers, request_id()),
        content=body,
    )
    return await forward(
        router.client,
        upstream,
        failure=lambda: _failure(router, instance),
        dialect=_dialect(request.path),
        request_id=request_id(),
        on_close=lambda: router.supervisor.release(instance),
    )


@blueprint.post("/api/chat")
@blueprint.post("/api/generate")
async def ollama_generation() -> Response:
    """Ollama's chat and generate: an empty request with ``keep_alive: 0`` unloads, any other is forwarded."""
    router = router_context()
    _check_open(router)
    raw = await _raw_body()
    body = await _parse(raw)
    answer = router_ollama.unload(router, "chat" if request.path == "/api/chat" else "generate", body)
    if answer is not None:
        return answer
    return await _forward(router, router_ollama.record_named(router, body), raw)


@blueprint.post("/api/pull")
async def ollama_pull() -> Response:
    """A model of the directory "pulls" at once, without loading (``bubo.router.ollama``)."""
    router = router_context()
    return await router_ollama.pull(router, await _json_body())


def forwarding_blueprint(rules: Iterable[Rule]) -> Blueprint:
    """A blueprint that forwards each of *rules* (the single-model app's) not answered by the router.

    The chat page's files are the router's own (:mod:`bubo.api.webui`), not a model's.
    """
    methods: dict[str, set[str]] = {}
    for rule in rules:
        own = rule.rule in OWN_PATHS or rule.endpoint.startswith(webui.blueprint.name + ".")
        if not own:
            methods.setdefault(rule.rule, set()).update((rule.methods or set()) - {"HEAD", "OPTIONS"})
    forwarding = Blueprint("router_forward", __name__)
    for index, (path, allowed) in enumerate(sorted(methods.items())):
        forwarding.add_url_rule(
            path, endpoint=f"forward_{index}", view_func=forward_request, methods=sorted(allowed)
        )
    return forwarding


async def _failure(router: RouterContext, instance: Instance) -> BuboError:
    """Why a child stopped answering: wait (briefly) for its exit to say how it ended."""
    with trio.move_on_after(EXIT_NOTICE_S):
        await instance.exited.wait()
    if instance.failed:
        return router.supervisor.failure(instance)
    if instance.stopping:
        why = "was unloaded before it answered"
    else:
        why = "closed the connection before it answered"
    return ServiceUnavailable(f"model {instance.model!r} {why}; send the request again", code="not_ready")


def _from_loopback() -> bool:
    """Whether the router's own client (the ASGI scope's peer) is on this machine."""
    client = request.scope.get("client")
    return client is not None and is_loopback(client[0])


def _under(path: str, prefix: str) -> bool:
    return path == prefix or path.startswith(prefix + "/")


def _dialect(path: str) -> Dialect:
    """Whose error events the stream at *path* speaks (an error that ends it must match)."""
    if _under(path, ANTHROPIC_PREFIX):
        return "anthropic"
    if _under(path, ollama.PATH_PREFIX):
        return "ollama"
    if path in RESPONSES_PATHS:
        return "responses"
    return "openai"


def _check_open(router: RouterContext) -> None:
    if router.stopping:
        raise ServiceUnavailable("the server is shutting down", code="not_ready")


def _autoload(router: RouterContext) -> bool:
    value = request.args.get("autoload")
    if value is None:
        return router.autoload
    if value in ("true", "1"):
        return True
    if value in ("false", "0"):
        return False
    raise InvalidRequest(f"autoload must be true or false, got {value!r}", param="autoload")


async def _raw_body() -> bytes:
    body = await request.get_data(cache=False, as_text=False)
    return body.encode() if isinstance(body, str) else body


async def _json_body() -> dict[str, Any]:
    return await _parse(await _raw_body())


async def _parse(body: bytes) -> dict[str, Any]:
    """The body as a JSON object (400 ``parse_error`` otherwise), parsed by the router's workers.

    Whatever its size, off the event loop and admitted against memory, as the single-model app parses.
    """
    return await router_context().workers.run(
        lambda: parse_json_object(body), need_bytes=len(body) * PARSE_BYTES_PER_BYTE
    )


async def _record_of_body(router: RouterContext, body: bytes) -> ModelRecord:
    """The model a POST body names; a body that names none goes to the one loaded model."""
    if _under(request.path, ollama.PATH_PREFIX):  # Ollama's names: NAME, NAME:latest, any case
        return router_ollama.record_named(router, await _parse(body) if body.strip() else {})
    if not body.strip():
        return router.registry.only_loaded()
    name = _model_field(await _parse(body))
    return router.registry.get(name) if name else router.registry.only_loaded()


def _model_field(body: dict[str, Any]) -> str | None:
    name = body.get("model")
    if name is not None and not isinstance(name, str):
        raise InvalidRequest("model must be a string", param="model")
    return name
