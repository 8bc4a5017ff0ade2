"""How many prompt tokens a decode step carries, and how the prompts being read share them.

With no stream decoding, a prompt is read in the largest batches the context
takes: nobody waits on the step.  Beside decoding streams every step still
carries each stream's next token, so the step's length is the streams'
inter-token gap; the prompt's part is then sized from the measured cost of a
step so that the step stays under the target gap (``--prefill-gap-ms``).

A step's cost is fitted to recent steps (least squares on the relative
error, with exponential forgetting) as a fixed part, a part per token, and a
part per cell attended to: every token attends over the cells of its sequence
before it, so a token late in a long prompt costs more than an early one (on
a 2-core CPU, about twice as much 2,400 tokens in).  Without that third part
the rising cost as a prompt is read looked like a growing fixed part, and the
steps grew to several times the target as the prompt went on.  The fixed
part is what a step costs however many tokens it carries (measured: ~35 ms
on that CPU, close to a three-stream step alone).

Two floors hold whatever the target says; there the gap gives way instead of
the prompt.  A step carries at least ``min_chunk`` prompt tokens (half of
llama.cpp's micro-batch, 256 at the default ``--ubatch-size``): smaller
batches read each token slower on a CPU (measured in the server on 2 cores,
Qwen2.5-Coder-0.5B, beside three streams: a prompt's first 2,048 tokens took
1.07-1.34x the time of one whole batch in the 60-310-token chunks a 500 ms
target gave, median 1.23 over 9 rounds; in chunks of 256, 1.02-1.24x, median
1.10 over 6).  Where the streams' own part of a step (the fixed part and their
tokens) is a large part of the step (a slow or loaded machine), the prompt's
part is at least ``PROMPT_OVER_STREAMS`` times the streams' part, so reading
it beside streams takes at most about 1/``PROMPT_OVER_STREAMS`` longer than
alone.  A fixed ``--prefill-chunk N`` takes N tokens a step whoever else runs.

Several prompts read at once share the step's room: each gets at least an
even share of half of it, and the rest goes oldest first, so the oldest
finishes soonest and none waits for all the others to end.

Pure arithmetic on the decode thread's own measurements: tested alone.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import attrs

__all__ = [
    "DEFAULT_GAP_S",
    "DEFAULT_MIN_CHUNK",
    "PROMPT_OVER_STREAMS",
    "PrefillBudget",
    "StepCost",
    "attended_cells",
    "share_room",
]

DEFAULT_GAP_S = 0.5  # the streams' inter-token gap a prompt read beside them may stretch to
DEFAULT_MIN_CHUNK = 256  # prompt tokens a step carries beside streams at least (half the default micro-batch)
PROMPT_OVER_STREAMS = 9.0  # the prompt's part of a step is at least this many times the streams' part
FORGETTING = 0.9  # weight of a step's measurement after each later one
TIMED_S = 1e-6  # a step measured shorter than this was not seen by the clock: no measurement
_NO_LIMIT = float(2**31)  # tokens: more than any batch
_SINGULAR = 1e-6  # a pivot this small in the scaled system: the steps are too alike to tell the parts apart


def attended_cells(position: int, n_tokens: int) -> int:
    """Cells *n_tokens* tokens placed from *position* on attend to together (each its own and all before)."""
    return n_tokens * position + n_tokens * (n_tokens + 1) // 2


@attrs.frozen
class StepCost:
    """A step's seconds: ``fixed + per_token * tokens + per_cell * cells attended to``."""

    fixed: float
    per_token: float
    per_cell: float = 0.0

    def of(self, tokens: float, cells: float) -> float:
        """Seconds a step of *tokens* tokens attending to *cells* cells takes."""
        return self.fixed + self.per_token * tokens + self.per_cell * cells

    def __str__(self) -> str:
        per_token_ms, per_cell_us = self.per_token * 1e3, self.per_cell * 1e6
        return f"{self.fixed * 1e3:.1f} ms + {per_token_ms:.2f} ms/token + {per_cell_us:.2f} us/cell"


