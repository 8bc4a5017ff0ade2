"""When the model is freed: after ``--sleep-idle-seconds`` idle, or after an Ollama request's ``keep_alive``.

The engine frees its model only when nothing holds it and loads it again for
the next request (``engine/_sleep.py``); this decides *when* to ask.  The
timeout is the server's ``--sleep-idle-seconds`` (None: never, llama-server's
default) until an Ollama request sends ``keep_alive``, which sets it as Ollama
does, for the requests after it too: seconds (0: free the model as soon as
it is idle), or forever; an Ollama request without one sets it back to the
server's.  Requests of the other dialects do not change it.

The operator's ``--ollama-keep-alive`` (:data:`~bubo.domain.modes.KeepAlivePolicy`)
bounds what a client's ``keep_alive`` may do, so that no client of a shared
server can free the model for everyone: ``obey`` (the default) is Ollama's
behaviour; ``extend`` admits a ``keep_alive`` only as long as the server's own
timeout or longer (``0`` and short ones keep the model the server's time);
``ignore`` admits none (the server's timeout always rules).
"""

from __future__ import annotations

import math

import attrs
import trio

from bubo.domain.modes import KeepAlivePolicy
from bubo.engine import Sleeper

__all__ = ["IdleSleeper"]


@attrs.define
class IdleSleeper:
    """Frees the engine's model once it has been idle for the timeout (run :meth:`run` in a task)."""

    idle_s: float | None = None  # --sleep-idle-seconds; None: never
    policy: KeepAlivePolicy = "obey"  # --ollama-keep-alive: what a client's keep_alive may do
    keep_alive_s: float | None = None  # the last Ollama keep_alive admitted (inf: forever); None: idle_s
    _started: float | None = None  # when run began (the idle time of a server no request reached yet)
    _changed: trio.Event | None = None

    @property
    def timeout_s(self) -> float | None:
        """Seconds idle before the model is freed; None: never."""
        timeout = self.idle_s if self.keep_alive_s is None else self.keep_alive_s
        return None if timeout is None or math.isinf(timeout) or timeout < 0 else timeout

    def keep_alive(self, seconds: float | None) -> float | None:
        """An Ollama request's ``keep_alive`` in seconds (inf: forever; None: back to ``idle_s``).

        Returns the timeout it sets, as the policy admits it: ``0`` only when
        the model is to be freed as soon as it is idle.
        """
        self.keep_alive_s = self.admitted(seconds)
        if self._changed is not None:
            self._changed.set()
        return self.keep_alive_s

    def admitted(self, seconds: float | None) -> float | None:
        """What the policy makes of a client's ``keep_alive`` of *seconds* (None: the server's timeout)."""
        if self.policy == "ignore":
            return None
        if self.policy == "extend" and seconds is not None:
            return max(seconds, math.inf if self.idle_s is None else self.idle_s)
        return seconds

    def expires_at(self, engine: Sleeper) -> float | None:
        """The trio time the model will be freed if nothing uses it meanwhile; None: never."""
        timeout = self.timeout_s
        if timeout is None:
            return None
        since = self._idle_since(engine)
        return (trio.current_time() if since is None else since) + timeout

    def _idle_since(self, engine: Sleeper) -> float | None:
        if engine.in_use:
            return None
        since = engine.idle_since
        return since if since is not None else self._started

    async def run(self, engine: Sleeper) -> None:
        """Free *engine*'s model whenever it has been idle for the timeout (until cancelled)."""
        self._started = trio.current_time()
        while True:
            changed = self._changed = trio.Event()
            deadline = math.inf
            since = self._idle_since(engine)
            if self.timeout_s is not None and since is not None and not engine.sleeping:
                deadline = since + self.timeout_s
            with trio.move_on_at(deadline) as timer:
                await self._next_change(engine, changed)
            # refused while a request holds it (then its end is the news); else it cannot sleep now
            # (lost, closed, an engine that cannot): wait for news rather than ask again at once
            if timer.cancelled_caught and not await engine.sleep() and not engine.in_use:
                await self._next_change(engine, changed)

    @staticmethod
    async def _next_change(engine: Sleeper, changed: trio.Event) -> None:
        """Return when a request stops using the engine, or the timeout changes."""
        async with trio.open_nursery() as nursery:

            async def first(wait: object) -> None:
                await wait()  # type: ignore[operator]
                nursery.cancel_scope.cancel()

            nursery.start_soon(first, engine.wait_activity)
            nursery.start_soon(first, changed.wait)
