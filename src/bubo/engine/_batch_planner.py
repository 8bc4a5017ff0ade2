"""Who runs in the next decode step, and with how many tokens.

A step's batch holds the next token of every generating request, then prompt
tokens of the requests still prefilling, as many as the
:class:`~._prefill_budget.PrefillBudget` gives the step beside the streams,
shared among the prompts oldest first with a floor for each
(:func:`~._prefill_budget.share_room`).  Only generations under one LoRA
adapter set share a step (as llama-server batches only slots with the same
adapters): each step serves the set of the generation served longest ago, so
sets take turns, and the budget applies to that set's prompts alone.

Decode thread only; it plans and decodes nothing itself.
"""

from __future__ import annotations

from collections.abc import Iterable

from ._prefill_budget import PrefillBudget, attended_cells, share_room
from ._protocols import BatchEntry, DecodeContext
from ._roster import Member

__all__ = ["BatchPlanner", "cells_attended"]


class BatchPlanner:
    """Builds each step's batch from the active generations, and counts the steps."""

    def __init__(self, context: DecodeContext, prefill: PrefillBudget) -> None:
        self._context = context
        self._prefill = prefill
        self.steps = 0  # steps planned so far (the adapter sets take turns by it)

    def next_batch(self, active: list[Member]) -> list[tuple[Member, BatchEntry]]:
        """Every generating request's token, then the prompts' shares of the step's room, oldest first.

        Only the requests under one LoRA adapter set: that of the one served longest ago.
        """
        alone = len(active) == 1
        adapters = (active[0] if alone else min(active, key=_served)).generation.adapters
        batch: list[tuple[Member, BatchEntry]] = []
        reading: list[Member] = []
        for member in active:  # one pass: this runs every step
            generation = member.generation
            if generation.adapters != adapters:
                continue
            if generation.prefilling:
                reading.append(member)
            else:
                batch.append((member, generation.token_entry(alone=alone)))
        if reading:
            batch.extend(self._prompt_chunks(reading, streams=[entry for _, entry in batch]))
        self.steps += 1
        for member, _ in batch:
            member.served = self.steps
        return batch

    def _prompt_chunks(
        self, reading: list[Member], streams: list[BatchEntry]
    ) -> list[tuple[Member, BatchEntry]]:
        """The prompts' shares of the room the prefill budget gives the step beside *streams*."""
        n_decoding = sum(len(entry.tokens) for entry in streams)
        room = self._prefill.room(
            n_decoding,
            streams_cells=cells_attended(streams),
            prompt_at=max(len(member.generation.cache.tokens) for member in reading),
        )
        room = min(room, self._context.n_batch - n_decoding)
        shares = share_room([member.generation.prompt_left for member in reading], room)
        return [
            (member, member.generation.prompt_entry(share))
            for member, share in zip(reading, shares, strict=True)
            if share > 0
        ]


def _served(member: Member) -> int:
    return member.served


def cells_attended(entries: Iterable[BatchEntry]) -> int:
    """The cells the entries' tokens attend to, together (what a step's attention costs by)."""
    return sum(attended_cells(len(entry.cache.tokens), len(entry.tokens)) for entry in entries)
