"""StopMatcher: stop strings across token boundaries; held-back prefixes."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from bubo.engine import StopMatcher
from bubo.engine._stops import CHARACTER_OVERRUN, GeneratedText


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