class PrefillBudget:
    """The prompt tokens each step may carry (decode thread only)."""

    def __init__(
        self,
        *,
        fixed: int | None,
        n_batch: int,
        target_gap_s: float = DEFAULT_GAP_S,
        min_chunk: int = DEFAULT_MIN_CHUNK,
    ) -> None:
        """*fixed*: tokens a step, whatever runs (``--prefill-chunk N``); None sizes them (``auto``).

        *min_chunk*: the fewest prompt tokens a sized step carries beside streams.
        """
        self._fixed = None if fixed is None else max(1, min(fixed, n_batch))
        self._n_batch = n_batch
        self._target = target_gap_s
        self._min_chunk = max(1, min_chunk)
        # weighted sums over recent steps of x = (1, tokens, cells) and seconds t: Σw·x·xᵀ, Σw·x·t
        self._xx = [[0.0] * 3 for _ in range(3)]
        self._xt = [0.0] * 3
        self._largest = 0  # the most tokens a measured step carried (the fit is not trusted far beyond)

    def room(self, n_decoding: int, *, streams_cells: int = 0, prompt_at: int = 0) -> int:
        """Prompt tokens the next step may carry beside *n_decoding* streams' tokens.

        *streams_cells*: the cells the streams' tokens attend to; *prompt_at*: the
        position the prompts being read go on from (the furthest, when several
        are: its tokens cost the most).
        """
        space = self._n_batch - n_decoding
        if self._fixed is not None:
            return min(self._fixed, space)
        if n_decoding == 0:
            return space
        chunk = self._min_chunk
        cost = self.step_cost()
        if cost is not None:
            streams = cost.of(n_decoding, streams_cells)
            # the prompt's part of k tokens: a·k² + b·k, a = per_cell / 2, b = per_token + per_cell·(at + ½)
            a = cost.per_cell / 2.0
            b = cost.per_token + cost.per_cell * (prompt_at + 0.5)
            within_target = math.floor(_root(a, b, streams - self._target))
            over_streams = math.ceil(_root(a, b, -PROMPT_OVER_STREAMS * streams))
            sized = min(max(within_target, over_streams), 2 * self._largest - n_decoding)  # the fit is local
            chunk = max(chunk, sized)
        return min(chunk, space)

    def observe(self, n_tokens: int, seconds: float, *, cells: int = 0) -> None:
        """A step of *n_tokens* tokens, attending to *cells* cells together, took *seconds*.

        Each step weighs by its relative error (1/seconds²): a streams' 50 ms step
        tells as much as a lone read's 14 s one, and those small steps pin the
        fixed part down (by absolute error the long steps decided it alone, and
        their slight curvature read as a fixed part several times too large).
        """
        if seconds < TIMED_S:  # the clock missed it: no measurement
            return
        weight = 1.0 / (seconds * seconds)
        x = (1.0, float(n_tokens), float(cells))
        xt = self._xt
        for i, row in enumerate(self._xx):  # the inner loop written out: this runs every step
            weighted = weight * x[i]
            xt[i] = xt[i] * FORGETTING + weighted * seconds
            row[0] = row[0] * FORGETTING + weighted
            row[1] = row[1] * FORGETTING + weighted * x[1]
            row[2] = row[2] * FORGETTING + weighted * x[2]
        self._largest = max(self._largest, n_tokens)

    def step_cost(self) -> StepCost | None:
        """A step's cost as measured so far; None before any step was timed.

        The fullest model the steps so far can tell apart and that makes sense
        (no cost per token or per cell below zero; a fixed part below zero is
        noise, read as none): fixed, per token and per cell; else without the
        cells; else all cost per token, the safe side.
        """
        xx, xt = self._xx, self._xt
        if xx[0][0] == 0.0 or xx[0][1] == 0.0:  # nothing timed (a clock too coarse saw every step as 0 s)
            return None
        full = _solve(xx, xt)
        if full is not None and full[1] > 0.0 and full[2] >= 0.0:
            return StepCost(max(0.0, full[0]), full[1], full[2])
        two = _solve([row[:2] for row in xx[:2]], xt[:2])
        if two is not None and two[1] > 0.0:
            return StepCost(max(0.0, two[0]), two[1])
        return StepCost(0.0, xt[0] / xx[0][1])  # steps of one size (or noise): all cost per token


def _root(a: float, b: float, c: float) -> float:
    """The positive root of ``a·k² + b·k + c`` (a ≥ 0, b > 0); 0 where c ≥ 0.

    In the form that keeps its digits when ``a`` is tiny beside ``b`` (a fit
    with almost no cost per cell); a root past any batch is capped.
    """
    if c >= 0.0:
        return 0.0
    root = -2.0 * c / (b + math.sqrt(b * b - 4.0 * a * c))
    return root if math.isfinite(root) else _NO_LIMIT


def _solve(matrix: Sequence[Sequence[float]], rhs: Sequence[float]) -> list[float] | None:
    """``matrix · x = rhs`` by Gaussian elimination (columns scaled); None where the steps cannot tell."""
    n = len(rhs)
    scale = [math.sqrt(matrix[i][i]) or 1.0 for i in range(n)]
    rows = [[matrix[i][j] / (scale[i] * scale[j]) for j in range(n)] + [rhs[i] / scale[i]] for i in range(n)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(rows[r][col]))
        if abs(rows[pivot][col]) < _SINGULAR:
            return None
        rows[col], rows[pivot] = rows[pivot], rows[col]
        for r in range(col + 1, n):
            factor = rows[r][col] / rows[col][col]
            for j in range(col, n + 1):
                rows[r][j] -= factor * rows[col][j]
    solution = [0.0] * n
    for i in reversed(range(n)):
        known = sum(rows[i][j] * solution[j] for j in range(i + 1, n))
        solution[i] = (rows[i][n] - known) / rows[i][i]
    return [solution[i] / scale[i] for i in range(n)]


def share_room(needs: Sequence[int], room: int) -> list[int]:
    """Split *room* among prompts needing *needs* (oldest first): a floor each, the rest oldest first."""
    if not needs:
        return []
    floor = room // (2 * len(needs))
    shares = [min(need, floor) for need in needs]
    left = room - sum(shares)
    for i, need in enumerate(needs):
        more = min(need - shares[i], left)
        shares[i] += more
        left -= more
    return shares
