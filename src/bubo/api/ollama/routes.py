"""Ollama's routes under ``/api``: version, tags, ps, show, chat, generate, embed, pull; 501 for the rest.

Model names resolve as :mod:`.names` says.  ``keep_alive`` (a bad one is a
400) sets how long the idle model stays loaded, as Ollama's does
(``bubo.service.idle``): the model is freed that long after the last request
and loaded again by the next; an empty request with ``keep_alive: 0`` frees it
now (``done_reason: "unload"``), any other empty request loads it.  The
operator's ``--ollama-keep-alive`` decides how much of that a client may do
(``extend`` and ``ignore`` never let ``keep_alive: 0`` free the model: such a
request loads it, as any other empty one).  Router mode unloads the model's
child instead (``bubo.router``).
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import trio
from quart import Blueprint, Response, request

from bubo.api._context import request_timeline, require_runtime, structured_body
from bubo.api._embedding_inputs import MAX_EMBEDDING_INPUTS
from bubo.api._json import json_response
from bubo.errors import InternalError, InvalidRequest, NotImplementedOnThisModel
from bubo.model import ModelCard
from bubo.service.capabilities import Capabilities
from bubo.service.chat import prepare_chat
from bubo.service.embeddings import (
    ANSWER_BYTES_PER_FLOAT,
    EUCLIDEAN,
    Embedded,
    embed,
    normalize,
    require_vectors,
)
from bubo.service.generation import PreparedGeneration, open_output, prepare_completion
from bubo.service.infill import InfillParts, chunk_chars, infill_tokens
from bubo.service.runtime import Runtime
from bubo.service.work import PREPARE_BYTES_PER_CHAR

from . import models, translate, wire
from .names import require_name
from .options import generation_options, keep_alive_seconds, thinks
from .stream import NDJSON, ChatChunks, GenerateChunks, answer, line, ndjson_response

__all__ = [
    "COPILOT_USER_AGENT",
    "PATH_PREFIX",
    "VERSION",
    "blueprint",
    "capabilities",
    "pull_lines",
    "pull_response",
    "unload_answer",
]

logger = logging.getLogger(__name__)

PATH_PREFIX = "/api"
"""Errors on paths under this prefix use Ollama's ``{"error": "..."}``."""

VERSION = "0.22.0"
"""What ``/api/version`` says: the Ollama release whose API Bubo follows (``think: "max"`` came in it).
Clients refuse a version that is not numeric or older than they need (VS Code Copilot: 0.6.4)."""

COPILOT_USER_AGENT = "GitHubCopilotChat/"
"""Ollama writes the requested name into ``general.basename`` for this client; so does Bubo."""

blueprint = Blueprint("ollama", __name__)


def _card(runtime: Runtime) -> ModelCard:
    if runtime.card is None:
        raise InternalError("the served model has no card (the runtime was built without its file)")
    return runtime.card


def capabilities(served: Capabilities) -> list[str]:
    """``capabilities``, in Ollama's order, from what the server answers (``service/capabilities.py``).

    ``completion`` and ``tools`` for a model that generates (a template without
    a tools section gets Bubo's); ``vision`` with a projector (``--mmproj``);
    ``insert`` with fill-in-the-middle tokens; ``embedding`` where embeddings
    are served (``--embeddings``; a generative model's pooled as Ollama pools
    it, by its last token); ``thinking`` for a template that thinks.  An
    encoder (BERT's kind) only embeds, as Ollama lists its embedding models (a
    reranker lists nothing: Ollama has no word for ranking).
    """
    words = [
        ("completion", served.completion),
        ("vision", served.vision),
        ("tools", served.tools),
        ("insert", served.insert),
        ("embedding", served.embedding),
        ("thinking", served.thinking),
    ]
    return [word for word, on in words if on]


