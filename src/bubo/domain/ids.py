"""Identifiers for responses, messages and tool calls.

Random, never derived from the clock (two requests in the same second must not
share an id).  Tool call ids follow the reference: ``call_`` + 20 lowercase
alphanumerics.
"""

from __future__ import annotations

import secrets
import string
import uuid

__all__ = ["new_id", "new_tool_call_id"]

_ALPHABET = string.ascii_lowercase + string.digits


def new_id(prefix: str) -> str:
    """``prefix`` + 32 hex digits, e.g. ``chatcmpl-…``, ``msg_…``, ``resp_…``."""
    return prefix + uuid.uuid4().hex


def new_tool_call_id(prefix: str = "call_") -> str:
    """``prefix`` + 20 random lowercase letters and digits."""
    return prefix + "".join(secrets.choice(_ALPHABET) for _ in range(20))
