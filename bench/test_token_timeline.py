"""The timeline's arithmetic on a synthetic trace: following a stream, each phase, the gaps' parts."""

from __future__ import annotations

import json

import attrs
import pytest
import timing
import token_timeline
from greedy_concurrency import compare, first_difference

MS = 0.001


def frame(text: str) -> str:
    """One llama-server-style ``/completion`` SSE frame in an HTTP/1.1 chunk, as a traced write holds it."""
    data = f"data: {json.dumps({'content': text, 'stop': False})}\n\n"
    return f"{len(data):x}\r\n{data}\r\n"


def trace() -> dict[str, list[list[object]]]:
    """One stream of three tokens: steps 12 ms apart, each token written 1 ms after its hand-over.

    The third token's hand-over waits 5 ms for trio, after the next decode began.
    """
    decode = [[0.0, 10 * MS, 1], [12 * MS, 22 * MS, 1], [24 * MS, 34 * MS, 1]]
    sample = [[s[1] + 0.2 * MS, s[1] + 0.4 * MS] for s in decode]
    texts = ["Hel", "lo", " you"]
    emit = [[s[1] + 0.5 * MS, 0, i, text] for i, (s, text) in enumerate(zip(decode, texts, strict=True))]
    handed = [0.2 * MS, 0.2 * MS, 5 * MS]
    deliver = [[e[0] + h, e[0] + h + 0.1 * MS, 0, e[2]] for e, h in zip(emit, handed, strict=True)]
    write = [[-1.0, -1.0, 3, "HTTP/1.1 200 \r\n\r\n"]]
    write += [[d[0] + MS, d[0] + 1.1 * MS, 3, frame(text)] for d, text in zip(deliver, texts, strict=True)]
    return {"decode": decode, "sample": sample, "emit": emit, "deliver": deliver, "write": write, "gc": []}


def client(recorded: dict[str, list[list[object]]]) -> list[token_timeline.Piece]:
    """The client read each frame 0.3 ms after its write ended."""
    return [
        (float(w[1]) + 0.3 * MS, t) for w, t in zip(recorded["write"][1:], ["Hel", "lo", " you"], strict=True)
    ]


class TestHolders:
    def test_each_token_is_in_the_piece_holding_its_last_character(self) -> None:
        assert token_timeline.holders(["a", "bc", "", "d"], ["ab", "cd"]) == [0, 1, None, 1]

    def test_pieces_that_spell_another_text_are_an_error(self) -> None:
        with pytest.raises(ValueError, match="spell"):
            token_timeline.holders(["a", "b"], ["ab", "c"])


class TestMatch:
    def test_the_same_text_nearest_in_time(self) -> None:
        texts = {1: ("story", 10.0), 2: ("story", 20.0)}
        candidates = {7: ("story", 19.5), 8: ("story", 9.9), 9: ("other", 10.0)}
        assert token_timeline.match(texts, candidates) == {1: 8, 2: 7}

    def test_a_text_no_candidate_spells_is_left_out(self) -> None:
        assert token_timeline.match({1: ("story", 1.0)}, {7: ("other", 1.0)}) == {}


class TestTokens:
    def test_each_token_has_its_times_at_every_place(self) -> None:
        recorded = trace()
        found = sorted(token_timeline.tokens(recorded, [client(recorded)]), key=lambda t: t.seq)
        assert [t.seq for t in found] == [0, 1, 2]
        last = found[2]
        assert last.decode_start == pytest.approx(24 * MS)
        assert last.sample_start == pytest.approx(34.2 * MS)
        assert last.emit == pytest.approx(34.5 * MS)
        assert last.deliver == pytest.approx(39.5 * MS)
        assert last.write_start == pytest.approx(40.5 * MS)
        assert last.arrival == pytest.approx(40.9 * MS)
        assert last.step_sampling == pytest.approx(0.2 * MS)  # its own sampling, after its step
        assert found[0].step_sampling == pytest.approx(0.2 * MS)

    def test_a_stream_no_client_read_has_no_arrivals(self) -> None:
        found = token_timeline.tokens(trace(), [])
        assert found
        assert all(t.arrival is None and t.write_end is not None for t in found)


