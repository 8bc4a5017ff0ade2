"""Anthropic routes: ``POST /v1/messages`` and ``POST /v1/messages/count_tokens``.

The ``anthropic-version``/``anthropic-beta`` headers and a ``?beta=true`` query
are accepted and need nothing: Bubo serves one version of the API.
"""

from __future__ import annotations

from quart import Blueprint, Response

from bubo.api._context import read_body, request_id, request_timeline, require_runtime
from bubo.api._json import json_response
from bubo.api._omitted import report_omitted
from bubo.api._sse import sse_response
from bubo.domain.ids import new_id
from bubo.domain.requests import ChatRequest
from bubo.errors import InvalidRequest
from bubo.service.chat import count_chat_request, prepare_chat, prompt_chars
from bubo.service.generation import collect, open_output
from bubo.service.work import PREPARE_BYTES_PER_CHAR

from . import translate, wire
from .stream import MessageStream

__all__ = ["PATH_PREFIX", "blueprint"]

PATH_PREFIX = "/v1/messages"
"""Errors on paths under this prefix use the Anthropic envelope."""

blueprint = Blueprint("anthropic", __name__)


@blueprint.post("/v1/messages")
async def messages() -> Response:
    """Messages, streaming or not."""
    runtime = require_runtime()

    def translated(body: wire.MessagesRequest) -> ChatRequest:
        runtime.check_model(body.model)
        return translate.messages_request(body, takes_images=runtime.engine.vision is not None)

    body, chat = await read_body(runtime, wire.MessagesRequest, translated)
    report_omitted(chat.omitted)
    prepared = await prepare_chat(runtime, chat)
    message_id = new_id("msg_")
    model = body.model or runtime.model_id
    if body.stream:
        encoder = MessageStream(
            message_id=message_id,
            model=model,
            prompt_tokens=len(prepared.prompt.tokens),
            request_id=request_id(),
        )
        return sse_response(open_output(runtime, prepared, request_timeline()), encoder)
    async with open_output(runtime, prepared, request_timeline()) as output:
        completion = await collect(output)
    return json_response(translate.message(completion, message_id=message_id, model=model))


@blueprint.post("/v1/messages/count_tokens")
async def count_tokens() -> Response:
    """The prompt's token count as generation would see it; no generation, no context limit."""
    runtime = require_runtime()

    def translated(body: wire.CountTokensRequest) -> ChatRequest:
        runtime.check_model(body.model)
        if body.stream:
            raise InvalidRequest("count_tokens does not stream; drop stream: true", param="stream")
        return translate.count_request(body)

    _, chat = await read_body(runtime, wire.CountTokensRequest, translated)
    report_omitted(chat.omitted)
    n_tokens = await runtime.workers.run(
        lambda: count_chat_request(runtime, chat),
        need_bytes=prompt_chars(chat.prompt) * PREPARE_BYTES_PER_CHAR,
    )
    return json_response(wire.TokenCount(input_tokens=n_tokens))
