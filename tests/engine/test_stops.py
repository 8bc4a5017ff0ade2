"""StopMatcher: stop strings across token boundaries; held-back prefixes; the cost of many stop strings."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bubo.engine import StopMatcher
from bubo.engine._stops import CHARACTER_OVERRUN, GeneratedText, StopAutomaton


class TestStopMatcher:
    def test_no_stops_passes_everything(self) -> None:
        """Without stop strings every piece is released at once."""
        matcher = StopMatcher(())
        assert [matcher.feed(p) for p in ("a", "b")] == ["a", "b"]

    def test_match_across_pieces(self) -> None:
        """A stop string split over pieces is found; text before it is released, the rest dropped."""
        matcher = StopMatcher(("STOP",))
        released = [matcher.feed(p) for p in ("hello S", "TO", "P and more")]
        assert "".join(released) == "hello "
        assert matcher.matched == "STOP"

    def test_partial_prefix_is_held_then_released(self) -> None:
        """A possible beginning of a stop string is held until it cannot be one."""
        matcher = StopMatcher(("\n\n",))
        assert matcher.feed("line\n") == "line"
        assert matcher.feed("next") == "\nnext"
        assert matcher.matched is None

    def test_flush_releases_held_text(self) -> None:
        """At the end, held text is released."""
        matcher = StopMatcher(("###",))
        assert matcher.feed("abc#") == "abc"
        assert matcher.flush() == "#"

    def test_earliest_stop_wins(self) -> None:
        """With several stop strings the one complete first ends the text."""
        matcher = StopMatcher(("world", "lo w"))
        assert matcher.feed("hello world") == "hel"
        assert matcher.matched == "lo w"

    def test_a_stop_complete_first_wins_over_one_that_started_earlier(self) -> None:
        """'OaO' starts earlier but 'a' is complete first, as a character stream would see it."""
        matcher = StopMatcher(("a", "OaO"))
        assert matcher.feed("OOaO") == "OO"
        assert matcher.matched == "a"

    @given(
        text=st.text(alphabet="ab\nS TOP", max_size=40),
        cuts=st.lists(st.integers(0, 40), max_size=8),
        stops=st.lists(st.text(alphabet="ab\nSTOP", min_size=1, max_size=4), max_size=3),
    )
    def test_chunking_does_not_matter(self, text: str, cuts: list[int], stops: list[str]) -> None:
        """Feeding the text in any pieces releases the same text as feeding it whole."""

        def run(pieces: list[str]) -> tuple[str, str | None]:
            matcher = StopMatcher(tuple(stops))
            out = "".join(matcher.feed(p) for p in pieces)
            if matcher.matched is None:
                out += matcher.flush()
            return out, matcher.matched

        bounds = sorted({0, len(text), *(c for c in cuts if c <= len(text))})
        pieces = [text[a:b] for a, b in itertools.pairwise(bounds)]
        whole = run([text])
        assert run(pieces) == whole
        released, matched = whole
        if matched is None:
            assert released == text
        else:
            assert text.startswith(released + matched)


class NaiveMatcher:
    """The matcher before the automaton, kept as the oracle: every stop string searched for every piece."""

    def __init__(self, stops: tuple[str, ...]) -> None:
        self._stops = tuple(s for s in stops if s)
        self._held = ""
        self.matched: str | None = None

    def feed(self, text: str) -> str:
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
        keep = 0
        for stop in self._stops:
            for size in range(min(len(stop) - 1, len(pending)), keep, -1):
                if pending.endswith(stop[:size]):
                    keep = size
                    break
        self._held = pending[len(pending) - keep :] if keep else ""
        return pending[: len(pending) - keep]

    def flush(self) -> str:
        held, self._held = self._held, ""
        return held


def _feed_all(matcher: StopMatcher | NaiveMatcher, pieces: list[str]) -> list[str]:
    released = [matcher.feed(piece) for piece in pieces]
    if matcher.matched is None:
        released.append(matcher.flush())
    return released


class TestAutomaton:
    @given(
        pieces=st.lists(st.text(alphabet="abc\n", max_size=6), max_size=12),
        stops=st.lists(st.text(alphabet="abc\n", max_size=5), max_size=6),
    )
    def test_same_as_the_naive_matcher(self, pieces: list[str], stops: list[str]) -> None:
        """Piece by piece, the automaton releases and holds exactly what searching every stop string did."""
        automaton, naive = StopMatcher(tuple(stops)), NaiveMatcher(tuple(stops))
        assert _feed_all(automaton, pieces) == _feed_all(naive, pieces)
        assert automaton.matched == naive.matched

    def test_one_automaton_serves_many_requests(self) -> None:
        """An automaton keeps no state of a match: matchers built on it do not see each other's text."""
        automaton = StopAutomaton(("END", "", "END"))
        assert automaton.stops == ("END",)
        first, second = StopMatcher(automaton), StopMatcher(automaton)
        assert first.feed("the EN") == "the "
        assert second.feed("D") == "D"
        assert first.feed("D") == ""
        assert (first.matched, second.matched) == ("END", None)

    def test_steps_a_character_do_not_grow_with_the_stop_strings(self) -> None:
        """Ten thousand stop strings cost each character what one does; the naive search read them all."""
        text = "the quick brown fox jumps over the lazy dog. " * 40
        pieces = [text[at : at + 3] for at in range(0, len(text), 3)]  # three characters a token
        steps = {}
        for count in (1, 10_000):
            stops = tuple(f"~{index}~" for index in range(count))  # none occurs in the text
            matcher = StopMatcher(stops)
            assert "".join(_feed_all(matcher, pieces)) == text
            steps[count] = matcher.steps
        assert steps[1] == steps[10_000] == len(text)

    def test_steps_stay_linear_on_text_that_keeps_almost_matching(self) -> None:
        """Stop strings that the text keeps starting (a, aa, …, then b) cost at most two steps a character."""
        stops = tuple("a" * size + "b" for size in range(1, 500))
        for repeats in (1_000, 4_000):
            matcher = StopMatcher(stops)
            released = _feed_all(matcher, ["a"] * repeats + ["c"])
            assert "".join(released) == "a" * repeats + "c"
            assert matcher.steps <= 2 * (repeats + 1)

    @pytest.mark.parametrize("count", [16, 64, 256])
    def test_building_is_linear_in_the_stop_strings_total_length(self, count: int) -> None:
        """The failure links cost at most twice the stop strings' total length, even for nested ones."""
        for stops in (
            tuple("a" * size for size in range(1, count + 1)),  # each a prefix and a suffix of the next
            tuple("ab" * size + "c" for size in range(count)),
            tuple(f"{index:x}" * 7 for index in range(count)),
        ):
            total = sum(len(stop) for stop in stops)
            assert StopAutomaton(stops).build_steps <= 2 * total


