"""What a generation puts into its KV sequence (``PromptFeeder``): the prompt in chunks, then room."""

from __future__ import annotations

from bubo.domain.generation import GenerationRequest
from bubo.engine._prompt_feeder import PromptFeeder

from ._scripted import ScriptedKv

PROMPT = tuple(range(10, 30))  # 20 tokens


def feeder(
    kv: ScriptedKv, *, n_ctx: int = 64, shift: bool = False, bos: int | None = None, **fields
) -> PromptFeeder:
    request = GenerationRequest(prompt_tokens=fields.pop("prompt", PROMPT), max_new_tokens=None, **fields)
    return PromptFeeder(request, kv, n_ctx=n_ctx, bos=bos, shift=shift)


class TestThePrompt:
    def test_reading_starts_after_the_cached_prefix(self) -> None:
        kv = ScriptedKv(tokens=[*PROMPT[:8], 99, 98])
        feed = feeder(kv)
        report = feed.reuse()
        assert (feed.n_cached, feed.at, report.hit) == (8, 8, True)
        assert kv.tokens == list(PROMPT[:8])

    def test_without_cache_prompt_everything_is_read(self) -> None:
        kv = ScriptedKv(tokens=list(PROMPT))
        feed = feeder(kv, cache_prompt=False)
        feed.reuse()
        assert feed.n_cached == 0

    def test_is_read_in_chunks_of_the_room_given_logits_only_after_the_last(self) -> None:
        kv = ScriptedKv()
        feed = feeder(kv)
        feed.reuse()
        chunks = []
        while feed.prefilling:
            entry = feed.chunk(8)
            chunks.append((len(entry.tokens), entry.last_logits))
            kv.extend(entry.tokens)
            feed.read(len(entry.tokens))
        assert chunks == [(8, False), (8, False), (4, True)]
        assert feed.processed == 20
        assert kv.tokens == list(PROMPT)


class TestTheContextsEnd:
    def test_without_shifting_a_token_fits_while_the_sequence_has_room(self) -> None:
        feed = feeder(ScriptedKv(), n_ctx=24)
        assert feed.fits(3)  # position 22
        assert not feed.fits(4)

    def test_with_shifting_every_token_fits(self) -> None:
        assert feeder(ScriptedKv(), n_ctx=24, shift=True).fits(1000)

    def test_a_memory_that_cannot_move_cells_does_not_shift(self) -> None:
        feed = feeder(ScriptedKv(shiftable=False), n_ctx=24, shift=True)
        assert not feed.shifting
        assert not feed.fits(4)

    def test_a_full_sequence_keeps_n_keep_and_drops_half_of_the_rest(self) -> None:
        kv = ScriptedKv(tokens=list(range(40)))
        feed = feeder(kv, n_ctx=41, shift=True, n_keep=4)
        feed.make_room()
        assert kv.shifted == [(4, 18)]
        assert (feed.shifts, feed.discarded) == (1, 18)
        feed.make_room()  # room again
        assert feed.shifts == 1

    def test_n_keep_counts_after_a_bos_and_minus_one_keeps_the_prompt(self) -> None:
        kv = ScriptedKv(tokens=list(range(40)))
        feeder(kv, n_ctx=41, shift=True, n_keep=4, bos=10).make_room()  # the prompt starts with the BOS
        assert kv.shifted == [(5, 17)]
        whole = ScriptedKv(tokens=list(range(40)))
        feeder(whole, n_ctx=41, shift=True, n_keep=-1).make_room()
        assert whole.shifted == [(20, 10)]