def _parameters(runtime: Runtime) -> dict[str, Any]:
    """The server's defaults as Ollama's parameters."""
    sampling = runtime.defaults.sampling
    values: dict[str, Any] = {"num_ctx": runtime.engine.info.n_ctx}
    if runtime.defaults.n_predict >= 0:
        values["num_predict"] = runtime.defaults.n_predict
    values.update(
        temperature=sampling.temperature,
        top_k=sampling.top_k,
        top_p=sampling.top_p,
        min_p=sampling.min_p,
        typical_p=sampling.typical_p,
        repeat_penalty=sampling.repeat_penalty,
        repeat_last_n=sampling.repeat_last_n,
        presence_penalty=sampling.presence_penalty,
        frequency_penalty=sampling.frequency_penalty,
    )
    if sampling.seed is not None:
        values["seed"] = sampling.seed
    return values


def _check_thinking(runtime: Runtime, think: bool | str | None, model: str) -> None:
    """Ollama refuses ``think`` for a model that does not think; so does Bubo (400)."""
    if thinks(think) and not runtime.template.supports_thinking:
        raise InvalidRequest(f'"{model}" does not support thinking', param="think")


def _keep_alive(runtime: Runtime, body: Any, keep_alive: float | None) -> float | None:
    """The request's ``keep_alive`` sets how long the idle model stays loaded, as in Ollama.

    Returns the timeout set, as ``--ollama-keep-alive`` admits the request's.
    """
    admitted = runtime.sleeper.keep_alive(keep_alive)
    for name in ("truncate", "shift"):
        if getattr(body, name, None) is not None:
            logger.debug("%s is ignored: a prompt that does not fit is a 400 (context_length_exceeded)", name)
    return admitted


async def _load_or_unload(runtime: Runtime, keep_alive: float | None) -> str:
    """An empty chat or generate request: ``keep_alive: 0`` frees the model, any other loads it (Ollama's).

    *keep_alive* is the timeout admitted (:func:`_keep_alive`), not the one sent.
    """
    if keep_alive == 0:
        await runtime.engine.sleep()  # refused while other requests use it: then it sleeps once they end
        return "unload"
    async with runtime.engine.awake():
        return "load"


def unload_answer(kind: str, model: str, reason: str) -> Response:
    """The answer to an empty ``/api/chat`` (*kind* ``chat``) or ``/api/generate``.

    *reason* is ``load`` or ``unload``; one JSON object whatever ``stream`` says, as Ollama answers.
    """
    if kind == "chat":
        return json_response(
            wire.ChatResponse(
                model=model,
                created_at=translate.created_at(),
                message=wire.MessageOut(),
                done=True,
                done_reason=reason,
            )
        )
    return json_response(
        wire.GenerateResponse(
            model=model, created_at=translate.created_at(), response="", done=True, done_reason=reason
        )
    )


# ---- information --------------------------------------------------------------------------


@blueprint.get("/api/version")
async def version() -> Response:
    """``{"version": "0.22.0"}``."""
    return json_response(wire.Version(version=VERSION))


@blueprint.get("/api/tags")
async def tags() -> Response:
    """The served model under each of its names, as ``NAME:latest``."""
    runtime = require_runtime()
    card = _card(runtime)
    n_ctx = runtime.engine.info.n_ctx
    return json_response(
        wire.ListResponse(models=[models.listed(n, card, n_ctx) for n in runtime.model_names])
    )


@blueprint.get("/api/ps")
async def ps() -> Response:
    """The loaded model under each of its names, and when it will be freed; none while it sleeps."""
    runtime = require_runtime()
    engine = runtime.engine
    if engine.sleeping:
        return json_response(wire.ProcessResponse(models=[]))
    card = _card(runtime)
    expires = runtime.sleeper.expires_at(engine)
    expires_unix = None if expires is None else time.time() + (expires - trio.current_time())
    return json_response(
        wire.ProcessResponse(
            models=[models.running(n, card, engine.info.n_ctx, expires_unix) for n in runtime.model_names]
        )
    )


