"""Prompt-lookup drafting: propose the tokens that followed the last n-gram before.

Agents resend and edit text the context already holds (code, documents), so
the tokens after an earlier occurrence of the last few tokens are a good guess
for what comes next.  The index maps each n-gram to where it last ended, kept
up to date token by token, so a proposal costs a few dictionary lookups.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["PromptLookup"]


class PromptLookup:
    """Drafts from the context's own history (prompt and generated tokens)."""

    def __init__(self, tokens: Sequence[int], *, draft_max: int, ngram_min: int, ngram_max: int) -> None:
        self._draft_max = draft_max
        self._sizes = range(ngram_max, ngram_min - 1, -1)
        self._tokens: list[int] = []
        self._last_end: dict[tuple[int, ...], int] = {}  # n-gram -> where its latest occurrence ended
        self._earlier: dict[int, int] = {}  # n -> where the current suffix's previous occurrence ended
        for token in tokens:
            self.append(token)

    def append(self, token: int) -> None:
        """Add a token that is now part of the context."""
        tokens = self._tokens
        tokens.append(token)
        end = len(tokens)
        for size in self._sizes:
            if end < size:
                self._earlier.pop(size, None)
                continue
            key = tuple(tokens[end - size : end])
            previous = self._last_end.get(key)
            if previous is None:
                self._earlier.pop(size, None)
            else:
                self._earlier[size] = previous
            self._last_end[key] = end

    def propose(self) -> tuple[list[int], int]:
        """Up to ``draft_max`` tokens that followed the longest matching n-gram, and its size.

        ``([], 0)`` when the last tokens never occurred before.
        """
        for size in self._sizes:
            start = self._earlier.get(size)
            if start is not None:
                return self._tokens[start : start + self._draft_max], size
        return [], 0
