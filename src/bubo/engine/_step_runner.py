"""One decode step run: ``llama_decode`` over the planned batch, and what a failed decode does.

The text entries are evaluated in one ``llama_decode``, then each image alone
(the projector decodes its own batches).  Each generation then takes its part
through :meth:`~._roster.Roster.evaluated`, the one seam between decoding and
what a generation does with its logits (sampling, and each token's stops,
events and hand-over).  The step's time is the evidence the prefill budget
and the drafting policy learn from.

The bookkeeping of the tokens sampled in the step before that waited
(:class:`~._roster.Settling`) runs beside the step's first decode, on the
:class:`~._beside.Beside` thread (or at once, before it, without one), and is
joined before anything else here touches a generation: the generations it
ended are handed over, and take no part in the step's results.

A decode that fails ends the generations it concerns: a fatal failure (a lost
device) every generation, now and later; another the batch's generations; a
full KV cache makes room (:meth:`StepRunner._make_room`).

Decode thread only; written against :mod:`._protocols`.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Callable

from ._batch_planner import cells_attended
from ._beside import Beside
from ._draft_policy import DraftPolicy
from ._prefill_budget import PrefillBudget
from ._protocols import BatchEntry, ContextFull, DecodeContext
from ._roster import Member, Roster, Settling
from .errors import EngineFailure

__all__ = ["StepRunner"]

logger = logging.getLogger("bubo.engine._decode_loop")  # the step log's name, as docs/operations.md gives it

Batch = list[tuple[Member, BatchEntry]]


class StepRunner:
    """Decodes a planned batch in the context and hands each generation its result."""

    def __init__(
        self,
        context: DecodeContext,
        roster: Roster,
        *,
        prefill: PrefillBudget,
        drafting: DraftPolicy | None,
        hold: Callable[[], contextlib.AbstractContextManager[None]] = contextlib.nullcontext,
        beside: Beside | None = None,
    ) -> None:
        """*hold*: what the generations take their results under (the courier's hold of its queue).

        *beside*: the thread unsettled tokens are taken on during the decode (None: at once, before it).
        """
        self._context = context
        self._roster = roster
        self._prefill = prefill
        self._drafting = drafting
        self._hold = hold
        self._beside = beside or Beside()  # never started: its work runs at once

    def run(self, batch: Batch, *, step: int) -> None:
        """Evaluate *batch* (the *step*-th): its text in one decode, then each of its images alone."""
        settling = self._roster.settling()
        images = [(member, entry) for member, entry in batch if entry.image is not None]
        if len(images) < len(batch):
            text = [(member, entry) for member, entry in batch if entry.image is None] if images else batch
            self._decode_text(text, step, settling)
        elif settling.members:  # no text to decode beside: settle now
            self._settle(settling)
        for member, entry in images:
            if member in self._roster.members:  # a failure in the text batch may have ended it
                self._decode_image(member, entry)

    def _settle(self, settling: Settling) -> None:
        """Take *settling*'s tokens now (no decode in this step to take them beside)."""
        self._settle_held(settling)
        self._roster.settled(settling)

    def _decode_text(self, batch: Batch, step: int, settling: Settling) -> None:
        """Evaluate the step's tokens in one ``llama_decode`` and hand each generation its part.

        The tokens *settling* holds are taken beside the decode, and joined before anything else.
        """
        timed = self._drafting is not None and len(batch) == 1 and not batch[0][0].generation.prefilling
        cells = cells_attended(entry for _, entry in batch)
        if settling.members:
            self._beside.hand(functools.partial(self._settle_held, settling))
        failure: ContextFull | EngineFailure | None = None
        started = time.perf_counter()
        try:
            self._context.use_adapters(batch[0][0].generation.adapters)
            starts = self._context.decode_batch([entry for _, entry in batch])
        except (ContextFull, EngineFailure) as error:
            failure = error
        finally:
            took = time.perf_counter() - started
            if settling.members:
                self._beside.join()
                self._roster.settled(settling)
        if failure is not None:
            self._decode_refused(failure, [member for member, _ in batch if not member.over])
            return
        self._prefill.observe(sum(len(entry.tokens) for _, entry in batch), took, cells=cells)
        if logger.isEnabledFor(logging.DEBUG):
            self._log_step(batch, took, step)
        if timed and self._drafting is not None:  # the drafting policy models one generation's steps
            self._drafting.observe_decode(len(batch[0][1].tokens), took)
        with self._hold():  # the step's events go to trio together, as the last generation is done
            for (member, entry), start in zip(batch, starts, strict=True):
                if not member.over:  # else a late stop string ended it
                    self._roster.evaluated(member, entry, start)

    def _settle_held(self, settling: Settling) -> None:
        """Take *settling*'s tokens under the courier's hold (on whichever thread runs it)."""
        with self._hold():  # their events go to trio together
            settling.run()

    def _decode_refused(self, failure: ContextFull | EngineFailure, in_batch: list[Member]) -> None:
        """The decode failed: make room in a full cache, or end whom the failure concerns.

        *in_batch*: the batch's generations a late stop string did not end meanwhile.
        """
        if not isinstance(failure, ContextFull):
            self._decode_failed(failure, in_batch)
        elif in_batch:  # else every one ended: nothing is left to make room for
            self._make_room(in_batch)

    def _decode_image(self, member: Member, entry: BatchEntry) -> None:
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
        self._roster.evaluated(member, entry, index)

    def _log_step(self, batch: Batch, took: float, step: int) -> None:
        """One line a step: what it carried and what it cost (the prefill budget's evidence)."""
        reading = [len(entry.tokens) for member, entry in batch if member.generation.prefilling]
        streams = sum(len(entry.tokens) for member, entry in batch if not member.generation.prefilling)
        cost = self._prefill.step_cost()
        logger.debug(
            "step %d: %d stream token(s), %d prompt token(s) %s, %.1f ms; fitted: %s",
            step, streams, sum(reading), reading, took * 1000.0, cost or "none",
        )  # fmt: skip

    def _decode_failed(self, failure: EngineFailure, in_batch: list[Member]) -> None:
        """A fatal failure ends every generation, now and later; another only those in the batch."""
        if failure.fatal:
            self._roster.lose(failure)
            self._roster.end_all(failure)
            return
        for member in in_batch:
            self._roster.fail(member, failure)

    def _make_room(self, in_batch: list[Member]) -> None:
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
        active = self._roster.seq_ids()
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
            if len(self._roster.members) == 1:  # it alone filled the context: it reached the context's end
                self._roster.reached_context_end(victim)
                return
        self._roster.fail(
            victim,
            ContextFull(
                "Context size has been exceeded: the KV cache the slots share is full; "
                "retry when other requests have finished"
            ),
        )
