"""Dialect-neutral exceptions.

Service and engine code raise these; each API dialect renders them once, at its
edge, in its own envelope (``api/_errors.py`` for every dialect but Anthropic's,
``api/anthropic/errors.py``).
Nothing below the API layer builds an HTTP body.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

__all__ = [
    "AuthenticationFailed",
    "BrowserRefused",
    "BuboError",
    "ContextOverflow",
    "DeviceLost",
    "InsufficientMemory",
    "InsufficientMemoryPermanent",
    "InternalError",
    "InvalidRequest",
    "MemoryPressure",
    "MethodNotAllowed",
    "NotFound",
    "NotImplementedOnThisModel",
    "OutputSchemaMismatch",
    "PayloadTooLarge",
    "QueueFull",
    "ServiceUnavailable",
    "UnsupportedContent",
]


class BuboError(Exception):
    """An error with a stable machine-readable ``code`` and an HTTP status.

    ``type`` is the OpenAI error type name; dialects with their own names map
    from ``status`` (see ``api/anthropic/errors.py``).  ``param`` is the JSON path
    of the offending request field, without the leading ``$.``.
    """

    status: int = 500
    type: ClassVar[str] = "server_error"
    default_code: ClassVar[str] = "internal_error"

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        param: str | None = None,
        headers: Mapping[str, str] | None = None,
        status: int | None = None,
    ) -> None:
        super().__init__(message)
        if status is not None:
            self.status = status
        self.message = message
        self.code = code or self.default_code
        self.param = param
        self.headers: Mapping[str, str] = dict(headers or {})


class InvalidRequest(BuboError):
    """The request is malformed or asks for something this server cannot do (400)."""

    status = 400
    type = "invalid_request_error"
    default_code = "invalid_request"


class UnsupportedContent(InvalidRequest):
    """Image, audio or file content sent to a text-only model (400)."""

    default_code = "unsupported_content"

    def __init__(self, kind: str, *, param: str) -> None:
        super().__init__(f"this model takes text only; {kind} content is not supported", param=param)


class ContextOverflow(InvalidRequest):
    """The prompt does not fit in the context window; counted before decoding (400)."""

    default_code = "context_length_exceeded"

    def __init__(
        self, *, n_prompt_tokens: int, n_ctx: int, param: str | None = None, at_least: bool = False
    ) -> None:
        """*at_least*: the prompt was not counted to its end, it has *n_prompt_tokens* or more."""
        super().__init__(
            f"the prompt has {'at least ' if at_least else ''}{n_prompt_tokens} tokens but the context "
            f"holds {n_ctx}: shorten the prompt or start the server with a larger --ctx-size",
            param=param,
        )
        self.n_prompt_tokens = n_prompt_tokens
        self.n_ctx = n_ctx
        self.at_least = at_least


class AuthenticationFailed(BuboError):
    """The API key is missing or wrong (401)."""

    status = 401
    type = "authentication_error"
    default_code = "invalid_api_key"

    def __init__(self, message: str = "invalid or missing API key") -> None:
        super().__init__(message, headers={"WWW-Authenticate": "Bearer"})


class BrowserRefused(BuboError):
    """A request a web page must not make: from another origin, or to a name rebound to this machine (403).

    Raised at the edge before the body is read; the edge closes the connection
    instead of reading what the page sent (``bubo.server``, docs/security.md).
    """

    status = 403
    type = "permission_error"
    default_code = "forbidden"


class NotFound(BuboError):
    """The path, model or stored object does not exist (404)."""

    status = 404
    type = "invalid_request_error"
    default_code = "not_found"


class MethodNotAllowed(BuboError):
    """The path exists but not for this HTTP method (405)."""

    status = 405
    type = "invalid_request_error"
    default_code = "method_not_allowed"


class PayloadTooLarge(BuboError):
    """The request body exceeds the configured limit (413)."""

    status = 413
    type = "invalid_request_error"
    default_code = "payload_too_large"


class InternalError(BuboError):
    """An unexpected failure; the message is generic, the details are only logged (500)."""

    status = 500
    type = "server_error"
    default_code = "internal_error"


class OutputSchemaMismatch(BuboError):
    """The model ended an answer that does not match the request's JSON schema (500).

    The model's failure, not the client's: ``param`` is the schema keyword it broke
    (``response_format.json_schema.schema.properties.tags.uniqueItems``); the message says where in
    the output.
    """

    status = 500
    type = "server_error"
    default_code = "output_schema_mismatch"


class NotImplementedOnThisModel(BuboError):
    """An endpoint this server knows but does not serve for a text model (501)."""

    status = 501
    type = "server_error"
    default_code = "not_implemented"


class ServiceUnavailable(BuboError):
    """The server cannot take the request now: loading, overloaded or short of memory (503)."""

    status = 503
    type = "server_error"
    default_code = "not_ready"


class DeviceLost(ServiceUnavailable):
    """The engine failed in a way that left its context unusable (503 ``device_lost``)."""

    default_code = "device_lost"


class InsufficientMemory(ServiceUnavailable):
    """Not enough memory for the request now; retry after memory is freed (503, ``Retry-After: 5``)."""

    default_code = "insufficient_memory"

    def __init__(self, message: str) -> None:
        super().__init__(message, headers={"Retry-After": "5"})


class MemoryPressure(InsufficientMemory):
    """Available memory is below the low-water mark; no generation is admitted (503, ``Retry-After: 5``)."""

    default_code = "memory_pressure"


class QueueFull(ServiceUnavailable):
    """Too many requests already wait for the slot (503 with ``Retry-After``)."""

    default_code = "queue_full"

    def __init__(self, message: str, *, retry_after_s: int) -> None:
        super().__init__(message, headers={"Retry-After": str(retry_after_s)})


class InsufficientMemoryPermanent(BuboError):
    """The request needs more memory than the machine could ever give (507)."""

    status = 507
    type = "server_error"
    default_code = "insufficient_memory_permanent"
