"""The decode thread's way out to trio: a courier thread posts what it queues, so it never wakes trio itself.

``TrioToken.run_sync_soon`` writes to trio's wake-up socket, and that write
lets go of the GIL: trio, woken, takes it and runs the token's whole way out
(the service, the encoder, the SSE frame, the socket write) while the decode
thread waits for the GIL back, between two ``llama_decode`` calls
(docs/performance.md, "Cadence").  The decode thread instead appends each
callback to the :class:`Courier`'s queue, which makes no system call that
lets go of the GIL; the courier thread takes everything queued at once and
posts it to trio in one ``run_sync_soon`` call a trio run, which runs it in
order.  Trio then runs while the decode thread is inside ``llama_decode``.
While the decode thread takes a step's results (sampling each generation's
token, which lets go of the GIL) it holds the queue (:meth:`Courier.holding`):
the courier takes nothing until the hold ends, and is woken once, then.

Order: one queue, one thread, one post a batch, and trio's own FIFO: trio runs
the callbacks in the order they were queued (a generation's events before its
end).  Nothing is lost or run twice:

- :meth:`Courier.stop` queues its end after everything queued before it, so
  that is still posted; a trio run that has ended hears nothing, as with any
  post (``trio.RunFinishedError``);
- a post that fails for another reason is logged, and the courier goes on with
  the next (nothing else could reach that run from another thread);
- a post made before the courier starts (or when its thread cannot start),
  after it stopped, or once it failed (anything else escaping its loop, which
  then posts what it still held, but the batch whose post failed, directly,
  before any later post) goes to trio directly.

Callbacks must not block; one that raises still lets the rest of its batch
run, then crashes the trio run, as a raising ``run_sync_soon`` callback does.

The courier pays where a CPU is free for trio's work beside ``llama_decode``:
llama.cpp's threads fewer than the CPUs, or the model's layers on a GPU.
Where llama.cpp computes on every CPU, trio's work beside ``llama_decode``
takes its time from llama.cpp's threads (docs/performance.md, "Cadence"), and
:class:`DirectPost` posts each callback to trio from the decode thread, as it
comes.  :func:`decide_courier` chooses (``--courier``).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from typing import Protocol

import attrs
import trio

from bubo.domain.modes import CourierMode

from ._crossing import post_to_trio
from ._helper_thread import HelperThread

__all__ = ["Courier", "CourierDecision", "DirectPost", "Poster", "decide_courier"]

logger = logging.getLogger(__name__)

Call = tuple[Callable[..., object], tuple[object, ...]]
Post = tuple[trio.lowlevel.TrioToken, Callable[..., object], tuple[object, ...]]
Run = tuple[trio.lowlevel.TrioToken, list[Call]]


class Poster(Protocol):
    """How the decode loop's callbacks reach trio: a :class:`Courier`, or :class:`DirectPost`."""

    def post(self, token: trio.lowlevel.TrioToken, function: Callable[..., object], *args: object) -> None:
        """Run *function(*args)* on *token*'s trio thread soon, after everything posted before it."""
        ...

    def holding(self) -> contextlib.AbstractContextManager[None]:
        """While in it, posts may wait, to go together as it ends."""
        ...

    def start(self) -> None:
        """Be ready to post (before the decode thread starts)."""
        ...

    def stop(self, timeout_s: float | None = None) -> bool:
        """Post what is still held and end; whether it ended within *timeout_s*."""
        ...


@attrs.frozen(kw_only=True)
class CourierDecision:
    """Whether the decode loop posts through a courier thread, and why (one phrase for the log)."""

    enabled: bool
    reason: str


def decide_courier(mode: CourierMode, *, n_threads: int, cpus: int, gpu_layers: bool) -> CourierDecision:
    """Whether a courier pays: *mode* on or off says; auto, where a CPU is free beside llama.cpp's threads.

    *gpu_layers*: some of the model's layers run on a GPU (llama.cpp's threads
    then mostly wait for it).
    """
    if mode != "auto":
        return CourierDecision(enabled=mode == "on", reason=f"--courier {mode}")
    if gpu_layers:
        return CourierDecision(enabled=True, reason="the model's layers are on a GPU")
    if n_threads < cpus:
        return CourierDecision(enabled=True, reason=f"--threads {n_threads} leaves CPUs free of {cpus}")
    return CourierDecision(enabled=False, reason=f"--threads {n_threads} keeps all {cpus} CPUs busy")


class DirectPost:
    """The decode thread posts each callback to trio itself, as it comes (trio's ``run_sync_soon``)."""

    def __init__(self) -> None:
        self._nothing_held = contextlib.nullcontext()  # one for every step: it holds nothing

    def post(self, token: trio.lowlevel.TrioToken, function: Callable[..., object], *args: object) -> None:
        """Run *function(*args)* on *token*'s trio thread soon; trio keeps the order of its posts."""
        post_to_trio(token, function, *args)

    def holding(self) -> contextlib.AbstractContextManager[None]:
        """Nothing waits: each post goes as it is made."""
        return self._nothing_held

    def start(self) -> None:
        """Nothing to start: posts go from the poster's own thread."""

    def stop(self, timeout_s: float | None = None) -> bool:  # noqa: ARG002 - the Poster's signature
        """Nothing is held, so nothing is left to post: ended at once."""
        return True


