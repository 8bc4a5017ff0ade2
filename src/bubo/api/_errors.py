"""The error envelope every route uses except Anthropic's: the reference's shape.

``{"error": {"message", "type", "param", "code"}}``, the status from the
exception, its headers (``WWW-Authenticate``, ``Retry-After``) added.
"""

from __future__ import annotations

from typing import Any

import attrs
from quart import Response

from bubo.errors import BuboError, ContextOverflow

from ._json import json_response

__all__ = ["ErrorBody", "ErrorEnvelope", "error_envelope", "render_error"]


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


def error_envelope(error: BuboError) -> ErrorEnvelope:
    """The envelope for *error*."""
    extra: dict[str, Any] = {}
    if isinstance(error, ContextOverflow):
        extra = {"n_prompt_tokens": error.n_prompt_tokens, "n_ctx": error.n_ctx}
    return ErrorEnvelope(
        error=ErrorBody(message=error.message, type=error.type, param=error.param, code=error.code, **extra)
    )


def render_error(error: BuboError) -> Response:
    """The HTTP response for *error*."""
    return json_response(error_envelope(error), status=error.status, headers=dict(error.headers))
