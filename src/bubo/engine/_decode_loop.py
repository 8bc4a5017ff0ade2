"""The decode thread: one ``llama_decode`` a step for every active generation (continuous batching).

Each turn of the thread's loop takes what crossed from trio
(:class:`~._inbox.Inbox`), then runs one step:

1. posted jobs run (:meth:`DecodeLoop.post`, a slot action), then new
   generations are admitted (:class:`~._roster.Roster`); with nothing
   active, one piece of idle work runs instead of a step
   (:meth:`DecodeLoop.post_idle`, warming a slot for its conversation's next
   turn, after the idle work posted before it);
2. the :class:`~._batch_planner.BatchPlanner` builds the step's batch: the
   next token of every generating request, then prompt tokens of the
   requests still prefilling, as many as the
   :class:`~._prefill_budget.PrefillBudget` gives the step (the whole batch
   when no stream decodes; beside streams, what keeps the step under the
   target gap), under one LoRA adapter set a step, the sets taking turns;
3. the :class:`~._step_runner.StepRunner` decodes it (a full KV cache makes
   room, a failed decode ends whom it concerns) and hands each generation its
   result through :meth:`~._roster.Roster.evaluated`, where the generation
   samples and does each token's bookkeeping, and an ended one is handed back
   to trio.

A long new prompt therefore delays the running streams by at most one chunk
a step, and a new request's prompt starts at the next step, whoever else is
generating.  Generations join (:meth:`DecodeLoop.submit`) and are dropped
(``cancelled``, then :meth:`DecodeLoop.wake`) from the trio thread at any
time; a generation whose client left is let go within one step.  With nothing
to do the loop sleeps until woken: every way work reaches it notifies the
condition it waits on.

With ``park_idle`` (a unified KV cache with host-RAM snapshots; llama-server's
``--cache-idle-slots``) the sequences of idle slots leave the cache whenever
new generations are admitted: each is kept as a snapshot and its cells are
freed.  In a unified cache every step attends over the cells up to the highest
one in use, whichever sequence holds them; the cells of idle slots are masked
out but still cost each prompt token their span (measured in
docs/performance.md, "Idle slots in the unified cache").  The new generations
take their prefixes first, so a prefix they share with an idle slot stays in
place, held by them.

The thread is the only one that touches the context once it runs; it is
started with the first generation and stopped by :meth:`DecodeLoop.stop`.
What its callbacks hand to trio goes through the loop's
:attr:`DecodeLoop.to_trio`: a :class:`~._courier.Courier`, a thread started
with it and stopped after it, so that the decode thread never wakes trio itself,
or :class:`~._courier.DirectPost` where no CPU is free for trio's work beside
``llama_decode`` (:func:`~._courier.decide_courier`).  Where a CPU is free,
the tokens' bookkeeping that can wait runs beside ``llama_decode`` too, on a
:class:`~._beside.Beside` thread started and stopped with the loop's.

Whatever the thread holds always ends.  A failure of one generation's step
ends that generation (its request gets the error); a bug in a step ends the
step's generations and the loop goes on.  Anything else that escapes, in
admission, a call, idle work or the handling of a failure itself, reaches the
one guard around the whole loop: the engine is told it is lost (``on_lost``),
every active generation, every arrival and every pending job ends with an
:class:`EngineFailure`, the failure is logged once, and the thread ends; later
work is refused.  A loop that stops ends its pending jobs too.  Nobody waiting
on the thread is left waiting.

The loop is written against :mod:`._protocols` (the context) and
:class:`~._roster.ActiveGeneration`; it imports nothing native.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from ._batch_planner import BatchPlanner
from ._beside import Beside
from ._courier import Poster
from ._crossing import Job
from ._draft_policy import DraftPolicy
from ._inbox import LOOP_FAILED, Inbox
from ._prefill_budget import PrefillBudget
from ._protocols import DecodeContext
from ._roster import ActiveGeneration, Ended, Member, Roster
from ._step_runner import StepRunner
from .errors import EngineFailure

__all__ = ["DecodeLoop", "IdleJob"]

logger = logging.getLogger(__name__)

COURIER_STOP_S = 2.0  # what the courier may take to post what the stopped thread left

IdleJob = Callable[[], None]
"""Work for when no generation is active (a warm-up); what it raises costs only that work."""


def _ignore_loss(_failure: EngineFailure) -> None:
    pass


class DecodeLoop:
    """Drives every active generation of one context, one batch a step, on its own thread."""

    def __init__(
        self,
        context: DecodeContext,
        *,
        prefill: PrefillBudget,
        drafting: DraftPolicy | None,
        to_trio: Poster,
        beside: Beside | None = None,
        park_idle: bool = False,
        on_lost: Callable[[EngineFailure], None] = _ignore_loss,
    ) -> None:
        """*on_lost* is called once, on the decode thread, when the loop can serve nothing more.

        *to_trio*: how the thread's callbacks reach trio (a courier, or directly).
        *beside*: the thread the tokens' waiting bookkeeping runs on during each decode (None: none).
        *park_idle*: move idle slots' sequences out of the cache as generations are admitted.
        """
        self._context = context
        self._park_idle = park_idle
        self._inbox = Inbox(self._start_thread)
        self._roster = Roster(on_lost)  # the loop thread's own
        self._planner = BatchPlanner(context, prefill)  # the loop thread's own
        self._beside = beside
        self._runner = StepRunner(
            context, self._roster, prefill=prefill, drafting=drafting, hold=to_trio.holding, beside=beside
        )
        self._thread: threading.Thread | None = None  # set under the inbox's condition
        self.to_trio = to_trio  # what the thread's callbacks post to trio goes through it

    # ---- the trio side -----------------------------------------------------------------------

    def submit(self, generation: ActiveGeneration, ended: Ended) -> None:
        """Add *generation* to the next step; *ended* is called when the loop lets go of it.

        Raises:
            EngineFailure: the engine is closed, or lost (then fatal).

        """
        self._inbox.submit(Member(generation, ended))

    def wake(self) -> None:
        """Make the loop look at its generations now (one was cancelled)."""
        self._inbox.wake()

    def schedule_idle(self, work: IdleJob) -> None:
        """Run *work* once no generation is active (dropped when the engine is closed or lost)."""
        self.post_idle(Job(work))

    def post(self, job: Job) -> None:
        """Run *job* before the next step; a loop that will not run it refuses it.

        For state operations on a sequence no generation uses (saving or
        restoring a slot): they run between two ``llama_decode`` calls, while
        the other generations go on.  Its caller hears of it through the job
        (:func:`~._crossing.cross`): the loop never blocks the poster.
        """
        self._inbox.post(job, idle=False)

    def post_idle(self, job: Job) -> None:
        """Run *job* once no generation is active, after the idle work posted before it."""
        self._inbox.post(job, idle=True)

    def stop(self, timeout_s: float | None = None) -> bool:
        """Stop the thread and wait for it (at most *timeout_s*), then its courier; whether it stopped.

        Generations still active end with an error, and a courier posts their
        ends to trio before it stops (within ``COURIER_STOP_S``; it never
        touches the context, so it has no say in whether the context may be
        freed).  A thread that does not stop in time is inside llama.cpp and may
        still touch the context, and post: its courier keeps running.
        """
        self._inbox.stop()
        thread = self._thread  # no thread starts once the inbox is stopping
        if thread is None:
            return True
        thread.join(timeout_s)
        if thread.is_alive():
            return False
        if self._beside is not None:
            self._beside.stop()  # idle: the stopped thread joined whatever it handed over
        if not self.to_trio.stop(COURIER_STOP_S):
            logger.warning("the courier to trio did not stop within %.0f s", COURIER_STOP_S)
        return True

    def _start_thread(self) -> None:
        """Start the thread (and its courier) if it is not running (with the inbox's condition held).

        Raises:
            EngineFailure: no thread could be started (nothing is queued; a later request tries again).

        """
        if self._thread is not None:
            return
        try:
            self.to_trio.start()  # before the thread that posts to it
        except RuntimeError:  # no thread to be had: the decode thread posts to trio itself
            logger.warning("the courier to trio could not start; events go directly", exc_info=True)
        if self._beside is not None:
            self._beside.start()  # one that cannot start leaves the work to the decode thread
        thread = threading.Thread(target=self._run, name="bubo-decode", daemon=True)
        try:
            thread.start()
        except RuntimeError as error:
            raise EngineFailure(f"the decode thread could not start: {error}") from error
        self._thread = thread

    # ---- the decode thread -------------------------------------------------------------------

    def _run(self) -> None:
        """The thread's body: serve until stopped; on any escaping failure, end everything it held."""
        try:
            self._serve()
            self._close_down()
        except BaseException as error:  # noqa: BLE001 - the one guard: nothing may end this thread silently
            self._fail_everything(error)

    def _serve(self) -> None:
        while (turn := self._inbox.take(busy=bool(self._roster.members))) is not None:
            for call in turn.calls:
                self._run_call(call)
            for member in turn.arrivals:
                self._admit(member)
            if turn.arrivals and self._park_idle:
                self._park_idle_sequences()
            if turn.idle_job is not None:
                self._run_idle(turn.idle_job)
                continue
            try:
                self._step()
            except Exception as error:  # noqa: BLE001 - a bug in a step: end what it held, keep serving
                self._step_failed(error)

    def _step(self) -> None:
        self._roster.drop_cancelled()
        if self._roster.members:
            batch = self._planner.next_batch(self._roster.members)
            self._runner.run(batch, step=self._planner.steps)

    def _step_failed(self, error: Exception) -> None:
        logger.error("a decode step failed; its generations end with an error", exc_info=error)
        for member in self._roster.members:
            member.generation.cache.clear()
        self._roster.end_all(error)

    def _close_down(self) -> None:
        """Stopped: what is still active, arriving or posted ends with the closed engine's error."""
        jobs, arrivals = self._inbox.close()
        for job in jobs:
            job.refuse(EngineFailure("the engine was closed"))
        self._roster.end_all(EngineFailure("the engine was closed while generating"), arrivals=arrivals)

    def _fail_everything(self, error: BaseException) -> None:
        """The guard: end every generation, arrival and job with an error, refuse work, report the loss."""
        logger.critical("the decode thread failed; the engine is lost", exc_info=error)
        try:  # first: the engine must know it is lost before any request hears of its end
            self._roster.lose(EngineFailure(f"{LOOP_FAILED}: {error!r}", fatal=True))
        except Exception:
            logger.exception("the engine could not be told it is lost")
        jobs, arrivals = self._inbox.fail()
        for job in jobs:  # those that ended already are left alone
            try:
                job.refuse(EngineFailure(LOOP_FAILED))
            except Exception:
                logger.exception("a job's end could not be delivered")
        self._roster.abandon(arrivals, EngineFailure("the engine failed on its decode thread"))

    def _admit(self, member: Member) -> None:
        self._roster.admit(member)

    def _park_idle_sequences(self) -> None:
        """Move every idle slot's sequence to a host-RAM snapshot and free its cells.

        Cells an active generation shares stay (they are its own too); only
        the idle sequence's hold on them goes.  A sequence larger than the
        whole snapshot budget stays in place.
        """
        active = self._roster.seq_ids()
        for cache in self._context.caches:
            if cache.seq_id not in active and cache.tokens:
                cache.park()

    @staticmethod
    def _run_call(job: Job) -> None:
        job.execute()  # its end, result or error, goes to its poster

    def _run_idle(self, job: Job) -> None:
        try:
            job.execute()  # an idle job nobody waits for lets its failure out to here
        except EngineFailure as failure:
            if failure.fatal:
                self._roster.lose(failure)
            else:
                logger.warning("idle work failed, the next turn starts cold: %s", failure.message)
        except Exception:  # a bug in idle work costs only the warm-up
            logger.exception("idle work failed unexpectedly; the next turn starts cold")
