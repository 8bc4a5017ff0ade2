"""Debug hooks: ``POST /debug/prompt``, ``GET /debug/cache``, ``GET /debug/settings``.

They show what Bubo does with a request: the prompt text and token ids it
evaluates, what the prompt cache holds, the effective settings (the API key
redacted).  They exist only when the server runs with ``--debug-hooks`` *and*
the request reached a loopback address; in every other case they are 404
``not_found``, exactly like a path that does not exist.
"""

from __future__ import annotations

from typing import Any

import attrs
from quart import Blueprint, Response, request

from bubo.domain.addresses import is_loopback
from bubo.domain.requests import ChatRequest
from bubo.errors import NotFound
from bubo.service.chat import prompt_chars, render_chat_request
from bubo.service.work import PREPARE_BYTES_PER_CHAR

from ._chat import translate as chat_translate
from ._chat import wire as chat_wire
from ._context import api_context, read_body, require_runtime
from ._images import shown_without_images
from ._json import json_response

__all__ = ["REQUEST_BODIES", "blueprint"]

blueprint = Blueprint("debug", __name__)
REQUEST_BODIES = (chat_wire.ChatCompletionRequest,)
"""What its routes structure request bodies as (``bubo.server.REQUEST_CONVERTER`` builds them at import)."""


@blueprint.before_request
async def _only_when_enabled_on_loopback() -> None:
    server = request.scope.get("server")
    host = server[0] if server else ""
    if not api_context().debug_hooks or not is_loopback(host):
        raise NotFound(f"no such endpoint: {request.method} {request.path}")


@blueprint.post("/debug/prompt")
async def prompt() -> Response:
    """A chat-completions body rendered and tokenized exactly as generation would, with each token's text.

    Images are not read: each shows as llama.cpp's ``<__media__>`` marker, tokenized as text
    (:func:`~bubo.api._images.shown_without_images`).
    """
    runtime = require_runtime()

    def translated(body: chat_wire.ChatCompletionRequest) -> ChatRequest:
        chat = chat_translate.chat_request(body, takes_images=runtime.engine.vision is not None)
        return attrs.evolve(chat, prompt=shown_without_images(chat.prompt))

    _, chat = await read_body(runtime, chat_wire.ChatCompletionRequest, translated)
    tokenizer = runtime.tokenizer

    def render() -> dict[str, Any]:
        rendered = render_chat_request(runtime, chat)
        return {
            "prompt": rendered.text,
            "n_tokens": len(rendered.tokens),
            "tokens": list(rendered.tokens),
            "pieces": [tokenizer.token_bytes(t).decode("utf-8", errors="replace") for t in rendered.tokens],
            "template_origin": runtime.template.origin,
        }

    need_bytes = prompt_chars(chat.prompt) * PREPARE_BYTES_PER_CHAR
    return json_response(await runtime.workers.run(render, need_bytes=need_bytes))


@blueprint.get("/debug/cache")
async def cache() -> Response:
    """The slot's live tokens and the host-RAM snapshots of the prompt cache."""
    contents = require_runtime().engine.cache_contents()
    return json_response(
        {
            "live_tokens": contents.live_tokens,
            "budget_bytes": contents.budget_bytes,
            "used_bytes": sum(s.size_bytes for s in contents.snapshots),
            "snapshots": [
                {"n_tokens": s.n_tokens, "size_bytes": s.size_bytes, "conversation": s.conversation}
                for s in contents.snapshots
            ],
        }
    )


@blueprint.get("/debug/settings")
async def settings() -> Response:
    """The effective settings, as the server resolved flags and variables (the API key redacted)."""
    return json_response(api_context().effective_settings)
