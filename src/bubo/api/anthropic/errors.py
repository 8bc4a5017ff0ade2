"""Anthropic's error envelope, with Bubo's stable code and a request id.

``{"type": "error", "error": {"type", "message", "code"}, "request_id"}``;
the ``type`` names are Anthropic's, chosen by HTTP status.  A context overflow
reads ``prompt is too long: N tokens > M maximum``, the words Claude Code and
other agents match to compact their history.
"""

from __future__ import annotations

from quart import Response

from bubo.api._json import json_response
from bubo.errors import BuboError, ContextOverflow

from . import wire

__all__ = ["error_envelope", "render_error"]

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}


def error_envelope(error: BuboError, request_id: str) -> wire.ErrorEnvelope:
    """The Anthropic envelope for *error*; a context overflow in the words agents compact on."""
    message = error.message
    if isinstance(error, ContextOverflow):
        message = f"prompt is too long: {error.n_prompt_tokens} tokens > {error.n_ctx} maximum"
    return wire.ErrorEnvelope(
        error=wire.ErrorDetail(type=_TYPES.get(error.status, "api_error"), message=message, code=error.code),
        request_id=request_id,
    )


def render_error(error: BuboError, request_id: str) -> Response:
    """The HTTP response for *error* on an Anthropic route."""
    return json_response(error_envelope(error, request_id), status=error.status, headers=dict(error.headers))
