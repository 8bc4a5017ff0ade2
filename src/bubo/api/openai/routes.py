"""OpenAI routes: ``/v1/chat/completions`` (with ``/input_tokens``), ``/v1/completions``, ``/v1/models``."""

from __future__ import annotations

import time

from quart import Blueprint, Response

from bubo.api._capabilities import llama_server_capabilities
from bubo.api._chat import translate as chat_translate
from bubo.api._chat import wire as chat_wire
from bubo.api._chat.reading import chat_request_without_model, on_the_prompt
from bubo.api._context import api_context, read_body, request_timeline, require_runtime
from bubo.api._json import json_response, unstructure
from bubo.api._omitted import report_omitted
from bubo.api._sse import sse_response
from bubo.api._verbose import verbose_fields, verbose_prompt
from bubo.domain.ids import new_id
from bubo.domain.output import Done
from bubo.domain.requests import ChatRequest, CompletionRequest
from bubo.model import ALIAS
from bubo.service.chat import count_chat_request, prepare_chat, render_chat_request
from bubo.service.generation import collect, open_output, prepare_completion
from bubo.service.runtime import Runtime

from . import translate, wire
from .stream import ChatStream, CompletionStream, StreamIdentity

__all__ = ["blueprint"]

blueprint = Blueprint("openai", __name__)


def _identity(model: str, prefix: str) -> StreamIdentity:
    return StreamIdentity(
        id=new_id(prefix), created=int(time.time()), model=model, fingerprint=api_context().fingerprint
    )


@blueprint.post("/v1/chat/completions")
@blueprint.post("/chat/completions")  # llama-server serves it without /v1 too
async def chat_completions() -> Response:
    """Chat, streaming or not."""
    runtime = require_runtime()

    def translated(body: chat_wire.ChatCompletionRequest) -> ChatRequest:
        runtime.check_model(body.model)
        return chat_translate.chat_request(body, takes_images=runtime.engine.vision is not None)

    body, chat = await read_body(runtime, chat_wire.ChatCompletionRequest, translated)
    report_omitted(chat.omitted)
    prepared = await prepare_chat(runtime, chat)
    identity = _identity(body.model or runtime.model_id, "chatcmpl-")
    logprobs = bool(body.logprobs)
    verbose = await verbose_prompt(runtime, prepared.prompt)
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return sse_response(
            open_output(runtime, prepared, request_timeline()),
            ChatStream(
                identity,
                include_usage=include_usage,
                logprobs=logprobs,
                return_progress=bool(body.return_progress),
                timings_per_token=bool(body.timings_per_token),
                verbose_prompt=verbose,
            ),
        )
    async with open_output(runtime, prepared, request_timeline()) as output:
        completion = await collect(output)
    answer = translate.chat_completion(
        completion,
        response_id=identity.id,
        created=identity.created,
        model=identity.model,
        fingerprint=identity.fingerprint,
        logprobs=logprobs,
    )
    return _with_verbose(answer, verbose, completion.done)


@blueprint.post("/v1/chat/completions/input_tokens")
@blueprint.post("/chat/completions/input_tokens")
async def chat_input_tokens() -> Response:
    """The prompt tokens a chat request would evaluate (llama-server's count); no generation.

    ``model`` may be left out, as llama-server allows; if given it must be served here.
    """
    runtime = require_runtime()
    chat = await chat_request_without_model(runtime)

    def count() -> int:
        if chat.prompt.images:  # an image's tokens are the projector's: read as generation reads it
            return len(render_chat_request(runtime, chat).tokens)
        return count_chat_request(runtime, chat)

    n_tokens = await on_the_prompt(runtime, chat, count)
    return json_response(wire.InputTokens(input_tokens=n_tokens))


@blueprint.post("/v1/completions")
async def completions() -> Response:
    """Legacy text completion, streaming or not."""
    runtime = require_runtime()

    def translated(body: wire.CompletionRequest) -> CompletionRequest:
        runtime.check_model(body.model)
        return translate.completion_request(body)

    body, completion_request = await read_body(runtime, wire.CompletionRequest, translated)
    prepared = await prepare_completion(runtime, completion_request)
    identity = _identity(body.model or runtime.model_id, "cmpl-")
    logprobs = body.logprobs is not None
    verbose = await verbose_prompt(runtime, prepared.prompt)
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return sse_response(
            open_output(runtime, prepared, request_timeline()),
            CompletionStream(
                identity, include_usage=include_usage, logprobs=logprobs, verbose_prompt=verbose
            ),
        )
    async with open_output(runtime, prepared, request_timeline()) as output:
        completion = await collect(output)
    answer = translate.text_completion(
        completion,
        response_id=identity.id,
        created=identity.created,
        model=identity.model,
        fingerprint=identity.fingerprint,
        logprobs=logprobs,
    )
    return _with_verbose(answer, verbose, completion.done)


def _with_verbose(answer: object, verbose_prompt: str | None, done: Done) -> Response:
    """*answer* as JSON, with ``__verbose`` under ``--verbose`` (*verbose_prompt* given)."""
    if verbose_prompt is None:
        return json_response(answer)
    return json_response({**unstructure(answer), **verbose_fields(verbose_prompt, done)})


def model_list(runtime: Runtime) -> wire.ModelList:
    """The served model under each of its names."""
    info = runtime.engine.info
    meta = wire.ModelMeta(
        n_ctx=info.n_ctx,
        n_ctx_train=info.n_ctx_train,
        n_vocab=info.n_vocab,
        n_embd=info.n_embd,
        n_params=info.n_params,
        size=info.size_bytes,
        vocab_type=info.vocab_type,
    )
    aliases = list(dict.fromkeys((runtime.model_id, *runtime.aliases)))  # llama-server's: every --alias name
    return wire.ModelList(
        models=[
            wire.ListedModel(
                name=name, model=name, capabilities=llama_server_capabilities(runtime.capabilities)
            )
            for name in runtime.model_names
        ],
        data=[
            wire.Model(
                id=name,
                aliases=aliases,
                tags=list(runtime.tags),
                created=runtime.created,
                owned_by=ALIAS,
                context_length=info.n_ctx,
                max_model_len=info.n_ctx,
                meta=meta,
                architecture=wire.Architecture(
                    input_modalities=["text", "image"] if runtime.engine.vision is not None else ["text"]
                ),
            )
            for name in runtime.model_names
        ],
    )


@blueprint.get("/v1/models")
@blueprint.get("/models")
async def models() -> Response:
    """The served model, under its id and the alias ``bubo``."""
    return json_response(model_list(require_runtime()))