class TestPhases:
    def test_each_phase_in_milliseconds(self) -> None:
        recorded = trace()
        table = token_timeline.phase_table(token_timeline.tokens(recorded, [client(recorded)]))
        assert table["llama_decode"]["p50"] == pytest.approx(10.0)
        assert table["sampling"]["mean"] == pytest.approx(0.2)
        assert table["hand-over: decode thread to trio"]["p50"] == pytest.approx(0.2)
        assert table["hand-over: decode thread to trio"]["p99"] > 4.9
        assert table["written to read by the client"]["mean"] == pytest.approx(0.3)

    def test_the_decode_thread_between_steps_less_sampling(self) -> None:
        found = token_timeline.tokens(trace(), [])
        assert token_timeline.between_steps(found, 1) == pytest.approx([1.8, 1.8])
        assert token_timeline.between_steps(found, 4) == []

    def test_from_the_hand_over_to_the_next_decode(self) -> None:
        found = token_timeline.tokens(trace(), [])
        assert token_timeline.after_hand_over(found) == pytest.approx([1.5, 1.5])

    def test_frames_written_before_the_next_decode(self) -> None:
        """Both pairs: written 1.8 ms after the decode's end, 2 ms before the next began."""
        found = token_timeline.tokens(trace(), [])
        assert token_timeline.written_before_next_decode(found) == 1.0
        slow = [t if t.seq else attrs.evolve(t, write_end=12.5 * MS) for t in found]
        assert token_timeline.written_before_next_decode(slow) == 0.5

    def test_a_hand_over_after_the_next_decode_began_is_late(self) -> None:
        """Only the third token waited past a step, and it has no next step: none of two pairs was late."""
        found = token_timeline.tokens(trace(), [])
        assert token_timeline.handed_over_late(found) == 0.0
        slow = [t if t.seq else attrs.evolve(t, deliver=13 * MS) for t in found]
        assert token_timeline.handed_over_late(slow) == 0.5


class TestGapParts:
    def test_the_parts_add_up_to_the_gap(self) -> None:
        recorded = trace()
        parts = token_timeline.gap_parts(token_timeline.tokens(recorded, [client(recorded)]))
        assert len(parts) == 2
        for part in parts:
            total = sum(part[key] for key in token_timeline.GAP_PARTS)
            assert total == pytest.approx(part["gap"])
        assert parts[1]["delivery change"] == pytest.approx(4.8)  # the slow hand-over
        assert parts[0]["llama_decode"] == pytest.approx(10.0)

    def test_the_tail_is_the_slowest_gaps_against_all(self) -> None:
        parts = [
            {"gap": float(g), "llama_decode": 10.0, "delivery change": float(g - 10)} for g in range(10, 30)
        ]
        for part in parts:
            part |= {"sampling": 0.0, "decode thread Python": 0.0}
        tail = token_timeline.tail(parts)
        assert tail["gap"]["tail, mean"] == pytest.approx(29.0)  # 95th percentile of 10..29 is 28.05
        assert tail["delivery change"]["all, median"] == pytest.approx(9.5)
        assert tail["llama_decode"]["tail, mean"] == pytest.approx(10.0)

    def test_collections_inside_gaps_by_thread(self) -> None:
        parts = [{"gap": 1.0, "at": 0.0, "until": 1.0}, {"gap": 9.0, "at": 1.0, "until": 10.0}]
        passes = [[5.0, 5.1, 2, "MainThread"], [0.2, 0.3, 0, "bubo-decode"]]
        shares = token_timeline.collections_during(parts, passes)
        assert shares["trio thread, all gaps"] == 0.5
        assert shares["trio thread, slowest 5 %"] == 1.0
        assert shares["decode thread, slowest 5 %"] == 0.0


class TestPercentile:
    def test_interpolates_as_p95_does(self) -> None:
        values = [float(v) for v in range(21)]
        assert timing.percentile(values, 95) == pytest.approx(timing.p95(values))
        assert timing.percentile([1.0, 3.0], 50) == pytest.approx(2.0)
        assert timing.percentile([4.0, 1.0, 2.0], 100) == 4.0

    def test_bad_input_is_an_error(self) -> None:
        with pytest.raises(ValueError, match="no values"):
            timing.percentile([], 50)
        with pytest.raises(ValueError, match="outside"):
            timing.percentile([1.0], 101)

    def test_summary(self) -> None:
        assert timing.summary([]) == {}
        assert timing.summary([2.0, 4.0]) == pytest.approx({"p50": 3.0, "p95": 3.9, "p99": 3.98, "mean": 3.0})


class TestGreedyComparison:
    def test_first_difference(self) -> None:
        assert first_difference("abc", "abc") is None
        assert first_difference("abc", "abd") == 2
        assert first_difference("ab", "abc") == 2

    def test_compare_counts_the_texts_that_differ(self) -> None:
        assert compare(["a", "b", "c"], ["a", "x", "cc"]) == (2, [0, 1])
