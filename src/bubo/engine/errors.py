"""What the engine fails with: an error that names its cause, and nothing of HTTP.

Every error the engine raises or hands to a generation's consumer is an
:class:`EngineError` whose :attr:`~EngineError.cause` says why (the slot is
busy, the context is full, the engine is lost, the model is waking, …).  The
engine decides no status, no ``Retry-After``: a cause becomes a response once,
at the edge (``api/_errors.py``'s ``ENGINE_CAUSES``), in every dialect's
envelope.  A cause's value is the error's stable machine-readable ``code``.

Bad input the engine finds in a request (an image that is no image, a LoRA id
that names no adapter) is the request's fault and stays a
:class:`bubo.errors.InvalidRequest` naming the field in ``param``.
"""

from __future__ import annotations

import enum
from typing import ClassVar

__all__ = [
    "Cause",
    "ContextFull",
    "EngineError",
    "EngineFailure",
    "GrammarRejected",
    "Lost",
    "SlotBusy",
    "SlotFileNoRoom",
    "StreamNotRead",
    "Unexpected",
    "Unloaded",
    "Waking",
]


class Cause(enum.Enum):
    """Why the engine could not do what it was asked; the value is the error's ``code``."""

    FAILED = "engine_error"  # llama.cpp (or the engine) failed on this request
    UNEXPECTED = "internal_error"  # a bug failed this request; the details are only logged
    LOST = "device_lost"  # a fatal failure: the engine serves nothing more
    CONTEXT_FULL = "context_full"  # the KV cache the slots share has no room now; retrying can help
    SLOT_BUSY = "slot_busy"  # a slot action on a slot a request holds
    WAKING = "model_waking"  # the model is still being loaded again after sleeping
    UNLOADED = "not_ready"  # the model was unloaded, or could not be loaded again
    STREAM_NOT_READ = "stream_not_read"  # the client left its stream unread past the bound
    GRAMMAR_UNSUPPORTED = "unsupported_schema"  # llama.cpp cannot convert or parse the grammar
    GRAMMAR_TOO_COMPLEX = "schema_too_complex"  # the grammar passes the engine's size or nesting bound


class EngineError(Exception):
    """An engine error: a :attr:`cause` and a message for the client."""

    default_cause: ClassVar[Cause] = Cause.FAILED

    def __init__(self, message: str, *, cause: Cause | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.cause = cause or self.default_cause

    @property
    def code(self) -> str:
        """The stable machine-readable code (the cause's value)."""
        return self.cause.value


class EngineFailure(EngineError):
    """The engine could not run a generation (llama.cpp returned an error).

    ``fatal``: the context is unusable (a compute failure, a lost device); the
    engine serves nothing more and the server reports ``device_lost``.
    """

    def __init__(self, message: str, *, fatal: bool = False, cause: Cause | None = None) -> None:
        super().__init__(message, cause=cause)
        self.fatal = fatal


class ContextFull(EngineFailure):
    """The KV cache the slots share has no room: for a batch (llama.cpp's), or for a request now."""

    default_cause = Cause.CONTEXT_FULL


class SlotFileNoRoom(EngineError):
    """A slot file needs more of the context the slots share than the others leave now (retry later)."""

    default_cause = Cause.CONTEXT_FULL


class SlotBusy(EngineError):
    """A slot action on a slot a request holds (llama-server answers it as a busy server)."""

    default_cause = Cause.SLOT_BUSY


class Lost(EngineError):
    """The engine failed in a way that left its context unusable; it serves nothing more."""

    default_cause = Cause.LOST


class Unloaded(EngineError):
    """The model was unloaded (the engine closed), or could not be loaded again after sleeping."""

    default_cause = Cause.UNLOADED


class Waking(EngineError):
    """The model is still being loaded again after sleeping, past the wait's bound (retry later)."""

    default_cause = Cause.WAKING


class Unexpected(EngineError):
    """A bug failed this request; the message is generic, the details are only logged."""

    default_cause = Cause.UNEXPECTED


class StreamNotRead(EngineError):
    """The client left its stream unread past the bound: the server will not hold more for it."""

    default_cause = Cause.STREAM_NOT_READ


class GrammarRejected(EngineError):
    """A grammar (or a JSON schema in it) that llama.cpp cannot convert or parse, or too large to try."""

    default_cause = Cause.GRAMMAR_UNSUPPORTED