@blueprint.post("/api/show")
async def show() -> Response:
    """The model's details, metadata, template, parameters and capabilities."""
    runtime = require_runtime()
    body = await structured_body(runtime, wire.ShowRequest)
    requested = body.model or body.name
    name = require_name(requested, runtime.model_names, any_name=runtime.any_model_name)
    if body.verbose:
        logger.debug("/api/show verbose: long metadata arrays are always shown empty")
    info = runtime.engine.info
    copilot = request.headers.get("User-Agent", "").startswith(COPILOT_USER_AGENT)
    return json_response(
        models.show(
            name,
            _card(runtime),
            template=runtime.template.source,
            parameters=_parameters(runtime),
            capabilities=capabilities(runtime.capabilities),
            context_length=info.n_ctx,
            basename=requested if copilot else None,
        )
    )


async def _check_options(runtime: Runtime, options: Mapping[str, Any] | None) -> None:
    """Refuse a bad ``options`` object on a request that does not generate (400), read off the event loop."""
    await runtime.workers.run(functools.partial(generation_options, options))


# ---- generation ---------------------------------------------------------------------------


@blueprint.post("/api/chat")
async def chat() -> Response:
    """A chat turn; streamed as NDJSON unless ``stream`` is ``false``."""
    runtime = require_runtime()
    body = await structured_body(runtime, wire.ChatRequest)
    name = require_name(body.model, runtime.model_names, any_name=runtime.any_model_name)
    keep_alive = _keep_alive(runtime, body, keep_alive_seconds(body.keep_alive))
    model = body.model or name
    if not body.messages:
        await _check_options(runtime, body.options)
        return unload_answer("chat", model, await _load_or_unload(runtime, keep_alive))
    _check_thinking(runtime, body.think, model)
    # Translated by the workers (off the event loop), after the model and keep_alive, as Ollama orders them.
    takes_images = runtime.engine.vision is not None
    chat = await runtime.workers.run(
        functools.partial(translate.chat_request, body, takes_images=takes_images)
    )
    prepared = await prepare_chat(runtime, chat)
    chunks = ChatChunks(
        model=model, received=request_timeline().received, top_logprobs=bool(body.top_logprobs)
    )
    return await _respond(runtime, prepared, chunks, stream=translate.streams(body.stream))


@blueprint.post("/api/generate")
async def generate() -> Response:
    """A completion of ``prompt``: through the chat template, ``raw``, or filling in before ``suffix``."""
    runtime = require_runtime()
    body = await structured_body(runtime, wire.GenerateRequest)
    name = require_name(body.model, runtime.model_names, any_name=runtime.any_model_name)
    keep_alive = _keep_alive(runtime, body, keep_alive_seconds(body.keep_alive))
    model = body.model or name
    if body.raw and (body.template or body.system or body.context):
        raise InvalidRequest("raw mode does not support template, system, or context", param="raw")
    if body.template:
        raise InvalidRequest(
            "template is not supported: Bubo renders the model's own chat template; send raw: true with a "
            "prompt formatted as you need it",
            param="template",
        )
    if not body.prompt:
        await _check_options(runtime, body.options)
        return unload_answer("generate", model, await _load_or_unload(runtime, keep_alive))
    _check_thinking(runtime, body.think, model)
    check_context = functools.partial(translate.check_context, body.context or (), runtime.tokenizer.n_vocab)
    context = await runtime.workers.run(check_context)  # every id read off the event loop
    with_context = True
    takes_images = runtime.engine.vision is not None
    if body.suffix:
        prepared = await _infill(runtime, body, model, context)
    elif body.raw:
        raw = await runtime.workers.run(
            functools.partial(translate.raw_request, body, (body.prompt,), takes_images=takes_images)
        )
        prepared = await prepare_completion(runtime, raw)
        with_context = False  # Ollama leaves context out of raw answers
    else:
        chat = await runtime.workers.run(
            functools.partial(translate.generate_chat_request, body, takes_images=takes_images)
        )
        prepared = await prepare_chat(runtime, chat, prefix=context)
    # An image's positions are stand-in ids, no token of the model: an answer over images has no
    # context to send back (the client sends the images again, and the prompt cache keeps them).
    with_context = with_context and not prepared.prompt.images
    chunks = GenerateChunks(
        model=model,
        received=request_timeline().received,
        top_logprobs=bool(body.top_logprobs),
        prompt_tokens=prepared.prompt.tokens if with_context else None,
    )
    return await _respond(runtime, prepared, chunks, stream=translate.streams(body.stream))


