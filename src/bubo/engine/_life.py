"""Whether the engine serves: one state, its transitions in one place, and what a refused request is told.

An engine serves until one of three things ends that: shutdown's deadline
interrupts it (every generation, running or waiting, ends with the error the
server gives, and later ones are refused with it), :meth:`EngineLife.close`
(the engine was unloaded), or a fatal failure loses it (the device or the
context is unusable, or its thread is stuck in llama.cpp).  Lost is final:
nothing moves an engine out of it.  Sleeping while idle is not here: a sleeping
engine still serves, a request wakes it (:mod:`._sleep`).

Everything here runs on the trio thread.
"""

from __future__ import annotations

import copy
import enum
import logging
from collections.abc import Iterator
from contextlib import contextmanager

import trio

from bubo.errors import BuboError

from .errors import EngineError, EngineFailure, Lost, Unexpected, Unloaded

__all__ = ["EngineLife", "Life"]

logger = logging.getLogger(__name__)


class Life(enum.Enum):
    """Where the engine is in its life."""

    SERVING = "serving"
    INTERRUPTED = "interrupted"  # shutdown's deadline passed: generations end with the interruption's error
    CLOSED = "closed"  # unloaded: later requests are refused
    LOST = "lost"  # a fatal failure: the engine serves nothing more


class EngineLife:
    """The engine's :class:`Life`, and the cancel scopes of the requests an end of it ends."""

    def __init__(self) -> None:
        self.state = Life.SERVING
        self._ending: Exception | None = None  # what every generation ends with (interrupt, stuck thread)
        self._lost = trio.Event()
        self._retired = trio.Event()  # closed or lost
        self._interruptible: set[trio.CancelScope] = set()  # slot waits and the running producers

    @property
    def lost(self) -> bool:
        """Whether a fatal failure left the engine unusable."""
        return self.state is Life.LOST

    @property
    def retired(self) -> bool:
        """Whether the engine is closed or lost."""
        return self.state in (Life.CLOSED, Life.LOST)

    async def wait_lost(self) -> None:
        """Return once the engine is lost."""
        await self._lost.wait()

    async def wait_retired(self) -> None:
        """Return once the engine is closed or lost."""
        await self._retired.wait()

    # ---- the transitions ------------------------------------------------------------------------

    def interrupt(self, error: Exception) -> None:
        """End every generation with *error*: running ones as their last event, waiting ones as they wait.

        Later generations are refused with it too (shutdown: the deadline for
        running requests has passed).
        """
        if self.state is Life.SERVING:
            self.state = Life.INTERRUPTED
        self._ending = error
        for scope in self._interruptible:
            scope.cancel()

    def close(self) -> None:
        """The engine is being unloaded: later requests are refused (a lost engine stays lost)."""
        if self.state is not Life.LOST:
            self.state = Life.CLOSED
        self._retired.set()

    def lose(self, reason: str) -> None:
        """A fatal failure: the engine serves nothing more."""
        if self.state is not Life.LOST:
            logger.critical("the engine failed and is lost: %s", reason)
        self.state = Life.LOST
        self._lost.set()
        self._retired.set()

    def lose_to_a_stuck_thread(self, reason: str) -> None:
        """The engine's thread is stuck in a native call: lose the engine and end every request on it.

        Nothing that thread holds will be handed back, so the generations running
        on it and the requests waiting for a slot end now with ``device_lost``
        rather than when their clients give up.
        """
        self.lose(reason)
        self.interrupt(Lost(f"the engine is lost: {reason}"))

    # ---- what requests are told -----------------------------------------------------------------

    def check_usable(self) -> None:
        """Raise what a request that starts now is refused with, unless the engine serves."""
        if self.state is Life.LOST:
            raise Lost("the engine failed and cannot serve requests")
        if self._ending is not None:
            raise self.ending()
        if self.state is Life.CLOSED:
            raise Unloaded("the model was unloaded")

    def ending(self) -> Exception:
        """What a generation an end of life cancelled ends with (one copy per request: its own traceback)."""
        assert self._ending is not None  # only an interruption cancels the scopes
        return copy.copy(self._ending)

    @property
    def ended(self) -> bool:
        """Whether generations are being ended (an interruption, or a stuck thread)."""
        return self._ending is not None

    @contextmanager
    def interruptible(self) -> Iterator[trio.CancelScope]:
        """A cancel scope an interruption cancels (at once, if one came before)."""
        with trio.CancelScope() as scope:
            self._interruptible.add(scope)
            if self._ending is not None:
                scope.cancel()
            try:
                yield scope
            finally:
                self._interruptible.discard(scope)

    def failure(self, error: Exception) -> Exception:
        """What the consumer is told of a generation's failure; only a fatal engine error loses the engine.

        A bug (any other exception) fails its own request: engines reset what
        the failed generation left in their state before it gets here.
        """
        if isinstance(error, EngineFailure) and error.fatal:
            self.lose(error.message)
            return Lost("the engine failed while generating and cannot serve requests")
        if isinstance(error, EngineError | BuboError):
            logger.error("generation failed: %s", error.message)
            return error
        logger.error("generation failed unexpectedly", exc_info=error)
        return Unexpected("the engine failed on this request")
