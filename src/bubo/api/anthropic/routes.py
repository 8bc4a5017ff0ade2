"""Anthropic routes: ``POST /v1/messages`` and ``POST /v1/messages/count_tokens``.

The ``anthropic-version``/``anthropic-beta`` headers and a ``?beta=true`` query
are accepted and need nothing: Bubo serves one version of the API.
"""

from __future__ import annotations

import trio
from quart import Blueprint, Response

from bubo.api._context import json_body, request_id, require_runtime
from bubo.api._converter import make_converter, structure
from bubo.api._json import json_response
from bubo.api._sse import sse_response
from bubo.domain.ids import new_id
from bubo.errors import InvalidRequest
from bubo.service.chat import prepare_chat, render_chat_request
from bubo.service.generation import collect, open_output

from . import translate, wire
from .stream import MessageStream

__all__ = ["PATH_PREFIX", "blueprint"]

PATH_PREFIX = "/v1/messages"
"""Errors on paths under this prefix use the Anthropic envelope."""

blueprint = Blueprint("anthropic", __name__)
_converter = make_converter()


@blueprint.post("/v1/messages")
async def messages() -> Response:
    """Messages, streaming or not."""
    runtime = require_runtime()
    body = structure(_converter, await json_body(), wire.MessagesRequest)
    runtime.check_model(body.model)
    prepared = await prepare_chat(runtime, translate.messages_request(body))
    message_id = new_id("msg_")
    model = body.model or runtime.model_id
    if body.stream:
        encoder = MessageStream(
            message_id=message_id,
            model=model,
            prompt_tokens=len(prepared.prompt.tokens),
            request_id=request_id(),
        )
        return sse_response(open_output(runtime, prepared), encoder)
    async with open_output(runtime, prepared) as output:
        completion = await collect(output)
    return json_response(translate.message(completion, message_id=message_id, model=model))


@blueprint.post("/v1/messages/count_tokens")
async def count_tokens() -> Response:
    """The prompt's token count as generation would see it; no generation, no context limit."""
    runtime = require_runtime()
    body = structure(_converter, await json_body(), wire.CountTokensRequest)
    runtime.check_model(body.model)
    if body.stream:
        raise InvalidRequest("count_tokens does not stream; drop stream: true", param="stream")
    rendered = await trio.to_thread.run_sync(render_chat_request, runtime, translate.count_request(body))
    return json_response(wire.TokenCount(input_tokens=len(rendered.tokens)))
