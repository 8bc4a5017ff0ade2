"""When a generation ends, and why: one object both engines ask after every generated token.

The rules, in the order they are checked for a token:

- an end-of-generation token ends it (``EOS``; never with ``ignore_eos``);
- ``n_indent``: a line after a new line indented by fewer blanks is cut before
  its first character and ends it (``LIMIT``, as in llama-server);
- the token limit (``LIMIT``), the context's end (``CONTEXT``: no room to
  evaluate the token, or, without a limit, the model's training context) and
  the time limit (``TIME``: only after a new line, as in llama-server).  The
  token and time limits wait for the tokens that finish a character the last
  token began (at most three); the context's end cannot;
- a stop string ends it wherever it matched (``STOP_WORD``), whatever else did.

Text is released as soon as it cannot start a stop string; what is held back
is released when the generation ends another way.  The thinking budget does
not end a generation: once spent it asks for the end of thinking to be
inserted (:attr:`Verdict.insert`).

:meth:`EndPolicy.can_wait` says when a token's verdict may come a step late
(the decode thread then takes it beside the next ``llama_decode``): when only
a stop string could end the generation with it and it cannot ask for an
insertion.

Model-free: the llama.cpp engine (:mod:`._generation`) and the fake engine
(:mod:`.fake`) share it, so the test double cannot drift from the engine.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import NamedTuple

from bubo.domain.generation import GenerationRequest, StopCause, ThinkingBudget

from ._stops import GeneratedText

__all__ = ["EndPolicy", "Verdict"]


class Verdict(NamedTuple):
    """What one generated token does: the text it releases, the end it causes, the tokens to insert next."""

    text: str
    cause: StopCause | None
    insert: tuple[int, ...] = ()


def _always_fits(_n_generated: int) -> bool:
    return True


class EndPolicy:
    """One generation's end rules (see the module's docstring); fed every generated token in order."""

    def __init__(
        self,
        request: GenerationRequest,
        *,
        eog: frozenset[int],
        n_ctx_train: int,
        fits: Callable[[int], bool] = _always_fits,
        shifts: bool = False,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        """*fits(n)*: whether the context has room for the *n*-th token; *shifts*: ``--context-shift``."""
        self._eog = frozenset() if request.ignore_eos else eog
        self._text = GeneratedText(request.stop)
        self._limit = request.max_new_tokens
        self._n_prompt = len(request.prompt_tokens)
        self._n_ctx_train = n_ctx_train
        self._shifts = shifts
        self._fits = fits
        self._time_limit_ms = request.time_limit_ms
        self._clock = clock
        self._indent = _IndentLimit(request.n_indent)
        self._thinking = _ThinkingClock(request.thinking_budget)
        self._waits = not (self._time_limit_ms or self._indent.applies)  # no end but a stop string's is late
        self.n_generated = 0
        self._first_token_at = 0.0
        self._timed_out = 0  # tokens generated since the time limit passed (finishing a character)

    @property
    def stop_word(self) -> str | None:
        """The stop string that ended the generation, if one did."""
        return self._text.matched

    @property
    def nothing_to_generate(self) -> bool:
        """A limit of 0 or less: the prompt is only evaluated into the cache (``LIMIT`` at once)."""
        return self._limit is not None and self._limit <= 0

    @property
    def tokens_left(self) -> int | None:
        """Tokens the limit still allows (None: no limit)."""
        return None if self._limit is None else self._limit - self.n_generated

    def take(self, token: int, piece: bytes) -> Verdict:
        """Account for the next generated (or inserted) *token*, whose bytes are *piece*."""
        self.n_generated += 1
        text, indent = self._text, self._indent
        if token in self._eog:
            cause: StopCause | None = StopCause.EOS
            released = indent.feed(text.finish())[0]
        else:
            released, cut = indent.feed(text.feed(piece))
            cause = StopCause.LIMIT if cut else self._exhausted()
            if cause is not None and text.matched is None and not cut:
                released += indent.feed(text.finish())[0]
        if text.matched is not None:
            return Verdict(released, StopCause.STOP_WORD)
        if cause is not None:
            return Verdict(released, cause)
        return Verdict(released, None, self._thinking.observe(text.recent))

    def can_wait(self, token: int) -> bool:
        """Whether *token*'s verdict may come after the next decode: only its text could end the generation.

        That is: it is no end-of-generation token; the token limit, the
        context's end and the training context are more than this token away;
        neither ``n_indent`` nor a time limit applies (they end by what the
        text does, at a point the caller could not undo); and the thinking
        budget cannot ask for an insertion.  Then taken late, *token* gets the
        verdict it would have got at once, and only a stop string can end the
        generation with it.
        """
        n = self.n_generated + 1
        limit = self._limit
        return (
            self._waits
            and token not in self._eog
            and (limit is None or n < limit)
            and self._fits(n)
            and not ((limit is None or self._shifts) and self._n_prompt + n >= self._n_ctx_train)
            and self._thinking.over
        )

    def flush(self) -> str:
        """The generation ended without an end token (a scripted reply ran out): release what is held."""
        return self._indent.feed(self._text.finish())[0]

    def _exhausted(self) -> StopCause | None:
        n = self.n_generated
        if n == 1:
            self._first_token_at = self._clock()
        limit = self._limit
        if limit is not None and n >= limit and self._text.may_end(n - limit):
            return StopCause.LIMIT
        if not self._fits(n):  # no room to evaluate it
            return StopCause.CONTEXT
        if (limit is None or self._shifts) and self._n_prompt + n >= self._n_ctx_train:
            # without a limit, or shifting (whatever the limit): a generation ends at the training context
            return StopCause.CONTEXT
        if not self._time_limit_ms or not self._text.saw_new_line:
            return None
        if (self._clock() - self._first_token_at) * 1000.0 > self._time_limit_ms:
            self._timed_out += 1
            if self._text.may_end(self._timed_out - 1):
                return StopCause.TIME
        return None


class _IndentLimit:
    """llama-server's ``n_indent``: a line after a new line must be indented by at least that many blanks.

    Fed the released text; returns it cut before the first character of a line
    indented less, and whether it was cut (the generation ends there).
    """

    def __init__(self, n_indent: int) -> None:
        self._n_indent = n_indent
        self._line: int | None = (
            None  # blanks so far on the current line, after a new line; None: not checked
        )

    @property
    def applies(self) -> bool:
        """Whether the request set an indent."""
        return self._n_indent > 0

    def feed(self, text: str) -> tuple[str, bool]:
        if self._n_indent <= 0:
            return text, False
        for at, char in enumerate(text):
            if char == "\n":
                self._line = 0
            elif self._line is None:
                continue
            elif char in " \t":
                self._line += 1
            elif self._line < self._n_indent:
                return text[:at], True
            else:
                self._line = None
        return text, False


class _ThinkingClock:
    """Counts thinking tokens and says when to insert the end of thinking (``ThinkingBudget``)."""

    def __init__(self, spec: ThinkingBudget | None) -> None:
        self._spec = spec
        self._thinking = spec is not None and spec.started
        self._over = spec is None
        self._count = 0

    @property
    def over(self) -> bool:
        """Whether nothing more will be inserted (no budget, or it is spent or thinking ended)."""
        return self._over

    def observe(self, recent: str) -> tuple[int, ...]:
        """After each generated token: the tokens to insert now, if the budget is spent."""
        if self._over:
            return ()
        assert self._spec is not None
        if not self._thinking:
            self._thinking = self._spec.start_text in recent
            return ()
        if self._spec.end_text in recent:
            self._over = True
            return ()
        self._count += 1
        if self._count < self._spec.budget:
            return ()
        self._over = True
        return self._spec.end_tokens