async def _infill(
    runtime: Runtime, body: wire.GenerateRequest, model: str, context: Sequence[int]
) -> PreparedGeneration:
    """``prompt`` before the gap, ``suffix`` after it, in the model's fill-in-the-middle tokens.

    Raises:
        InvalidRequest: the model has no such tokens (Ollama's ``does not support insert``).

    """
    info = runtime.engine.info
    if body.images and runtime.engine.vision is not None:
        raise InvalidRequest("fill-in-the-middle (a suffix) takes no images", param="images")
    fim = info.fim
    if fim is None:
        raise InvalidRequest(
            f'"{model}" does not support insert: its vocabulary has no fill-in-the-middle tokens',
            code="infill_not_supported",
            param="suffix",
        )
    request_ = await runtime.workers.run(functools.partial(translate.raw_request, body, ()))
    n_predict = request_.options.max_tokens
    budget = runtime.defaults.n_predict if n_predict is None else n_predict
    parts = InfillParts(prefix=body.prompt or "", suffix=body.suffix or "")
    tokens = await runtime.workers.run(
        functools.partial(
            infill_tokens,
            runtime.tokenizer,
            fim,
            parts,
            n_batch=info.n_batch,
            n_ctx=info.n_ctx,
            n_predict=max(0, budget),
            spm=runtime.spm_infill,
        ),
        need_bytes=chunk_chars(parts) * PREPARE_BYTES_PER_CHAR,
    )
    return await prepare_completion(runtime, attrs.evolve(request_, prompt=(*context, *tokens)))


async def _respond(
    runtime: Runtime, prepared: PreparedGeneration, chunks: ChatChunks | GenerateChunks, *, stream: bool
) -> Response:
    output = open_output(runtime, prepared, request_timeline())
    if stream:
        return ndjson_response(output, chunks)
    return await answer(output, chunks)


# ---- embeddings ---------------------------------------------------------------------------


def _texts(value: Any) -> list[str]:
    """``input``: a string (none when empty) or a list of strings (400 otherwise)."""
    if value is None:
        return []
    if isinstance(value, str):
        return [value] if value else []
    if not isinstance(value, list):
        raise InvalidRequest("invalid input type: input must be a string or a list of strings", param="input")
    for index, item in enumerate(value):
        if not isinstance(item, str):
            raise InvalidRequest("invalid input type: each input must be a string", param=f"input[{index}]")
    if len(value) > MAX_EMBEDDING_INPUTS:
        raise InvalidRequest(
            f"input holds {len(value)} texts; at most {MAX_EMBEDDING_INPUTS} are accepted in one request",
            param="input",
        )
    return value


def _vectors(results: Sequence[Embedded], dimensions: int | None) -> list[list[float]]:
    """Unit-length vectors; shortened to *dimensions* (and normalized again) when asked, as Ollama does."""
    vectors = []
    for result in results:
        vector = normalize(result.vectors, EUCLIDEAN)
        if dimensions and dimensions < vector.size:
            vector = normalize(vector[:dimensions], EUCLIDEAN)
        vectors.append(vector.tolist())
    return vectors


async def _embedded(runtime: Runtime, texts: list[str], *, param: str, truncate: bool) -> list[Embedded]:
    require_vectors(runtime)
    return await embed(runtime, texts, param=param, truncate=truncate)


