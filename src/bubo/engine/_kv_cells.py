"""One sequence's cells in llama.cpp's KV memory and the mirror of their tokens: every native call on them.

:class:`KvCells` is the prompt cache's executor.  It drops, moves and shares
cells (``llama_memory_*``), copies the sequence's state out and back
(``llama_state_seq_*``), and keeps beside them what llama.cpp does not say:
the tokens the cells hold, in order, the LoRA adapter set they were computed
under, how far they are exact after a context shift, where ``--cache-reuse``
first moved some, and (in the :class:`~._cells.CellLedger` every sequence of
the context shares) which cells another sequence holds too.  What to keep and
where a prefix comes from is :class:`~._kv.SequenceCache`'s choice; see
:mod:`._kv` for the rules these calls carry out.

Only the decode thread calls in, except the reads documented as safe from
another thread (:attr:`KvCells.n_tokens`, :meth:`KvCells.head`).
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Sequence

import llama_cpp

from ._cells import CellLedger
from ._kv_plan import Move
from .lora import NO_ADAPTERS, AdapterSet

__all__ = ["KvCells"]

logger = logging.getLogger(__name__)


class KvCells:
    """Sequence *seq_id* of a context: its cells, the tokens they hold, and the calls that change them.

    Its token list mirrors what llama.cpp holds in the sequence; the slot reads
    it (:class:`~.slots.TokenMirror`) from the trio thread.
    """

    def __init__(self, ctx: object, memory: object, seq_id: int, *, ledger: CellLedger | None) -> None:
        """*ledger*: the cells of every sequence of the context (one of its own when not given)."""
        self._ctx = ctx
        self._memory = memory
        self.seq_id = seq_id
        self.ledger = ledger if ledger is not None else CellLedger()
        self.tokens: list[int] = []
        self.adapters: AdapterSet = NO_ADAPTERS  # the LoRA adapter set its cells were computed under
        self.version = 0  # changes whenever the sequence does (idle work checks it is still current)
        self._exact: int | None = None  # after a shift: how many leading cells are exact (None: all)
        self._moved: int | None = None  # the first cell --cache-reuse moved (None: every cell in place)

    @property
    def n_tokens(self) -> int:
        """How many tokens are held (safe to read from another thread: the list's length, no copy)."""
        return len(self.tokens)

    def head(self, n: int) -> list[int]:
        """The first *n* tokens held, copied in one C call (safe to read from another thread)."""
        return self.tokens[:n]

    def extend(self, tokens: Sequence[int]) -> None:
        """Record *tokens* as evaluated after the cached ones."""
        self.tokens.extend(tokens)
        self.ledger.extend(self.seq_id, len(tokens))
        self.version += 1

    @property
    def private_cells(self) -> int:
        """Cells no other sequence holds: what giving this one up frees."""
        return self.ledger.private(self.seq_id)

    @property
    def n_exact(self) -> int:
        """How many leading cells are exact (all, unless a context shift moved some)."""
        return len(self.tokens) if self._exact is None else self._exact

    @property
    def n_shareable(self) -> int:
        """How many leading cells another sequence may share: exact, and none moved by ``--cache-reuse``."""
        return self.n_exact if self._moved is None else min(self.n_exact, self._moved)

    @property
    def shifted(self) -> bool:
        """Whether a context shift left cells that are not exact (they are dropped before reuse)."""
        return self._exact is not None

    def truncate(self, keep: int) -> int:
        """Drop everything after the first *keep* tokens; return how many remain."""
        if keep < len(self.tokens) and not llama_cpp.llama_memory_seq_rm(self._memory, self.seq_id, keep, -1):
            self.clear()  # this memory cannot drop a suffix (recurrent state): start afresh
            return 0
        if keep < len(self.tokens):
            del self.tokens[keep:]
            self.ledger.truncate(self.seq_id, keep)
            self.version += 1
        if self._exact is not None and self._exact >= len(self.tokens):
            self._exact = None
        if self._moved is not None and self._moved >= len(self.tokens):
            self._moved = None
        return len(self.tokens)

    def can_shift(self) -> bool:
        """Whether this memory can move cells to other positions (not a recurrent or sliding-window one)."""
        return bool(llama_cpp.llama_memory_can_shift(self._memory))

    def shift(self, n_keep: int, n_discard: int) -> int:
        """Drop *n_discard* tokens after the first *n_keep*; move the later cells down to close the gap.

        Return how many were dropped: more than asked when a cell to move is
        shared with another sequence (a cell has one position for all its
        sequences), then every cell up to the last shared one goes.  The first
        *n_keep* cells stay exact; the moved ones are not (see :mod:`._kv`).
        """
        n_past = len(self.tokens)
        if n_keep < 0 or not 0 < n_discard <= n_past - n_keep:
            raise ValueError(f"cannot discard {n_discard} of {n_past} tokens after the first {n_keep}")
        n_discard = max(n_discard, self.ledger.shared_end(self.seq_id, n_keep + n_discard) - n_keep)
        llama_cpp.llama_memory_seq_rm(self._memory, self.seq_id, n_keep, n_keep + n_discard)
        llama_cpp.llama_memory_seq_add(self._memory, self.seq_id, n_keep + n_discard, n_past, -n_discard)
        del self.tokens[n_keep : n_keep + n_discard]
        self.ledger.shift(self.seq_id, n_keep, n_discard)
        self._exact = n_keep if self._exact is None else min(self._exact, n_keep)
        self.version += 1
        return n_discard

    def _drop_inexact(self) -> None:
        """Forget the cells a shift moved: they must not be reused as if evaluated in place."""
        if self._exact is not None:
            self.truncate(self._exact)
            self._exact = None

    def _move(self, moves: Sequence[Move], prompt: Sequence[int], keep: int) -> int:
        """Move the runs ``--cache-reuse`` found after the first *keep* cells into place; the count held.

        Each run's cells move down to their place in the prompt (``llama_memory_seq_rm`` of the
        cells between, ``llama_memory_seq_add`` of the run); the cells after the last go.  The
        moved cells become the sequence's own and are never shared.
        """
        for move in moves:
            llama_cpp.llama_memory_seq_rm(self._memory, self.seq_id, move.to, move.start)
            llama_cpp.llama_memory_seq_add(
                self._memory, self.seq_id, move.start, move.end, move.to - move.start
            )
        held = moves[-1].to + moves[-1].end - moves[-1].start
        llama_cpp.llama_memory_seq_rm(self._memory, self.seq_id, held, -1)
        logger.debug("cache reuse: %d tokens moved after a %d-token prefix", held - keep, keep)
        self.tokens[:] = prompt[:held]
        self.ledger.moved(self.seq_id, keep, held - keep)
        self._moved = keep if self._moved is None else min(self._moved, keep)
        self.version += 1
        return held

    def _share(self, peer: KvCells, start: int, end: int, prompt: Sequence[int]) -> int:
        """Take *peer*'s cells ``[start, end)`` (this sequence holds ``[0, start)``); how many it took.

        The cells gain this sequence's id (``llama_memory_seq_cp`` on a unified cache), nothing is copied.
        """
        llama_cpp.llama_memory_seq_cp(self._memory, peer.seq_id, self.seq_id, start, end)
        self.tokens.extend(prompt[start:end])
        self.ledger.share(peer.seq_id, self.seq_id, start, end)
        self.version += 1
        return end - start

    def _state_size(self) -> int:
        """The bytes a copy of the sequence's state takes."""
        return int(llama_cpp.llama_state_seq_get_size(self._ctx, self.seq_id))

    def _state(self) -> ctypes.Array[ctypes.c_uint8] | None:
        """A copy of the sequence's state in host memory (None if llama.cpp could not write it)."""
        size = self._state_size()
        data: ctypes.Array[ctypes.c_uint8] = (ctypes.c_uint8 * size)()
        written = llama_cpp.llama_state_seq_get_data(self._ctx, data, size, self.seq_id)
        if written != size:
            logger.warning("could not snapshot the sequence state (%d of %d bytes)", written, size)
            return None
        return data

    def _set_state(
        self,
        data: ctypes.Array[ctypes.c_uint8],
        tokens: Sequence[int],
        adapters: AdapterSet,
        moved: int | None,
    ) -> int:
        """Replace the sequence with state *data* holding *tokens*; its size (0: llama.cpp refused it)."""
        self.clear()
        read = llama_cpp.llama_state_seq_set_data(self._ctx, data, len(data), self.seq_id)
        if read != len(data):
            logger.warning("could not restore a sequence snapshot (%d of %d bytes)", read, len(data))
            self.clear()
            return 0
        self.tokens = list(tokens)
        self.ledger.replace(self.seq_id, len(self.tokens))
        self.adapters = adapters
        self._moved = moved
        self._exact = None
        self.version += 1
        return len(data)

    def discard_uncommitted(self) -> None:
        """Drop whatever lies past the recorded tokens (a failed batch may have written some)."""
        if not llama_cpp.llama_memory_seq_rm(self._memory, self.seq_id, len(self.tokens), -1):
            self.clear()

    def clear(self) -> None:
        """Forget the whole sequence."""
        llama_cpp.llama_memory_seq_rm(self._memory, self.seq_id, -1, -1)
        self.tokens.clear()
        self.ledger.truncate(self.seq_id, 0)
        self._exact = None
        self._moved = None
        self.version += 1
