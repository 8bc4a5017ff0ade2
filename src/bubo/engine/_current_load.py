"""The load the llama.cpp engine serves from: made at start, closed and forgotten to sleep, made to wake.

:class:`CurrentLoad` holds the engine's :class:`~._loaded.LoadedModel` (None
while the model sleeps), what outlives it (:class:`~._lasting.Lasting`), the
ports the service holds over it (:mod:`._ports`) and the slots' mirrors of
its sequences.  Falling asleep detaches the load (the ports refuse work, the
mirrors empty), then closes it; waking loads again and attaches the new one.
It also holds the one trio token the decode loop reports its failure to,
taken from the first trio task that crosses to the loop.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import trio

from ._crossing import post_to_trio
from ._lasting import Lasting
from ._loaded import LoadedModel, load
from ._ports import EmbedderPort, VisionPort
from .errors import EngineFailure
from .slots import EMPTY_MIRROR, Slot

if TYPE_CHECKING:
    from .llama import LlamaOptions

__all__ = ["CurrentLoad"]

logger = logging.getLogger(__name__)


class CurrentLoad:
    """The engine's current load, what outlives it, and what is attached to it (sleep and wake are here)."""

    def __init__(
        self,
        options: LlamaOptions,
        *,
        lose: Callable[[str], None],
        on_progress: Callable[[float], None] | None = None,
    ) -> None:
        """Load the first time (blocking); *lose* loses the engine (on the trio thread).

        Raises:
            EngineFailure: llama.cpp could not load the model or a part (what was made is freed).

        """
        self._options = options
        self._lose = lose
        self._trio_token: trio.lowlevel.TrioToken | None = None
        self.lasting = Lasting(options)
        try:
            loaded = load(options, self.lasting, on_lost=self._loop_lost, on_progress=on_progress)
        except BaseException:
            self.lasting.close()
            raise
        self.loaded: LoadedModel | None = loaded
        self.embedder = None if loaded.embedder is None else EmbedderPort(loaded.embedder)
        self.vision = None if loaded.vision is None else VisionPort(loaded.vision)
        self._slots: Sequence[Slot] = ()

    def serve(self, slots: Sequence[Slot]) -> None:
        """Let *slots* (one per sequence) mirror the current load's sequences, and every later load's."""
        self._slots = slots
        if self.loaded is not None:
            self._attach(self.loaded)

    @property
    def current(self) -> LoadedModel:
        """The current load.

        Raises:
            EngineFailure: the model sleeps (callers hold the engine awake, so only a bug gets here).

        """
        loaded = self.loaded
        if loaded is None:
            raise EngineFailure("the model sleeps")
        return loaded

    def for_trio(self) -> LoadedModel:
        """The current load, for a trio task about to cross to its decode thread.

        The first such task names the trio run that hears of the loop's failure:
        the token is taken once (a server has one run; requests' own events go
        to their own run's token, which each crossing takes).
        """
        if self._trio_token is None:
            self._trio_token = trio.lowlevel.current_trio_token()
        return self.current

    def fall_asleep(self, timeout_s: float) -> None:
        """Stop the decode thread (within *timeout_s*, its courier's stop aside), then free everything.

        Raises:
            EngineFailure: the decode thread did not stop (stuck in llama.cpp: nothing is freed).

        """
        loaded = self._detach()
        if loaded is not None and not loaded.close(timeout_s):
            self.loaded = loaded  # the stuck thread's: close() tries again, leaves it if still stuck
            raise EngineFailure(f"the decode thread did not stop within {timeout_s:g} s")

    def wake_up(self) -> None:
        """Load again, as at the start (the prompt cache's host RAM starts empty; the disk tier stays).

        Raises:
            EngineFailure: llama.cpp could not load the model or a part (what was made is freed).

        """
        self._attach(load(self._options, self.lasting, on_lost=self._loop_lost))

    def close(self, timeout_s: float) -> None:
        """Free the load (unless its thread is stuck past *timeout_s*), then stop the disk tier's writer.

        A thread stuck in llama.cpp keeps the load allocated (freeing it under
        the thread would crash the process), for the process's exit to free.
        """
        loaded = self.loaded
        if loaded is not None and loaded.close(timeout_s):
            self._detach()
        elif loaded is not None:
            logger.critical(
                "the decode thread did not stop within %g s; the model stays in memory until exit", timeout_s
            )
        self.lasting.close()  # the writer drains what is queued, the live sequences' files among it

    def _attach(self, loaded: LoadedModel) -> None:
        for slot, cache in zip(self._slots, loaded.context.caches, strict=True):
            slot.mirror = cache
        if self.embedder is not None:
            self.embedder.attach(loaded.embedder)
        if self.vision is not None:
            self.vision.attach(loaded.vision)
        self.loaded = loaded

    def _detach(self) -> LoadedModel | None:
        loaded, self.loaded = self.loaded, None
        if self.embedder is not None:
            self.embedder.attach(None)
        if self.vision is not None:
            self.vision.attach(None)
        for slot in self._slots:
            slot.mirror = EMPTY_MIRROR
        return loaded

    def _loop_lost(self, failure: EngineFailure) -> None:
        """The decode loop can serve nothing more (on the decode thread): the engine is lost."""
        if self._trio_token is not None:
            post_to_trio(self._trio_token, self._lose, failure.message)
