"""One way across to the decode thread: a job posted to it, its end heard in trio, every wait bounded.

Work a trio task needs done on the decode thread (a slot file's save, restore
or erase; waiting for the idle work queued so far) is a :class:`Job`.  The
thread takes it up between two steps, or once no generation is active, and
calls the job's ``started`` and ``ended`` callbacks; :func:`cross` posts them
to trio with ``TrioToken.run_sync_soon``, as a generation's events are.  No
worker thread waits on the decode thread, and the trio task waits on trio
events, so its wait can be cancelled.

Every wait ends, whatever the thread does:

- the job ends (its result or its error), or the loop refuses it: it is
  closed or lost, and as it stops it ends every job it still holds;
- the thread does not take the job up within *start_within_s*: it is stuck in
  the step in progress (inside llama.cpp);
- the job does not finish within *finish_within_s* of its start: the native
  call it makes hangs;
- the caller is cancelled (its client left, shutdown's deadline passed).  A
  job not yet taken up is withdrawn and never runs.  One already running
  cannot be interrupted: the caller waits for it, shielded, for what is left
  of its bound, because the slot it works on must not go to another request
  while the job still reads or writes it.

A job past its bound leaves the thread inside llama.cpp: the engine is lost
(*lose*, which moves the server to ``device_lost``), the caller gets a fatal
:class:`EngineFailure` (500 ``engine_error``, as for any stuck thread), and
the job's end, if it ever comes, is heard by nobody.
"""

from __future__ import annotations

import contextlib
import enum
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

import trio

from .errors import EngineFailure

__all__ = ["RELEASE_WAIT_S", "SLOT_ACTION_WAIT_S", "Job", "cross", "post_to_trio"]

T = TypeVar("T")

RELEASE_WAIT_S = 60.0
"""How long the decode thread may take to let go of a request or take up a job: the step in progress
(a prompt chunk of a large model on a slow CPU, a DRY stage built) and no more.  Past it the thread is
taken to be stuck in llama.cpp, and the engine is lost."""

SLOT_ACTION_WAIT_S = 300.0
"""How long a slot action may run once the decode thread took it up: llama.cpp reading or writing a
slot file (a state of several GiB on a slow disk takes minutes).  Past it the file call is taken to
hang, and the engine is lost."""

Ended = Callable[[object, BaseException | None], None]
"""Hears a job's end: its result and None, or None and its error."""


class _State(enum.Enum):
    QUEUED = "queued"
    RUNNING = "running"
    ENDED = "ended"
    WITHDRAWN = "withdrawn"


class Job:
    """Work for the decode thread, and who hears of its start and of its end (each at most once).

    Any thread may withdraw a job it posted, refuse it, or run it; the first
    of those to happen decides.  A job nobody listens to (no *ended*: idle
    work queued and forgotten) lets a failure out to the thread that runs it.
    """

    def __init__(
        self,
        run: Callable[[], object],
        *,
        started: Callable[[], None] | None = None,
        ended: Ended | None = None,
    ) -> None:
        """*started* and *ended* run on the thread that runs or refuses the job; they must not block."""
        self._run = run
        self._started = started
        self._ended = ended
        self._lock = threading.Lock()
        self._state = _State.QUEUED

    def execute(self) -> None:
        """Run it, unless it was withdrawn or has ended, and deliver its end.

        Raises:
            BaseException: what the work raised, only when nobody listens to its end.

        """
        with self._lock:
            if self._state is not _State.QUEUED:
                return
            self._state = _State.RUNNING
        if self._started is not None:
            self._started()
        try:
            result = self._run()
        except BaseException as error:
            if self._ended is None:
                self._end(None, None)
                raise
            self._end(None, error)
        else:
            self._end(result, None)

    def refuse(self, error: BaseException) -> None:
        """End it with *error* unless it has ended or was withdrawn (its thread will not run it)."""
        self._end(None, error)

    def withdraw(self) -> bool:
        """Take it back before it starts; whether that was in time (False: it runs, or it ended)."""
        with self._lock:
            if self._state is not _State.QUEUED:
                return False
            self._state = _State.WITHDRAWN
            return True

    def _end(self, result: object, error: BaseException | None) -> None:
        with self._lock:
            if self._state not in (_State.QUEUED, _State.RUNNING):
                return
            self._state = _State.ENDED
        if self._ended is not None:
            self._ended(result, error)


class _Heard(Generic[T]):
    """The trio side of one job: what its callbacks posted (used on the trio thread only)."""

    def __init__(self) -> None:
        self.started = trio.Event()
        self.ended = trio.Event()
        self._result: object = None
        self._error: BaseException | None = None

    def end(self, result: object, error: BaseException | None) -> None:
        self._result, self._error = result, error
        self.started.set()  # a refused job ends without starting
        self.ended.set()

    def outcome(self) -> T:
        if self._error is not None:
            raise self._error
        return self._result  # type: ignore[return-value] # what the job's work returned


async def cross(
    post: Callable[[Job], None],
    work: Callable[[], T],
    *,
    what: str,
    start_within_s: float,
    finish_within_s: float,
    lose: Callable[[str], None],
) -> T:
    """*work*'s result, run on the thread *post* hands the job to; cancellable, and bounded as said above.

    *what* names the work in errors ("a slot save"); *lose* marks the engine
    lost (on the trio thread).

    Raises:
        EngineFailure: the loop refused the job; fatal (and the engine lost) when a bound passed.
        Exception: whatever *work* raised.

    """
    token = trio.lowlevel.current_trio_token()
    heard: _Heard[T] = _Heard()
    job = Job(
        work,
        started=lambda: post_to_trio(token, heard.started.set),
        ended=lambda result, error: post_to_trio(token, heard.end, result, error),
    )
    post(job)
    finish_by: float | None = None  # once trio has heard that it started
    try:
        with trio.move_on_after(start_within_s):
            await heard.started.wait()
        if not heard.started.is_set() and job.withdraw():
            _lost(lose, f"the decode thread did not take up {what} within {start_within_s:g} s")
        finish_by = trio.current_time() + finish_within_s
        with trio.move_on_at(finish_by):
            await heard.ended.wait()
    except trio.Cancelled:
        if finish_by is None:
            if job.withdraw():
                raise  # it never runs: nothing to wait for
            finish_by = trio.current_time() + finish_within_s  # it started, just now or unheard yet
        with trio.CancelScope(deadline=finish_by, shield=True):
            await heard.ended.wait()
        if not heard.ended.is_set():
            _lost(lose, f"{what} did not finish within {finish_within_s:g} s")
        raise
    if not heard.ended.is_set():
        _lost(lose, f"{what} did not finish within {finish_within_s:g} s")
    try:
        return heard.outcome()
    except EngineFailure as failure:
        if failure.fatal:
            lose(failure.message)
        raise


def _lost(lose: Callable[[str], None], message: str) -> None:
    """The thread is stuck inside llama.cpp: lose the engine and fail the caller.

    Raises:
        EngineFailure: always (fatal).

    """
    lose(message)
    raise EngineFailure(f"{message}; the engine is lost", fatal=True)


def post_to_trio(token: trio.lowlevel.TrioToken, function: Callable[..., object], *args: object) -> None:
    """Run *function* on the trio thread soon (from any thread); a run that has ended hears nothing."""
    with contextlib.suppress(trio.RunFinishedError):
        token.run_sync_soon(function, *args)