@blueprint.post("/api/embed")
async def embed_route() -> Response:
    """One unit-length vector per input.

    ``truncate`` (default true) cuts an input to what one embedding may hold.
    """
    runtime = require_runtime()
    body = await structured_body(runtime, wire.EmbedRequest)
    name = require_name(body.model, runtime.model_names, any_name=runtime.any_model_name)
    _keep_alive(runtime, None, keep_alive_seconds(body.keep_alive))
    await _check_options(runtime, body.options)
    if body.dimensions is not None and body.dimensions < 0:
        raise InvalidRequest("dimensions must be a positive number", param="dimensions")
    texts = await runtime.workers.run(functools.partial(_texts, body.input))
    model = body.model or name
    if not texts:
        require_vectors(runtime)
        return json_response(wire.EmbedResponse(model=model, embeddings=[]))
    clock = translate.Clock(received=request_timeline().received, loaded=trio.current_time())
    results = await _embedded(runtime, texts, param="input", truncate=body.truncate is not False)
    vectors = await runtime.workers.run(
        functools.partial(_vectors, results, body.dimensions),
        need_bytes=sum(r.vectors.size for r in results) * ANSWER_BYTES_PER_FLOAT,
    )
    metrics = clock.embed_metrics(sum(r.n_tokens for r in results), trio.current_time())
    return json_response(wire.EmbedResponse(model=model, embeddings=vectors, **metrics))


@blueprint.post("/api/embeddings")
async def embeddings() -> Response:
    """The older form: ``prompt`` → ``embedding`` (``[]`` for an empty prompt)."""
    runtime = require_runtime()
    body = await structured_body(runtime, wire.EmbeddingsRequest)
    require_name(body.model, runtime.model_names, any_name=runtime.any_model_name)
    _keep_alive(runtime, None, keep_alive_seconds(body.keep_alive))
    await _check_options(runtime, body.options)
    if not body.prompt:
        require_vectors(runtime)
        return json_response(wire.EmbeddingResponse(embedding=[]))
    results = await _embedded(runtime, [body.prompt], param="prompt", truncate=False)
    (vector,) = _vectors(results, None)
    return json_response(wire.EmbeddingResponse(embedding=vector))


# ---- model management ---------------------------------------------------------------------


def pull_lines(card: ModelCard) -> list[wire.Progress]:
    """The progress of "pulling" a model that is already here, ending in ``success``."""
    return [
        wire.Progress(status="pulling manifest"),
        wire.Progress(
            status=f"pulling {card.digest[:12]}",
            digest=f"sha256:{card.digest}",
            total=card.size_bytes,
            completed=card.size_bytes,
        ),
        wire.Progress(status="verifying sha256 digest"),
        wire.Progress(status="writing manifest"),
        wire.Progress(status="success"),
    ]


def pull_response(lines: list[wire.Progress], *, stream: bool | None) -> Response:
    """The progress lines as NDJSON, or the last alone when ``stream`` is ``false``."""
    if not translate.streams(stream):
        return json_response(lines[-1])
    return Response(b"".join(line(item) for item in lines), content_type=NDJSON)


@blueprint.post("/api/pull")
async def pull() -> Response:
    """A served model is here already: success at once; another name is 404 (not with --model-names any)."""
    runtime = require_runtime()
    body = await structured_body(runtime, wire.PullRequest)
    require_name(body.model or body.name, runtime.model_names, any_name=runtime.any_model_name)
    return pull_response(pull_lines(_card(runtime)), stream=body.stream)


@blueprint.post("/api/push")
@blueprint.post("/api/create")
@blueprint.post("/api/copy")
@blueprint.delete("/api/delete")
@blueprint.route("/api/blobs/<path:digest>", methods=["POST", "HEAD"])
async def not_implemented(**_path: str) -> Response:
    """501: Bubo serves the models it was started with."""
    raise NotImplementedOnThisModel(
        f"{request.path} is not supported: Bubo serves the models it was started with "
        "(-m, or the GGUFs of --models-dir) and does not create, copy, push or delete models"
    )
