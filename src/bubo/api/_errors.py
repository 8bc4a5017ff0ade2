"""The error envelope every route uses except Anthropic's: the reference's shape.

``{"error": {"message", "type", "param", "code"}}``, the status from the
exception, its headers (``WWW-Authenticate``, ``Retry-After``) added.  A
context overflow says so in OpenAI's words (``This model's maximum context
length is M tokens. However, your messages resulted in N tokens.``, which
agents match to compact their history) with ``n_prompt_tokens`` and ``n_ctx``;
on llama-server's own routes its type is llama-server's
``exceed_context_size_error``.

The engine's errors name a cause and nothing of HTTP (``engine/errors.py``);
:data:`ENGINE_CAUSES` is where a cause becomes a status and its headers, once,
for every dialect's envelope (:func:`known_error`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs
from quart import Response

from bubo.engine import Cause, EngineError
from bubo.errors import (
    BuboError,
    ContextOverflow,
    DeviceLost,
    InternalError,
    InvalidRequest,
    ServiceUnavailable,
)

from ._json import json_response

__all__ = [
    "ENGINE_CAUSES",
    "LLAMA_OVERFLOW_TYPE",
    "ErrorBody",
    "ErrorEnvelope",
    "engine_error",
    "error_envelope",
    "known_error",
    "overflow_message",
    "render_error",
]


@attrs.frozen(kw_only=True)
class ErrorBody:
    """The inner object; ``n_prompt_tokens``/``n_ctx`` only for context overflows (llama-server)."""

    message: str
    type: str
    param: str | None
    code: str
    n_prompt_tokens: int | None = None
    n_ctx: int | None = None


@attrs.frozen(kw_only=True)
class ErrorEnvelope:
    """``{"error": {...}}``."""

    error: ErrorBody


LLAMA_OVERFLOW_TYPE = "exceed_context_size_error"

ENGINE_CAUSES: Mapping[Cause, tuple[type[BuboError], Mapping[str, str]]] = {
    Cause.FAILED: (InternalError, {}),  # 500 engine_error
    Cause.UNEXPECTED: (InternalError, {}),  # 500 internal_error
    Cause.LOST: (DeviceLost, {}),  # 503 device_lost: /health and /ready say so too
    Cause.CONTEXT_FULL: (ServiceUnavailable, {"Retry-After": "1"}),  # 503: room comes as others finish
    Cause.SLOT_BUSY: (ServiceUnavailable, {}),  # 503, as llama-server answers
    Cause.WAKING: (ServiceUnavailable, {"Retry-After": "5"}),  # 503: the model is loading again
    Cause.UNLOADED: (ServiceUnavailable, {}),  # 503 not_ready
    Cause.STREAM_NOT_READ: (ServiceUnavailable, {}),  # 503: the server holds no more for that client
    Cause.GRAMMAR_UNSUPPORTED: (InvalidRequest, {}),  # 400 (the service names the field first)
    Cause.GRAMMAR_TOO_COMPLEX: (InvalidRequest, {}),
}
"""What each engine error's cause is on the wire: the error class (status and type) and the headers."""


def engine_error(error: EngineError) -> BuboError:
    """*error* as the response its cause makes (:data:`ENGINE_CAUSES`); its code is the cause's."""
    kind, headers = ENGINE_CAUSES[error.cause]
    rendered = kind(error.message, code=error.code, headers=headers)
    rendered.__cause__ = error
    return rendered


def known_error(error: BaseException) -> BuboError | None:
    """*error* as the response it makes, if it is one Bubo raises on purpose (None: a bug)."""
    if isinstance(error, BuboError):
        return error
    if isinstance(error, EngineError):
        return engine_error(error)
    return None


def error_envelope(error: BuboError, *, llama_server: bool = False) -> ErrorEnvelope:
    """The envelope for *error* (*llama_server*: on one of llama-server's own routes)."""
    extra: dict[str, Any] = {}
    message, kind = error.message, error.type
    if isinstance(error, ContextOverflow):
        extra = {"n_prompt_tokens": error.n_prompt_tokens, "n_ctx": error.n_ctx}
        message = overflow_message(error)
        kind = LLAMA_OVERFLOW_TYPE if llama_server else kind
    return ErrorEnvelope(
        error=ErrorBody(message=message, type=kind, param=error.param, code=error.code, **extra)
    )


def overflow_message(error: ContextOverflow) -> str:
    """OpenAI's wording of a context overflow, and what to do about it.

    A prompt counted only until it passed the context has at least the tokens
    named; the sentence agents parse keeps its shape, a note says so.
    """
    counted = " It was counted only that far: it has at least that many." if error.at_least else ""
    return (
        f"This model's maximum context length is {error.n_ctx} tokens. However, your messages resulted in "
        f"{error.n_prompt_tokens} tokens.{counted} Please reduce the length of the messages, or start the "
        "server with a larger --ctx-size."
    )


def render_error(error: BuboError, *, llama_server: bool = False) -> Response:
    """The HTTP response for *error*."""
    return json_response(
        error_envelope(error, llama_server=llama_server), status=error.status, headers=dict(error.headers)
    )
