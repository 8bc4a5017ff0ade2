"""Ollama's error shape: ``{"error": "..."}`` with the status of the error."""

from __future__ import annotations

from quart import Response

from bubo.api._json import json_response
from bubo.errors import BuboError

from . import wire

__all__ = ["render_error"]


def render_error(error: BuboError) -> Response:
    """The HTTP response for *error* on an Ollama route (its headers, ``Retry-After`` among them, kept)."""
    return json_response(
        wire.ErrorBody(error=error.message), status=error.status, headers=dict(error.headers)
    )
