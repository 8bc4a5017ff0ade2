"""The decode thread: one ``llama_decode`` a step for every active generation (continuous batching).

Each step builds one batch: the next token of every generating request, then
prompt tokens of the requests still prefilling, as many as the
:class:`~._prefill_budget.PrefillBudget` gives the step (the whole batch when
no stream decodes; beside streams, what keeps the step under the target gap),
shared among the prompts oldest first with a floor for each.  A long new
prompt therefore delays the running streams by at most one chunk a step, and a
new request's prompt starts at the next step, whoever else is generating.
Only generations under one LoRA adapter set share a step (as llama-server
batches only slots with the same adapters): each step serves the set of the
generation that has waited longest for a step, so sets take turns, and the
budget applies within the step to that set's prompts alone.
Generations join (:meth:`DecodeLoop.submit`) and are dropped (``cancelled``,
then :meth:`DecodeLoop.wake`) from the trio thread at any time; the loop
takes the changes at the start of each step, so a generation whose client left
is let go within one step.  Other work crosses as a :class:`~._crossing.Job`:
posted (:meth:`DecodeLoop.post`, a slot action) it runs before the next step;
posted as idle work (:meth:`DecodeLoop.post_idle`, warming a slot for its
conversation's next turn) it runs once no generation is active, after the idle
work posted before it.  With nothing to do the loop sleeps until woken.

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
:class:`ActiveGeneration`; it imports nothing native.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Protocol

import attrs

from bubo.domain.generation import StopCause
from bubo.errors import ServiceUnavailable

from ._crossing import Job
from ._draft_policy import DraftPolicy
from ._prefill_budget import PrefillBudget, attended_cells, share_room
from ._protocols import BatchEntry, ContextFull, DecodeContext, KvSequence
from .base import EngineFailure
from .lora import AdapterSet

__all__ = ["ActiveGeneration", "DecodeLoop", "IdleJob"]

logger = logging.getLogger(__name__)

Ended = Callable[[BaseException | None], None]
"""Called on the decode thread once the loop lets go of a generation: with its error, or None."""


class ActiveGeneration(Protocol):
    """What the loop asks of a generation (``_generation.Generation``), on the decode thread."""

    cancelled: bool  # set on the trio thread: let go of it at the next step

    @property
    def cache(self) -> KvSequence:
        """The slot's KV sequence it writes."""
        ...

    @property
    def done(self) -> bool:
        """Whether it ended."""
        ...

    @property
    def adapters(self) -> AdapterSet:
        """The LoRA adapter set it decodes under."""
        ...

    @property
    def prefilling(self) -> bool:
        """Whether prompt tokens remain to evaluate."""
        ...

    @property
    def prompt_left(self) -> int:
        """Prompt tokens still to evaluate."""
        ...

    def start(self) -> None:
        """Reuse the cached prefix and build the sampler (raises the request's own failure)."""
        ...

    def prompt_entry(self, room: int) -> BatchEntry:
        """Up to *room* prompt tokens for the next batch."""
        ...

    def token_entry(self, *, alone: bool) -> BatchEntry:
        """The token to evaluate next (and a draft, when *alone* in the batch)."""
        ...

    def evaluated(self, entry: BatchEntry, index: int) -> None:
        """*entry* was decoded at batch index *index*."""
        ...

    def finish(self, cause: StopCause) -> None:
        """End it now, for *cause*."""
        ...

    def close(self) -> None:
        """Free what it holds (it ended, failed or was let go of)."""
        ...


IdleJob = Callable[[], None]
"""Work for when no generation is active (a warm-up); what it raises costs only that work."""

LOOP_FAILED = "the engine failed on its decode thread and cannot serve requests"


def _ignore_loss(_failure: EngineFailure) -> None:
    pass


@attrs.define(eq=False)
class _Member:
    generation: ActiveGeneration
    ended: Ended
    over: bool = False  # its end was delivered (or is being delivered): never twice
    served: int = -1  # the last step it was in (the adapter sets take turns by it)


