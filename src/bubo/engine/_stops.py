"""Stop strings: release generated text as soon as it cannot start a stop string."""

from __future__ import annotations

import codecs

__all__ = ["CHARACTER_OVERRUN", "GeneratedText", "StopMatcher"]

_RECENT = 64
# A UTF-8 character is at most four bytes: three more tokens finish one that a token began.
CHARACTER_OVERRUN = 3


class StopMatcher:
    """Find the first stop string in streamed text, holding back possible prefixes.

    ``feed`` returns the text that is safe to release.  Once a stop string
    matches, :attr:`matched` is set, the text before it is released and
    everything from the stop string on is dropped.  "First" means the stop
    string that is complete earliest (then the one that starts earliest), which
    is what streaming one character at a time would find: how the text is cut
    into pieces never changes the result.
    """

    def __init__(self, stops: tuple[str, ...]) -> None:
        self._stops = tuple(s for s in stops if s)
        self._held = ""
        self.matched: str | None = None

    def feed(self, text: str) -> str:
        """Add generated text; return what can be released now."""
        if self.matched is not None:
            return ""
        if not self._stops:
            return text
        pending = self._held + text
        first: tuple[int, int, str] | None = None  # (end, start, stop)
        for stop in self._stops:
            start = pending.find(stop)
            if start != -1 and (first is None or (start + len(stop), start) < first[:2]):
                first = (start + len(stop), start, stop)
        if first is not None:
            _, start, self.matched = first
            self._held = ""
            return pending[:start]
        keep = self._longest_partial(pending)
        self._held = pending[len(pending) - keep :] if keep else ""
        return pending[: len(pending) - keep]

    def flush(self) -> str:
        """The generation ended without a match: release what was held back."""
        held, self._held = self._held, ""
        return held

    def _longest_partial(self, text: str) -> int:
        """Length of the longest suffix of *text* that begins some stop string."""
        best = 0
        for stop in self._stops:
            for size in range(min(len(stop) - 1, len(text)), best, -1):
                if text.endswith(stop[:size]):
                    best = size
                    break
        return best


class GeneratedText:
    """Token bytes in, releasable text out: UTF-8 reassembly, then stop strings.

    A character split across tokens is held until complete; text that may start
    a stop string is held until it cannot.  The bytes of a character the
    generation ended inside are dropped: the text never ends in a U+FFFD that
    the model did not write (invalid bytes within the text are still replaced).
    """

    def __init__(self, stops: tuple[str, ...]) -> None:
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._stops = StopMatcher(stops)
        self.saw_new_line = False
        self.recent = ""  # the last characters decoded, stop strings or not (for markers)

    @property
    def matched(self) -> str | None:
        """The stop string found, if any."""
        return self._stops.matched

    @property
    def inside_character(self) -> bool:
        """Whether the bytes so far end inside a multi-byte character."""
        pending, _ = self._utf8.getstate()
        return bool(pending)

    def may_end(self, overrun: int) -> bool:
        """Whether a generation *overrun* tokens past a limit may end here.

        Not inside a character, unless the tokens that could finish it are spent
        (llama-server too exceeds ``n_predict`` to finish a character).
        """
        return not self.inside_character or overrun >= CHARACTER_OVERRUN

    def feed(self, piece: bytes) -> str:
        """Add one token's bytes; return the text that can be released."""
        text = self._utf8.decode(piece)
        self.saw_new_line = self.saw_new_line or "\n" in text
        self.recent = (self.recent + text)[-_RECENT:]
        return self._stops.feed(text)

    def finish(self) -> str:
        """Generation ended: release what is held (a stop string may still match in it).

        The bytes of an unfinished character are dropped, not replaced.
        """
        self._utf8.reset()
        return "" if self._stops.matched is not None else self._stops.flush()
