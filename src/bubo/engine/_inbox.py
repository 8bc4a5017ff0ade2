"""What crosses from the trio thread to the decode thread, under one condition variable.

Generations arrive (:meth:`Inbox.submit`), jobs are posted to run before the
next step (:meth:`Inbox.post`) or once no generation is active (``idle``),
and the loop is stopped; each of these notifies the condition, so the decode
thread waiting in :meth:`Inbox.take` always wakes for it.  The thread takes
everything queued at the start of each turn (a :class:`Turn`), so a change
made meanwhile waits at most one step.  Once the loop stopped or failed, new
work is refused at once (its poster hears it, never waits for a thread that
will not run it).

The inbox remembers the last turn it handed out (:attr:`Inbox.taken`), so the
loop's guard can end the work it had taken but not finished, along with what
was still queued (:meth:`Inbox.fail`).
"""

from __future__ import annotations

import collections
import enum
import threading
from collections.abc import Callable

import attrs

from ._crossing import Job
from ._roster import Member
from .errors import EngineFailure

__all__ = ["LOOP_FAILED", "Inbox", "InboxState", "Turn"]

LOOP_FAILED = "the engine failed on its decode thread and cannot serve requests"


class InboxState(enum.Enum):
    """Whether the inbox takes work: open, stopping (the loop ends next turn), or failed (the guard ran)."""

    OPEN = "open"
    STOPPING = "stopping"
    FAILED = "failed"


@attrs.frozen
class Turn:
    """What the decode thread took up at the start of one turn of its loop."""

    calls: tuple[Job, ...] = ()
    arrivals: tuple[Member, ...] = ()
    idle_job: Job | None = None  # idle work, taken only when no generation arrived or is active


class Inbox:
    """The decode loop's queues, its stop and failure flags, and the condition its thread waits on."""

    def __init__(self, start: Callable[[], None]) -> None:
        """*start* is called (with the condition held) as work is queued: it starts the thread if needed.

        It raises ``EngineFailure`` when no thread can be started: the work is then refused.
        """
        self._start = start
        self._wakeup = threading.Condition()
        self._arrivals: list[Member] = []  # guarded by _wakeup
        self._calls: list[Job] = []  # guarded by _wakeup
        self._idle_jobs: collections.deque[Job] = collections.deque()  # guarded by _wakeup
        self._state = InboxState.OPEN  # guarded by _wakeup; FAILED is final
        self._quiet = Turn()  # a turn with nothing new (most turns while generating: made once)
        self.taken = self._quiet  # the decode thread's own: the turn take() handed out last

    # ---- the trio side -----------------------------------------------------------------------

    def submit(self, member: Member) -> None:
        """Queue *member* for the next step.

        Raises:
            EngineFailure: the engine is closed, or lost (then fatal), or no thread could be started.

        """
        with self._wakeup:
            refusal = self._refusal()
            if refusal is not None:
                raise refusal
            self._start()  # first: a thread that cannot start leaves nothing queued
            self._arrivals.append(member)
            self._wakeup.notify_all()

    def post(self, job: Job, *, idle: bool) -> None:
        """Queue *job* to run before the next step (*idle*: once no generation is active), or refuse it."""
        with self._wakeup:
            refusal = self._refusal()
            if refusal is None:
                try:
                    self._start()  # first: a thread that cannot start leaves nothing queued
                except EngineFailure as failure:
                    refusal = failure
                else:
                    (self._idle_jobs if idle else self._calls).append(job)
                    self._wakeup.notify_all()
        if refusal is not None:
            job.refuse(refusal)

    def wake(self) -> None:
        """Make the thread look at its generations now (one was cancelled)."""
        with self._wakeup:
            self._wakeup.notify_all()

    def stop(self) -> None:
        """Refuse new work and make the thread stop at its next turn."""
        with self._wakeup:
            if self._state is InboxState.OPEN:
                self._state = InboxState.STOPPING
            self._wakeup.notify_all()

    def _refusal(self) -> EngineFailure | None:
        """Why no new work is taken, or None (call with ``_wakeup`` held)."""
        if self._state is InboxState.FAILED:
            return EngineFailure(LOOP_FAILED, fatal=True)
        if self._state is InboxState.STOPPING:
            return EngineFailure("the engine is closed")
        return None

    # ---- the decode thread -------------------------------------------------------------------

    def take(self, *, busy: bool) -> Turn | None:
        """Wait for work (none needed while *busy*: generations are active) and take it; None once stopped."""
        with self._wakeup:
            while not (
                self._arrivals or busy or self._idle_jobs or self._calls or self._state is not InboxState.OPEN
            ):
                self._wakeup.wait()
            if self._state is not InboxState.OPEN:
                return None
            if busy and not (self._calls or self._arrivals):
                self.taken = self._quiet
                return self.taken
            calls, self._calls = tuple(self._calls), []
            arrivals, self._arrivals = tuple(self._arrivals), []
            idle = not (arrivals or busy)
            idle_job = self._idle_jobs.popleft() if idle and self._idle_jobs else None
            self.taken = Turn(calls, arrivals, idle_job)
        return self.taken

    def close(self) -> tuple[list[Job], list[Member]]:
        """Stopped: take the jobs and arrivals still queued (the loop ends them)."""
        with self._wakeup:
            arrivals, self._arrivals = self._arrivals, []
            jobs = [*self._calls, *self._idle_jobs]
            self._calls, self._idle_jobs = [], collections.deque()
            self.taken = Turn(arrivals=tuple(arrivals))
        return jobs, arrivals

    def fail(self) -> tuple[list[Job], list[Member]]:
        """The guard: refuse new work from now on; the jobs and arrivals taken or queued (some ended)."""
        taken = self.taken
        with self._wakeup:
            self._state = InboxState.FAILED
            jobs = [*taken.calls, *self._calls, *self._idle_jobs]
            if taken.idle_job is not None:
                jobs.append(taken.idle_job)
            arrivals = [*taken.arrivals, *self._arrivals]
            self._calls, self._arrivals = [], []
            self._idle_jobs.clear()
            self._wakeup.notify_all()
        return jobs, arrivals