class Courier(HelperThread):
    """A thread that posts queued callbacks to their trio runs, in order, all queued at once in one post.

    :meth:`start` raises ``RuntimeError`` when the thread cannot start (posts
    then go to trio directly); :meth:`stop` posts what is queued, then ends it.
    """

    def __init__(self, name: str = "bubo-courier") -> None:
        """The thread (named *name*) starts with :meth:`start`."""
        super().__init__(name, threading.RLock())  # entered as is where nothing waits: one C call
        self._queued: list[Post] = []  # guarded by _lock
        self._holding = False  # guarded by _lock: a hold is open (the courier takes nothing)
        self._hold = _Hold(self._begin_hold, self._end_hold)

    def post(self, token: trio.lowlevel.TrioToken, function: Callable[..., object], *args: object) -> None:
        """Run *function(*args)* on *token*'s trio thread soon, after everything posted before it."""
        with self._lock:
            if self._running:
                self._queued.append((token, function, args))
                if not self._holding:  # held posts go as the hold ends
                    self._ready.notify()
                return
        post_to_trio(token, function, *args)  # not started, stopped or failed: straight to trio

    def holding(self) -> contextlib.AbstractContextManager[None]:
        """While in it, the courier takes nothing queued; as it ends (however it ends), it takes it all.

        The decode thread holds the queue while it takes a step's results: each
        ``llama_sampler_sample`` lets go of the GIL, and a courier woken by the
        first stream's event would take it there and wake trio in the middle of
        the step.  A hold must not wait on anything: it encloses Python work and
        sampling only, never ``llama_decode`` (what is posted before that goes at
        once).  One hold object serves every step (it runs once a token).
        """
        return self._hold

    def _begin_hold(self) -> None:
        with self._lock:
            self._holding = True

    def _end_hold(self) -> None:
        with self._lock:
            self._holding = False
            if self._queued:
                self._ready.notify()

    def _run(self) -> None:
        pending: list[Post] = []  # taken and not handed to a post yet
        try:
            while batch := self._take():
                pending = batch
                for token, calls in _by_run(batch):
                    del pending[: len(calls)]  # a post that fails is not made again
                    _post_batch(token, calls)
        except BaseException:  # the guard: what it held and what comes next still go to trio, in order
            logger.critical("the courier to trio failed; the decode thread now posts directly", exc_info=True)
            with self._lock:  # posted under the lock: no later post, now direct, overtakes these
                self._running = False
                rest, self._queued = [*pending, *self._queued], []
                for token, calls in _by_run(rest):
                    _post_batch(token, calls)

    def _take(self) -> list[Post]:
        """Everything queued, once there is some and no hold; empty once stopping with nothing left."""
        with self._lock:
            while not (self._stopping or (self._queued and not self._holding)):
                self._ready.wait()
            batch, self._queued = self._queued, []
            if not batch:
                self._running = False
            return batch


class _Hold:
    """A :class:`Courier`'s hold as a context manager: *begin* as it opens, *end* as it closes."""

    __slots__ = ("_begin", "_end")

    def __init__(self, begin: Callable[[], None], end: Callable[[], None]) -> None:
        self._begin, self._end = begin, end

    def __enter__(self) -> None:
        self._begin()

    def __exit__(self, *_exc: object) -> None:
        self._end()


def _by_run(batch: list[Post]) -> list[Run]:
    """*batch* in order, cut into runs of consecutive calls for the same trio run."""
    runs: list[Run] = []
    for token, function, args in batch:
        if not runs or runs[-1][0] is not token:
            runs.append((token, []))
        runs[-1][1].append((function, args))
    return runs


def _post_batch(token: trio.lowlevel.TrioToken, calls: list[Call]) -> None:
    """Post *calls* to *token*'s run as one callback; a run that has ended, or refuses, hears nothing."""
    try:
        post_to_trio(token, _run_in_order, calls)
    except Exception:
        logger.exception(
            "%d callbacks could not be posted to trio; that trio run does not hear them", len(calls)
        )


def _run_in_order(calls: list[Call]) -> None:
    """On the trio thread: run every call in order; the first failure is raised once all have run.

    Later failures are logged (trio hears of one).
    """
    failure: BaseException | None = None
    for function, args in calls:
        try:
            function(*args)
        except BaseException as error:  # the others still run; the first is raised below
            if failure is None:
                failure = error
            else:
                logger.exception("a callback posted to trio failed after another", exc_info=error)
    if failure is not None:
        raise failure