class DecodeLoop:
    """Drives every active generation of one context, one batch a step, on its own thread."""

    def __init__(
        self,
        context: DecodeContext,
        *,
        prefill: PrefillBudget,
        drafting: DraftPolicy | None,
        park_idle: bool = False,
        on_lost: Callable[[EngineFailure], None] = _ignore_loss,
    ) -> None:
        """*on_lost* is called once, on the decode thread, when the loop can serve nothing more.

        *park_idle*: move idle slots' sequences out of the cache as generations are admitted.
        """
        self._context = context
        self._prefill = prefill
        self._drafting = drafting
        self._park_idle = park_idle
        self._on_lost = on_lost
        self._wakeup = threading.Condition()
        self._arrivals: list[_Member] = []  # guarded by _wakeup
        self._idle_jobs: collections.deque[Job] = collections.deque()  # guarded by _wakeup
        self._stopping = False  # guarded by _wakeup
        self._failed = False  # guarded by _wakeup: the guard ended the loop; new work is refused
        self._calls: list[Job] = []  # guarded by _wakeup
        self._active: list[_Member] = []  # the loop thread's own
        self._taken_calls: list[Job] = []  # the loop thread's own: taken from _calls this turn
        self._idle_job: Job | None = None  # the loop thread's own: the idle job taken this turn
        self._taken_arrivals: list[_Member] = []  # the loop thread's own: taken from _arrivals this turn
        self._fatal: EngineFailure | None = None
        self._thread: threading.Thread | None = None
        self._steps = 0  # the loop thread's own: steps decoded

    # ---- the trio side -----------------------------------------------------------------------

    def submit(self, generation: ActiveGeneration, ended: Ended) -> None:
        """Add *generation* to the next step; *ended* is called when the loop lets go of it.

        Raises:
            EngineFailure: the engine is closed, or lost (then fatal).

        """
        with self._wakeup:
            self._check_open()
            self._arrivals.append(_Member(generation, ended))
            self._start_thread()
            self._wakeup.notify_all()

    def wake(self) -> None:
        """Make the loop look at its generations now (one was cancelled)."""
        with self._wakeup:
            self._wakeup.notify_all()

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
        self._queue(self._calls, job)

    def post_idle(self, job: Job) -> None:
        """Run *job* once no generation is active, after the idle work posted before it."""
        self._queue(self._idle_jobs, job)

    def _queue(self, queue: list[Job] | collections.deque[Job], job: Job) -> None:
        with self._wakeup:
            refusal = self._refusal()
            if refusal is None:
                queue.append(job)
                self._start_thread()
                self._wakeup.notify_all()
        if refusal is not None:
            job.refuse(refusal)

    def stop(self, timeout_s: float | None = None) -> bool:
        """Stop the thread and wait for it (at most *timeout_s*); whether it stopped.

        Generations still active end with an error.  A thread that does not stop
        in time is inside llama.cpp and may still touch the context.
        """
        with self._wakeup:
            self._stopping = True
            self._wakeup.notify_all()
            thread = self._thread
        if thread is None:
            return True
        thread.join(timeout_s)
        return not thread.is_alive()

    def _check_open(self) -> None:
        """Raise unless the loop takes new work (call with ``_wakeup`` held)."""
        refusal = self._refusal()
        if refusal is not None:
            raise refusal

    def _refusal(self) -> EngineFailure | None:
        """Why the loop takes no new work, or None (call with ``_wakeup`` held)."""
        if self._failed:
            return EngineFailure(LOOP_FAILED, fatal=True)
        if self._stopping:
            return EngineFailure("the engine is closed")
        return None

    def _start_thread(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="bubo-decode", daemon=True)
            self._thread.start()

    # ---- the decode thread -------------------------------------------------------------------

    def _run(self) -> None:
        """The thread's body: serve until stopped; on any escaping failure, end everything it held."""
        try:
            self._serve()
            self._close_down()
        except BaseException as error:  # noqa: BLE001 - the one guard: nothing may end this thread silently
            self._fail_everything(error)

    def _serve(self) -> None:
        while True:
            with self._wakeup:
                while not (
                    self._arrivals or self._active or self._idle_jobs or self._calls or self._stopping
                ):
                    self._wakeup.wait()
                if self._stopping:
                    break
                self._taken_calls, self._calls = self._calls, []
                self._taken_arrivals, self._arrivals = self._arrivals, []
                idle = not (self._taken_arrivals or self._active)
                self._idle_job = self._idle_jobs.popleft() if idle and self._idle_jobs else None
            for call in self._taken_calls:
                self._run_call(call)
            for member in self._taken_arrivals:
                self._admit(member)
            if self._taken_arrivals and self._park_idle:
                self._park_idle_sequences()
            if self._idle_job is not None:
                self._run_idle(self._idle_job)
                continue
            try:
                self._step()
            except Exception as error:  # noqa: BLE001 - a bug in a step: end what it held, keep serving
                self._step_failed(error)

    def _step_failed(self, error: Exception) -> None:
        logger.error("a decode step failed; its generations end with an error", exc_info=error)
        for member in self._active:
            member.generation.cache.clear()
        self._end_all(error)

    def _close_down(self) -> None:
        """Stopped: what is still active, arriving or posted ends with the closed engine's error."""
        closed = EngineFailure("the engine was closed while generating")
        with self._wakeup:
            self._taken_arrivals, self._arrivals = self._arrivals, []
            jobs = [*self._calls, *self._idle_jobs]
            self._calls, self._idle_jobs = [], collections.deque()
        for job in jobs:
            job.refuse(EngineFailure("the engine was closed"))
        self._active.extend(self._taken_arrivals)
        self._end_all(closed)

    def _fail_everything(self, error: BaseException) -> None:
        """The guard: end every generation, arrival and job with an error, refuse new work, report the loss.

        Each end is delivered whatever happens to the others: this runs after
        a bug, so nothing here may rely on the state it left.
        """
        logger.critical("the decode thread failed; the engine is lost", exc_info=error)
        try:  # first: the engine must know it is lost before any request hears of its end
            self._lose(EngineFailure(f"{LOOP_FAILED}: {error!r}", fatal=True))
        except Exception:
            logger.exception("the engine could not be told it is lost")
        with self._wakeup:
            self._failed = True
            jobs = [*self._taken_calls, *self._calls, *self._idle_jobs]
            if self._idle_job is not None:
                jobs.append(self._idle_job)
            arrivals = [*self._taken_arrivals, *self._arrivals]
            self._calls, self._arrivals = [], []
            self._idle_jobs.clear()
            self._wakeup.notify_all()
        for job in jobs:  # those that ended already are left alone
            try:
                job.refuse(EngineFailure(LOOP_FAILED))
            except Exception:
                logger.exception("a job's end could not be delivered")
        members = [m for m in dict.fromkeys([*self._active, *arrivals]) if not m.over]
        self._active = []
        for member in members:
            try:
                member.generation.close()
            except Exception:  # noqa: BLE001, S110 - its sampler leaks; the end is still delivered
                pass
            finally:
                self._end_quietly(member, EngineFailure("the engine failed on its decode thread"))

    @staticmethod
    def _end_quietly(member: _Member, error: BaseException) -> None:
        try:
            DecodeLoop._end(member, error)
        except Exception:
            logger.exception("a generation's end could not be delivered")

    def _admit(self, member: _Member) -> None:
        if member.generation.cancelled:
            self._end(member, None)
            return
        if self._fatal is not None:
            self._end(member, self._fatal)
            return
        try:
            member.generation.start()
        except Exception as error:  # noqa: BLE001 - the request's own failure (a grammar, a prompt)
            member.generation.close()
            self._end(member, error)
            return
        self._active.append(member)

    def _park_idle_sequences(self) -> None:
        """Move every idle slot's sequence to a host-RAM snapshot and free its cells.

        Cells an active generation shares stay (they are its own too); only
        the idle sequence's hold on them goes.  A sequence larger than the
        whole snapshot budget stays in place.
        """
        active = {member.generation.cache.seq_id for member in self._active}
        for cache in self._context.caches:
            if cache.seq_id not in active and cache.tokens:
                cache.park()

    def _step(self) -> None:
        self._drop_cancelled()
        if not self._active:
            return
        batch = self._next_batch()
        images = [(member, entry) for member, entry in batch if entry.image is not None]
        if len(images) < len(batch):
            self._decode_text([(member, entry) for member, entry in batch if entry.image is None])
        for member, entry in images:
            if member in self._active:  # a failure in the text batch may have ended it
                self._decode_image(member, entry)

    def _decode_text(self, batch: list[tuple[_Member, BatchEntry]]) -> None:
        """Evaluate the step's tokens in one ``llama_decode`` and hand each generation its part."""
        timed = self._drafting is not None and len(batch) == 1 and not batch[0][0].generation.prefilling
        cells = _cells_attended(entry for _, entry in batch)
        started = time.perf_counter()
        try:
            self._context.use_adapters(batch[0][0].generation.adapters)
            starts = self._context.decode_batch([entry for _, entry in batch])
        except ContextFull:
            self._make_room([member for member, _ in batch])
            return
        except EngineFailure as failure:
            self._decode_failed(failure, [member for member, _ in batch])
            return
        took = time.perf_counter() - started
        self._prefill.observe(sum(len(entry.tokens) for _, entry in batch), took, cells=cells)
        if logger.isEnabledFor(logging.DEBUG):
            self._log_step(batch, took)
        if timed and self._drafting is not None:  # the drafting policy models one generation's steps
            self._drafting.observe_decode(len(batch[0][1].tokens), took)
        for (member, entry), start in zip(batch, starts, strict=True):
            self._evaluated(member, entry, start)

    def _decode_image(self, member: _Member, entry: BatchEntry) -> None:
        """Encode and evaluate one prompt's image, alone (the projector decodes its own batches).

        Its time is not the prefill budget's evidence: an image's cost is the encoder's, not per token.
        """
        try:
            self._context.use_adapters(member.generation.adapters)
            index = self._context.decode_image(entry)
        except ContextFull:
            self._make_room([member])
            return
        except EngineFailure as failure:
            self._decode_failed(failure, [member])
            return
        self._evaluated(member, entry, index)

    def _evaluated(self, member: _Member, entry: BatchEntry, index: int) -> None:
        try:
            member.generation.evaluated(entry, index)
        except Exception as error:  # noqa: BLE001 - a bug fails its own request only
            self._fail(member, error)
            return
        if member.generation.done:
            self._active.remove(member)
            self._end(member, None)

    def _log_step(self, batch: list[tuple[_Member, BatchEntry]], took: float) -> None:
        """One line a step: what it carried and what it cost (the prefill budget's evidence)."""
        reading = [len(entry.tokens) for member, entry in batch if member.generation.prefilling]
        streams = sum(len(entry.tokens) for member, entry in batch if not member.generation.prefilling)
        cost = self._prefill.step_cost()
        logger.debug(
            "step %d: %d stream token(s), %d prompt token(s) %s, %.1f ms; fitted: %s",
            self._steps, streams, sum(reading), reading, took * 1000.0, cost or "none",
        )  # fmt: skip

    def _drop_cancelled(self) -> None:
        for member in [m for m in self._active if m.generation.cancelled]:
            member.generation.close()
            self._active.remove(member)
            self._end(member, None)

    def _next_batch(self) -> list[tuple[_Member, BatchEntry]]:
        """Every generating request's token, then the prompts' shares of the step's room, oldest first.

        Only the requests under one LoRA adapter set: that of the one served longest ago.
        """
        alone = len(self._active) == 1
        adapters = min(self._active, key=lambda member: member.served).generation.adapters
        members = [member for member in self._active if member.generation.adapters == adapters]
        batch = [
            (member, member.generation.token_entry(alone=alone))
            for member in members
            if not member.generation.prefilling
        ]
        reading = [member for member in members if member.generation.prefilling]
        if reading:
            batch.extend(self._prompt_chunks(reading, streams=[entry for _, entry in batch]))
        self._steps += 1
        for member, _ in batch:
            member.served = self._steps
        return batch

    def _prompt_chunks(
        self, reading: list[_Member], streams: list[BatchEntry]
    ) -> list[tuple[_Member, BatchEntry]]:
        """The prompts' shares of the room the prefill budget gives the step beside *streams*."""
        n_decoding = sum(len(entry.tokens) for entry in streams)
        room = self._prefill.room(
            n_decoding,
            streams_cells=_cells_attended(streams),
            prompt_at=max(len(member.generation.cache.tokens) for member in reading),
        )
        room = min(room, self._context.n_batch - n_decoding)
        shares = share_room([member.generation.prompt_left for member in reading], room)
        return [
            (member, member.generation.prompt_entry(share))
            for member, share in zip(reading, shares, strict=True)
            if share > 0
        ]

    def _decode_failed(self, failure: EngineFailure, in_batch: list[_Member]) -> None:
        """A fatal failure ends every generation, now and later; another only those in the batch."""
        if failure.fatal:
            self._lose(failure)
            self._end_all(failure)
            return
        for member in in_batch:
            self._fail(member, failure)

    def _make_room(self, in_batch: list[_Member]) -> None:
        """The shared context is full: free idle slots' sequences, else end one of the batch.

        Idle slots' tokens go first (to a host-RAM snapshot when they are worth
        one): those holding cells of their own, or, when every idle slot's cells
        are shared, all of them (cells another request uses stay theirs).  Then
        one request fails with a 503 ``context_full`` and the others go on: the
        newest still reading its prompt (it has sent nothing yet), else the
        generation holding the most tokens.  A generation is failed rather than
        ended as if it had reached its limit: ``finish_reason: "length"`` and a
        short ``predicted_n`` would tell its client that it got what it asked
        for, where the room was taken by other requests (llama-server fails
        every running request here, with "Context size has been exceeded").
        A generation running alone did fill the context itself: it ends as at
        the context's end (``length``), as llama-server's slot limit ends it.
        """
        active = {member.generation.cache.seq_id for member in self._active}
        idle = [cache for cache in self._context.caches if cache.seq_id not in active and cache.tokens]
        idle = [cache for cache in idle if cache.private_cells] or idle
        if idle:
            for cache in idle:
                cache.evict()
            return
        prefilling = [member for member in in_batch if member.generation.prefilling]
        if prefilling:
            victim = prefilling[-1]
            victim.generation.cache.clear()
        else:
            victim = max(in_batch, key=lambda member: len(member.generation.cache.tokens))
            victim.generation.cache.evict()
            if len(self._active) == 1:  # it alone filled the context: it reached the context's end
                victim.generation.finish(StopCause.CONTEXT)
                self._active.remove(victim)
                self._end(victim, None)
                return
        self._fail(
            victim,
            ServiceUnavailable(
                "Context size has been exceeded: the KV cache the slots share is full; "
                "retry when other requests have finished",
                code="context_full",
                headers={"Retry-After": "1"},
            ),
        )

    @staticmethod
    def _run_call(job: Job) -> None:
        job.execute()  # its end, result or error, goes to its poster

    def _run_idle(self, job: Job) -> None:
        try:
            job.execute()  # an idle job nobody waits for lets its failure out to here
        except EngineFailure as failure:
            if failure.fatal:
                self._lose(failure)
            else:
                logger.warning("idle work failed, the next turn starts cold: %s", failure.message)
        except Exception:  # a bug in idle work costs only the warm-up
            logger.exception("idle work failed unexpectedly; the next turn starts cold")

    def _lose(self, failure: EngineFailure) -> None:
        """A fatal failure: every later generation is refused with it, and the engine hears once."""
        if self._fatal is None:
            self._fatal = failure
            self._on_lost(failure)

    def _fail(self, member: _Member, error: BaseException) -> None:
        member.generation.close()
        if not isinstance(error, EngineFailure | ServiceUnavailable):
            member.generation.cache.clear()  # a bug may have left the sequence half-written
        if member in self._active:
            self._active.remove(member)
        self._end(member, error)

    def _end_all(self, error: BaseException) -> None:
        members, self._active = self._active, []
        for member in members:
            member.generation.close()
            self._end(member, error)

    @staticmethod
    def _end(member: _Member, error: BaseException | None) -> None:
        member.over = True
        member.ended(error)


def _cells_attended(entries: Iterable[BatchEntry]) -> int:
    """The cells the entries' tokens attend to, together (what a step's attention costs by)."""
    return sum(attended_cells(len(entry.cache.tokens), len(entry.tokens)) for entry in entries)
