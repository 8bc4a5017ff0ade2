"""Whether the model is loaded, and who needs it: the engine sleeps only while nobody does.

``--sleep-idle-seconds`` (and Ollama's ``keep_alive``) free the model while the
server is idle and load it again for the next request.  Everything that touches
the model holds the engine awake (:meth:`Wakefulness.held`): a request's
preparation, its generation, a slot action, an embedding.  :meth:`sleep` frees
the model only when nothing holds it; a request that finds it asleep (or
falling asleep) waits for the reload, at most ``wake_wait_s``, and is then
refused with 503 ``model_waking`` rather than waiting for good.

Freeing and loading block for seconds in llama.cpp, so each runs in a worker
thread under a trio system task: the transition finishes whatever happens to
the request that started it (a client that leaves does not leave the model half
loaded), and its event is set in a ``finally``, so every waiter wakes.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import trio

from .errors import Unloaded, Waking

__all__ = ["WAKE_WAIT_S", "WakeState", "Wakefulness"]

logger = logging.getLogger(__name__)

WAKE_WAIT_S = 300.0
"""How long a request waits for the model to be loaded again after sleeping, before a 503."""


class WakeState(enum.Enum):
    """Where the model is."""

    AWAKE = "awake"
    FALLING_ASLEEP = "falling_asleep"  # being freed
    ASLEEP = "asleep"  # freed
    WAKING = "waking"  # being loaded again


class Wakefulness:
    """The engine's sleep and wake-ups; used on the trio thread only."""

    def __init__(
        self,
        *,
        fall_asleep: Callable[[], None],
        wake_up: Callable[[], None],
        on_failure: Callable[[str], None],
        wake_wait_s: float = WAKE_WAIT_S,
    ) -> None:
        """*fall_asleep* and *wake_up* block (run in a worker thread); *on_failure* loses the engine."""
        self._fall_asleep = fall_asleep
        self._wake_up = wake_up
        self._on_failure = on_failure
        self.wake_wait_s = wake_wait_s
        self.state = WakeState.AWAKE
        self.holds = 0
        self.idle_since: float | None = None  # trio time the last hold ended; None: not since the start
        self.sleeps = 0  # times the model was freed
        self._transition: trio.Event | None = None  # set when the change in progress is done
        self._activity: trio.Event | None = None
        self._failure: str | None = None

    @property
    def sleeping(self) -> bool:
        """Whether the model is not loaded now (freed, being freed, or being loaded again)."""
        return self.state is not WakeState.AWAKE

    @asynccontextmanager
    async def held(self) -> AsyncIterator[None]:
        """Keep the model loaded for the block, loading it again first if it sleeps.

        Raises:
            Waking: the model is still being loaded after ``wake_wait_s``.
            Unloaded: loading it again failed (the engine is lost).

        """
        self.holds += 1
        self.idle_since = None
        try:
            await self._until_awake()
            yield
        finally:
            self.holds -= 1
            if self.holds == 0:
                self.idle_since = trio.current_time()
            self._signal()

    async def _until_awake(self) -> None:
        with trio.move_on_after(self.wake_wait_s) as bound:
            while self.state is not WakeState.AWAKE:
                if self._failure is not None:
                    raise Unloaded(f"the model could not be loaded again after sleeping: {self._failure}")
                if self.state is WakeState.ASLEEP:
                    logger.info("a request arrived: loading the model again")
                    self._begin(WakeState.WAKING, self._wake_up, then=WakeState.AWAKE)
                assert self._transition is not None
                await self._transition.wait()
        if bound.cancelled_caught:
            raise Waking(f"the model is still being loaded after sleeping ({self.wake_wait_s:g} s); retry")

    async def sleep(self) -> bool:
        """Free the model if nothing holds it; whether it was freed (a request meanwhile wakes it again)."""
        if self.state is not WakeState.AWAKE or self.holds:
            return False
        self._begin(WakeState.FALLING_ASLEEP, self._fall_asleep, then=WakeState.ASLEEP)
        assert self._transition is not None
        await self._transition.wait()
        return self.state is not WakeState.AWAKE and self._failure is None

    async def settled(self) -> None:
        """Return once no change is in progress."""
        while self._transition is not None and not self._transition.is_set():
            await self._transition.wait()

    async def wait_activity(self) -> None:
        """Return when a hold ends, or a change of state does (the idle timer's cue to look again)."""
        if self._activity is None:
            self._activity = trio.Event()
        await self._activity.wait()

    def _signal(self) -> None:
        if self._activity is not None:
            self._activity.set()
            self._activity = None

    def _begin(self, state: WakeState, work: Callable[[], None], *, then: WakeState) -> None:
        self.state = state
        done = self._transition = trio.Event()

        async def run() -> None:  # a system task: it must not raise
            try:
                await trio.to_thread.run_sync(work)
            except Exception as error:
                logger.exception("the model could not change from %s", state.value)
                self._failure = str(error) or type(error).__name__
                self._on_failure(f"{state.value}: {self._failure}")
            else:
                self.state = then
                if then is WakeState.ASLEEP:
                    self.sleeps += 1
                    logger.info("idle: the model was freed; the next request loads it again")
            finally:
                done.set()
                self._signal()

        trio.lowlevel.spawn_system_task(run)
