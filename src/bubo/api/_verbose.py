"""llama-server's ``__verbose`` (``--verbose``): what the model read and what it wrote, for debugging.

An answer of the OpenAI completion and chat routes carries it when the server
runs with ``--verbose`` and the request reached a loopback address (ASGI's
``server`` address, as ``--debug-hooks`` checks it): the prompt the model read,
its tokens read back as llama-server shows them (the chat template applied,
special tokens as text, the BOS the tokenizer adds in front), the model's raw
output before the reasoning and tool-call parsers, and the token counts of both.
"""

from __future__ import annotations

from typing import Any

from quart import request

from bubo.domain.addresses import is_loopback
from bubo.domain.output import Done
from bubo.service.prompt import RenderedPrompt
from bubo.service.runtime import Runtime
from bubo.service.work import PREPARE_BYTES_PER_CHAR

from ._context import api_context

__all__ = ["VERBOSE_KEY", "verbose_fields", "verbose_prompt", "verbose_wanted"]

VERBOSE_KEY = "__verbose"


def verbose_wanted() -> bool:
    """Whether this request's answer carries ``__verbose``: ``--verbose``, on a loopback address."""
    if not api_context().verbose:
        return False
    server = request.scope.get("server")
    host = server[0] if server else ""
    return is_loopback(host)


async def verbose_prompt(runtime: Runtime, prompt: RenderedPrompt) -> str | None:
    """The prompt ``__verbose`` shows, or None when this answer carries none (:func:`verbose_wanted`).

    Its tokens read back, in a worker (a long prompt takes a while); a prompt with images
    is shown as its text, each image's marker where it went.
    """
    if not verbose_wanted():
        return None
    if prompt.images:
        return prompt.text
    tokenizer = runtime.tokenizer
    per_token = tokenizer.max_token_bytes or 16
    need = len(prompt.tokens) * per_token * PREPARE_BYTES_PER_CHAR
    return await runtime.workers.run(lambda: tokenizer.decode(prompt.tokens), need_bytes=need)


def verbose_fields(prompt: str, done: Done) -> dict[str, Any]:
    """``{"__verbose": …}`` for a generation that read *prompt* and ended with *done*."""
    return {
        VERBOSE_KEY: {
            "prompt": prompt,
            "content": done.raw_text,
            "tokens_evaluated": done.stats.prompt_tokens,
            "tokens_predicted": done.stats.completion_tokens,
        }
    }
