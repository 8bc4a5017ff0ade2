"""Stop strings: release generated text as soon as it cannot start a stop string.

All of a request's stop strings are matched by one Aho-Corasick automaton
(:class:`StopAutomaton`), built once per request, in time linear in their total
length, before the generation reaches the decode thread.  The matcher keeps its
state across tokens and reads each character of the generated text once, so a
token costs the same whether the request sent one stop string or the most it
may: one client's stop list costs that client only, never the other streams
the decode thread serves (docs/security.md).
"""

from __future__ import annotations

import codecs
import collections
from collections.abc import Iterable

__all__ = ["CHARACTER_OVERRUN", "GeneratedText", "StopAutomaton", "StopMatcher"]

_RECENT = 64
# A UTF-8 character is at most four bytes: three more tokens finish one that a token began.
CHARACTER_OVERRUN = 3


class StopAutomaton:
    """A request's stop strings as one Aho-Corasick automaton (never changed once built).

    Each node (an index) is a prefix of some stop string: ``goto`` its children
    by character, ``fail`` the node of its longest proper suffix that is also a
    prefix, ``depth`` its length and ``match`` the longest stop string that ends
    it (None: none does).  Node 0 is the empty prefix.  The construction sets
    the failure links breadth-first, which takes time linear in the stop
    strings' total length.  Matchers keep their own state, so one automaton
    may serve several.
    """

    def __init__(self, stops: Iterable[str]) -> None:
        self.stops = tuple(dict.fromkeys(stop for stop in stops if stop))
        goto: list[dict[str, int]] = [{}]
        depth = [0]
        match: list[str | None] = [None]
        for stop in self.stops:
            node = 0
            for char in stop:
                child = goto[node].get(char)
                if child is None:
                    child = len(goto)
                    goto[node][char] = child
                    goto.append({})
                    depth.append(depth[node] + 1)
                    match.append(None)
                node = child
            match[node] = stop
        fail = [0] * len(goto)
        steps = 0
        queue = collections.deque(goto[0].values())  # the root's children fail to the root
        while queue:
            node = queue.popleft()
            for char, child in goto[node].items():
                queue.append(child)
                suffix = fail[node]
                while suffix and char not in goto[suffix]:
                    suffix = fail[suffix]
                    steps += 1
                fail[child] = goto[suffix].get(char, 0)
                steps += 1
                if match[child] is None:  # a stop string that is the node's whole text is the longest
                    match[child] = match[fail[child]]
        self.goto = goto
        self.fail = fail
        self.depth = depth
        self.match = match
        self.build_steps = steps  # failure links set and followed: at most twice the stops' total length

    def __bool__(self) -> bool:
        """Whether there is any stop string to match."""
        return bool(self.stops)


class StopMatcher:
    """Find the first stop string in streamed text, holding back possible prefixes.

    ``feed`` returns the text that is safe to release.  Once a stop string
    matches, :attr:`matched` is set, the text before it is released and
    everything from the stop string on is dropped.  "First" means the stop
    string that is complete earliest (then the one that starts earliest), which
    is what streaming one character at a time would find: how the text is cut
    into pieces never changes the result.

    What is held back is exactly the automaton's state: the longest end of the
    text that begins some stop string.  :attr:`steps` counts the automaton's
    transitions (each character read, each failure link followed): at most two
    a character over the whole generation, whatever the number of stop strings.
    """

    def __init__(self, stops: StopAutomaton | tuple[str, ...]) -> None:
        self._automaton = stops if isinstance(stops, StopAutomaton) else StopAutomaton(stops)
        self._node = 0
        self._held = ""
        self.matched: str | None = None
        self.steps = 0

    def feed(self, text: str) -> str:
        """Add generated text; return what can be released now."""
        if self.matched is not None:
            return ""
        automaton = self._automaton
        if not automaton:
            return text
        goto, fail, match = automaton.goto, automaton.fail, automaton.match
        node, steps = self._node, self.steps
        for at, char in enumerate(text):
            while node and char not in goto[node]:
                node = fail[node]
                steps += 1
            node = goto[node].get(char, 0)
            steps += 1
            stop = match[node]
            if stop is not None:
                self.matched, self.steps = stop, steps
                pending = self._held + text[: at + 1]
                self._held = ""
                return pending[: len(pending) - len(stop)]
        self._node, self.steps = node, steps
        pending = self._held + text
        keep = automaton.depth[node]
        self._held = pending[len(pending) - keep :] if keep else ""
        return pending[: len(pending) - keep]

    def flush(self) -> str:
        """The generation ended without a match: release what was held back."""
        held, self._held = self._held, ""
        self._node = 0
        return held


class GeneratedText:
    """Token bytes in, releasable text out: UTF-8 reassembly, then stop strings.

    A character split across tokens is held until complete; text that may start
    a stop string is held until it cannot.  The bytes of a character the
    generation ended inside are dropped: the text never ends in a U+FFFD that
    the model did not write (invalid bytes within the text are still replaced).
    """

    def __init__(self, stops: StopAutomaton | tuple[str, ...]) -> None:
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