OWL = "\N{OWL}".encode()  # f0 9f a6 89


class TestGeneratedText:
    def test_a_character_split_across_tokens_is_released_whole(self) -> None:
        """Bytes of a character are held until its last byte arrives."""
        text = GeneratedText(())
        assert [text.feed(OWL[:2]), text.feed(OWL[2:3]), text.feed(OWL[3:])] == ["", "", "\N{OWL}"]

    def test_the_end_inside_a_character_drops_its_bytes(self) -> None:
        """A generation that ends inside a character ends before it, not with U+FFFD."""
        text = GeneratedText(())
        assert text.feed(b"owl " + OWL[:2]) == "owl "
        assert text.inside_character
        assert text.finish() == ""

    def test_invalid_bytes_the_model_wrote_are_replaced(self) -> None:
        """A sequence that cannot be a character is still a replacement character."""
        text = GeneratedText(())
        assert text.feed(OWL[:2] + b"x") == "\N{REPLACEMENT CHARACTER}x"

    def test_may_end_past_a_limit_only_outside_a_character(self) -> None:
        """Inside a character a limit waits up to three tokens; outside it ends at once."""
        text = GeneratedText(())
        text.feed(b"a")
        assert text.may_end(0)
        text.feed(OWL[:1])
        assert [text.may_end(overrun) for overrun in range(CHARACTER_OVERRUN + 1)] == [False] * 3 + [True]
        text.feed(OWL[1:])
        assert text.may_end(0)
