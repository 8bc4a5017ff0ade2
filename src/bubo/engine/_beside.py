"""A thread that runs the decode thread's bookkeeping beside its next ``llama_decode``.

``llama_decode`` lets go of the GIL for the whole of its computation.  Work
that needs only what the last step sampled (each token's take: its verdict,
stop strings, its event to trio) can run then, on another CPU, instead of
between two ``llama_decode`` calls: the decode thread hands it over
(:meth:`Beside.hand`) just before it decodes, and waits for it
(:meth:`Beside.join`) before it touches what that work touches again.  A
join normally finds the work done (it takes tens of microseconds, a decode
milliseconds) and returns without waiting.

Every wait ends: the thread marks each piece of work done however the work
ends, and a join after the thread failed or stopped finds nothing running.
Work handed to a Beside that is not running (never started, stopped, or
failed: anything escaping a piece of work ends the thread, after logging it)
runs at once on the caller's thread, as it would have without one.

One piece of work at a time, from one thread (the decode thread): each hand
is followed by a join before the next hand.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from ._helper_thread import HelperThread

__all__ = ["Beside"]

logger = logging.getLogger(__name__)

Work = Callable[[], None]


class Beside(HelperThread):
    """Runs one handed piece of work at a time on its own thread; the hander joins it."""

    def __init__(self, name: str = "bubo-beside") -> None:
        """The thread (named *name*) starts with :meth:`start`."""
        super().__init__(name, threading.Lock())
        self._work: Work | None = None  # guarded by _lock: handed, not finished

    def start(self) -> None:
        """Start the thread (once; a stopped Beside stays stopped); one that cannot start is logged.

        Without its thread, handed work runs at once on the caller's.
        """
        try:
            super().start()
        except RuntimeError:  # no thread to be had
            logger.warning("the thread beside llama_decode could not start", exc_info=True)

    def hand(self, work: Work) -> None:
        """Run *work* on the thread, now; or at once on this thread when it is not running."""
        with self._lock:
            if self._running:
                assert self._work is None, "handed again before a join"
                self._work = work
                self._ready.notify_all()
                return
        work()

    def join(self) -> None:
        """Wait until the work handed last is finished (at once when it is, or none was handed)."""
        with self._lock:
            while self._work is not None:
                self._ready.wait()

    def _run(self) -> None:
        while (work := self._next()) is not None:
            try:
                work()
            except BaseException:
                logger.critical("work beside llama_decode failed; the decode thread now does it itself",
                                exc_info=True)  # fmt: skip
                with self._lock:
                    self._running = False
                    self._finished()
                return
            with self._lock:
                self._finished()

    def _next(self) -> Work | None:
        """The work handed, once there is some; None once stopping with none left (the thread ends)."""
        with self._lock:
            while self._work is None and not self._stopping:
                self._ready.wait()
            if self._work is None:
                self._running = False
            return self._work

    def _finished(self) -> None:
        """The work handed is done (call with the lock held): a join waiting for it returns."""
        self._work = None
        self._ready.notify_all()
