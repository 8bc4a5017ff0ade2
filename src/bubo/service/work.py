"""Heavy request work off the event loop: a bounded number of jobs, admitted against memory.

Parsing a large body, rendering and tokenizing a long prompt, counting tokens,
detokenizing, resolving a large logit bias: on the trio thread each of these
froze every other request, ``/health`` included (a 10 MB ``/tokenize`` for
14.7 s).  :class:`Workers` runs such a job in a worker thread, at most
``max_jobs`` at once (the others wait their turn, first come first served),
and before it starts asks the memory guard for the memory the job is
estimated to need, on top of what the jobs already running hold.

Parsing JSON and tokenizing mostly run in C and Rust, which keep the event
loop's thread waiting only briefly (tokenizers releases the GIL; Python code in
a worker gives it back every few milliseconds).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import attrs
import trio

from bubo.errors import QueueFull

from .memory import MemoryGuard

__all__ = [
    "DEFAULT_MAX_JOBS",
    "PARSE_BYTES_PER_BYTE",
    "PREPARE_BYTES_PER_CHAR",
    "WORKER_RETRY_AFTER_S",
    "Workers",
]

T = TypeVar("T")

DEFAULT_MAX_JOBS = 2
# Estimated peak working memory of a job per byte of its input, measured with the default model
# (see docs/operations.md): parsing a JSON body into Python objects and structuring it, and
# rendering a prompt and tokenizing it (the text, its rendered copy, the ids, the library's
# per-batch encodings).
WORKER_RETRY_AFTER_S = 1
"""What a client refused a worker should wait before trying again, in seconds (a job takes milliseconds)."""
PARSE_BYTES_PER_BYTE = 4
PREPARE_BYTES_PER_CHAR = 8


@attrs.define
class Workers:
    """Runs blocking jobs in worker threads, ``max_jobs`` at a time, each admitted against memory.

    At most ``max_waiting`` callers wait for a worker (None: any number); one more is
    refused with 503 ``queue_full``.  A request waiting for a worker holds its
    connection as a running one does, so the bound keeps one client's flood of
    bodies from holding every connection (``bubo serve``'s cap) behind the workers.
    """

    max_jobs: int = DEFAULT_MAX_JOBS
    guard: MemoryGuard | None = None
    max_waiting: int | None = None
    _limiter: trio.CapacityLimiter = attrs.field(init=False)
    _reserved_bytes: int = attrs.field(default=0, init=False)

    def __attrs_post_init__(self) -> None:
        self._limiter = trio.CapacityLimiter(self.max_jobs)

    @property
    def reserved_bytes(self) -> int:
        """The memory the running jobs were admitted with."""
        return self._reserved_bytes

    async def run(self, fn: Callable[[], T], *, need_bytes: int = 0) -> T:
        """``fn()`` in a worker thread, once a job slot is free and the memory it needs is available.

        A cancelled caller waits for a job that already started (the thread
        cannot be interrupted) but never starts one.

        Raises:
            InsufficientMemory: *need_bytes* is more than is available now,
                beside what the running jobs hold (as the guard decides).
            QueueFull: ``max_waiting`` callers already wait for a worker.

        """
        waiting = self._limiter.statistics().tasks_waiting
        if (
            self.max_waiting is not None
            and waiting >= self.max_waiting
            and not self._limiter.available_tokens
        ):
            raise QueueFull(
                f"{waiting} requests already wait for a worker (the server's --max-queue); try again shortly",
                retry_after_s=WORKER_RETRY_AFTER_S,
            )
        async with self._limiter:
            if self.guard is not None and need_bytes:
                self.guard.admit_bytes(need_bytes, reserved_bytes=self._reserved_bytes)
            self._reserved_bytes += need_bytes
            try:
                return await trio.to_thread.run_sync(fn, thread_name="bubo-work")
            finally:
                self._reserved_bytes -= need_bytes
