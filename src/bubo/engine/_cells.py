"""Which KV cells each sequence holds, so that a cell two sequences share counts once.

With the unified KV cache one cell may belong to several sequences:
``llama_memory_seq_cp`` adds a sequence to the cells another one holds at the
same positions, with no copy.  llama.cpp does not say how many cells are in
use, so the cache keeps this ledger beside it: each sequence's cells as runs of
positions, each run named by the *origin* whose evaluation wrote it.  A cell
is an ``(origin, position)`` pair; the cells in use are the distinct pairs over
every sequence.

A sequence writes new cells under an origin of its own, taken afresh whenever
it dropped cells (a truncation, a shift, a clear), so an origin never names two
different cells at one position.  Sharing hands the giver's runs to the taker.

Pure bookkeeping, no native calls, tested alone.  The decode thread writes
it; the counts may be read from another thread (``/metrics``): they copy what
they walk in one C call each, and every sequence is known from the start, so
the map they walk never grows under them.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Collection, Iterable

import attrs

__all__ = ["CellLedger"]


@attrs.define
class _Run:
    start: int
    end: int  # exclusive
    origin: int


@attrs.define
class _Held:
    runs: list[_Run] = attrs.field(factory=list)
    origin: int = -1  # what this sequence writes next under (-1: take a fresh one first)


class CellLedger:
    """The cells of every sequence of one context, as runs of ``(origin, position)``."""

    def __init__(self, seq_ids: Iterable[int] = ()) -> None:
        """*seq_ids*: the context's sequences (others are added when first written)."""
        self._held: dict[int, _Held] = {seq_id: _Held() for seq_id in seq_ids}
        self._origins = itertools.count()

    def _of(self, seq_id: int) -> _Held:
        held = self._held.get(seq_id)
        if held is None:  # a sequence first written now (built only then: this runs every token)
            held = self._held[seq_id] = _Held()
        return held

    def length(self, seq_id: int) -> int:
        """Positions the sequence holds (``[0, length)``)."""
        runs = self._of(seq_id).runs
        return runs[-1].end if runs else 0

    def extend(self, seq_id: int, n_tokens: int) -> None:
        """The sequence evaluated *n_tokens* new cells after those it holds."""
        if n_tokens <= 0:
            return
        held = self._of(seq_id)
        if held.origin < 0:
            held.origin = next(self._origins)
        runs = held.runs
        if runs and runs[-1].origin == held.origin:  # the sequence's last run is its own newest: it grows
            runs[-1].end += n_tokens
        else:
            end = runs[-1].end if runs else 0
            runs.append(_Run(end, end + n_tokens, held.origin))

    def truncate(self, seq_id: int, keep: int) -> None:
        """The sequence dropped every cell at ``keep`` and after."""
        held = self._of(seq_id)
        if keep >= self.length(seq_id):
            return
        runs = [run for run in held.runs if run.start < keep]
        if runs:
            runs[-1] = _Run(runs[-1].start, min(runs[-1].end, keep), runs[-1].origin)
        held.runs = runs
        held.origin = -1  # positions after keep will hold new cells

    def replace(self, seq_id: int, n_tokens: int) -> None:
        """The sequence now holds *n_tokens* cells of its own (restored, or moved by a shift)."""
        self.truncate(seq_id, 0)
        self.extend(seq_id, n_tokens)

    def share(self, giver: int, taker: int, start: int, end: int) -> None:
        """*taker* (holding ``[0, start)``) now holds *giver*'s cells ``[start, end)`` too."""
        self.truncate(taker, start)
        held = self._of(taker)
        for run in self._of(giver).runs:
            lo, hi = max(run.start, start), min(run.end, end)
            if lo < hi:
                held.runs.append(_Run(lo, hi, run.origin))
        held.origin = -1

    def shift(self, seq_id: int, n_keep: int, n_discard: int) -> None:
        """Cells ``[n_keep, n_keep + n_discard)`` dropped, the later ones moved down (now its own)."""
        self.moved(seq_id, n_keep, self.length(seq_id) - n_keep - n_discard)

    def moved(self, seq_id: int, start: int, n_tokens: int) -> None:
        """The sequence now holds *n_tokens* cells from *start* that were moved there (shift, cache reuse).

        They are its own under a fresh origin: a moved cell is not what any sequence evaluated at
        its new position, so it never matches another's.
        """
        self.truncate(seq_id, start)
        self._of(seq_id).origin = -1
        self.extend(seq_id, n_tokens)

    def shared_end(self, seq_id: int, start: int) -> int:
        """The end of the last cell at or after *start* that another sequence holds too (*start* if none)."""
        mine = self._of(seq_id).runs
        last = start
        for other_id, other in self._held.items():
            if other_id == seq_id:
                continue
            for a in mine:
                for b in other.runs:
                    if a.origin == b.origin:
                        hi = min(a.end, b.end)
                        if max(a.start, b.start, start) < hi:
                            last = max(last, hi)
        return last

    def private(self, seq_id: int) -> int:
        """Cells only this sequence holds (what giving it up frees)."""
        return self._distinct() - self._distinct(lambda other: other != seq_id)

    def used(self) -> int:
        """Cells in use, each counted once however many sequences hold it."""
        return self._distinct()

    def used_by(self, seq_ids: Collection[int]) -> int:
        """Cells that any of *seq_ids* holds, each counted once (what evicting the others cannot free)."""
        return self._distinct(lambda seq_id: seq_id in seq_ids)

    def _distinct(self, counts: Callable[[int], bool] = lambda _seq_id: True) -> int:
        spans: dict[int, list[tuple[int, int]]] = {}
        for seq_id, held in list(self._held.items()):
            if not counts(seq_id):
                continue
            for run in list(held.runs):
                spans.setdefault(run.origin, []).append((run.start, run.end))
        total = 0
        for intervals in spans.values():
            intervals.sort()
            reach = -1
            for start, end in intervals:
                if end > reach:
                    total += end - max(start, reach)
                    reach = end
        return total
