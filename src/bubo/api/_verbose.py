"""llama-server's ``__verbose`` (``--verbose``): what the model read and what it wrote, for debugging.

An answer of the OpenAI completion and chat routes carries it when the server
runs with ``--verbose`` and the request reached a loopback address (ASGI's
``server`` address, as ``--debug-hooks`` checks it): the prompt as rendered
(chat template applied, special tokens as text), the model's raw output before
the reasoning and tool-call parsers, and the token counts of both.
"""

from __future__ import annotations

from typing import Any

from quart import request

from bubo.domain.addresses import is_loopback
from bubo.domain.output import Done

from ._context import api_context

__all__ = ["VERBOSE_KEY", "verbose_fields", "verbose_wanted"]

VERBOSE_KEY = "__verbose"


def verbose_wanted() -> bool:
    """Whether this request's answer carries ``__verbose``: ``--verbose``, on a loopback address."""
    if not api_context().verbose:
        return False
    server = request.scope.get("server")
    host = server[0] if server else ""
    return is_loopback(host)


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
