"""A thread the decode loop's helpers own (the courier, the thread beside ``llama_decode``): its life.

Started once, under the owner's lock, and never again once stopped; told to
stop through a flag under the same lock (its loop waits on the owner's
condition, which the stop notifies); joined with a bound.  What the thread
does is the owner's (:meth:`HelperThread._run`).
"""

from __future__ import annotations

import threading

__all__ = ["HelperThread"]


class HelperThread:
    """The life of one daemon thread its subclass runs (:meth:`_run`), guarded by the subclass's lock."""

    def __init__(self, name: str, lock: threading.Lock | threading.RLock) -> None:
        """The thread (named *name*) starts with :meth:`start`; *lock* guards the subclass's state too."""
        self._name = name
        self._lock = lock
        self._ready = threading.Condition(lock)  # what the thread waits on; the stop notifies it
        self._running = False  # guarded by _lock: started, neither stopped nor failed
        self._stopping = False  # guarded by _lock
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start the thread (once; a stopped one stays stopped).

        Raises:
            RuntimeError: the thread could not start.

        """
        with self._lock:  # the thread waits for this lock: it finds itself running
            if self._thread is not None:
                return
            thread = threading.Thread(target=self._run, name=self._name, daemon=True)
            thread.start()
            self._thread, self._running = thread, True

    def stop(self, timeout_s: float | None = None) -> bool:
        """Let the thread finish what it was given and end; whether it ended within *timeout_s*."""
        with self._lock:
            self._stopping = True
            self._ready.notify_all()
            thread = self._thread
        if thread is None:
            return True
        thread.join(timeout_s)
        return not thread.is_alive()

    def _run(self) -> None:
        raise NotImplementedError
