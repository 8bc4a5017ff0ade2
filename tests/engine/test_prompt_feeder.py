"""What a generation puts into its KV sequence (``PromptFeeder``): the prompt in chunks, then room."""

from __future__ import annotations

from bubo.domain.generation import GenerationRequest
from bubo.domain.media import PlacedImage, PromptImage, stand_in_ids
from bubo.engine._kv_plan import DiskOffer
from bubo.engine._prompt_feeder import PromptFeeder

from ._scripted import ScriptedKv

PROMPT = tuple(range(10, 30))  # 20 tokens


def feeder(
    kv: ScriptedKv,
    *,
    n_ctx: int = 64,
    shift: bool = False,
    bos: int | None = None,
    offer: DiskOffer | None = None,
    **fields,
) -> PromptFeeder:
    request = GenerationRequest(prompt_tokens=fields.pop("prompt", PROMPT), max_new_tokens=None, **fields)
    return PromptFeeder(request, kv, n_ctx=n_ctx, bos=bos, shift=shift, offer=offer)


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

    def test_the_disk_offer_read_for_the_request_goes_to_its_sequence_with_the_prompt(self) -> None:
        offer = DiskOffer(tokens=PROMPT[:12], adapters=(), payload=bytearray(b"state"))
        kv = ScriptedKv()
        feed = feeder(kv, offer=offer)
        feed.reuse()
        feed.reuse()  # handed over once: the feeder does not keep the file's bytes for the generation
        assert kv.offers == [offer, None]

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


def _image(at: int, n_positions: int = 4, seed: int = 1) -> PlacedImage:
    image = PromptImage(
        tokens=stand_in_ids(bytes([seed]) * 32, n_positions),
        start=0,
        n_positions=n_positions,
        digest="",
        handle=object(),
    )
    return PlacedImage(at=at, image=image)


def _with_image(at: int, seed: int = 1) -> tuple[tuple[int, ...], PlacedImage]:
    """PROMPT with a 4-position image's stand-ins in place of its tokens at..at+4."""
    placed = _image(at, seed=seed)
    return (*PROMPT[:at], *placed.image.tokens, *PROMPT[at + 4 :]), placed


class TestAnImage:
    """An image is read whole, alone, and never kept by half."""

    def test_is_a_chunk_of_its_own_whatever_the_room(self) -> None:
        prompt, placed = _with_image(6)
        kv = ScriptedKv()
        feed = feeder(kv, prompt=prompt, images=(placed,))
        feed.reuse()
        chunks = []
        while feed.prefilling:
            entry = feed.chunk(5)
            chunks.append((len(entry.tokens), entry.image is not None, entry.last_logits))
            kv.extend(entry.tokens)
            feed.read(len(entry.tokens))
        # the text chunk stops before the image; the image is 4 positions even with room for 5 or for 2
        assert chunks == [(5, False, False), (1, False, False), (4, True, False), (5, False, False),
                          (5, False, True)]  # fmt: skip
        assert kv.tokens == list(prompt)

    def test_with_little_room_is_still_whole(self) -> None:
        prompt, placed = _with_image(0)
        feed = feeder(ScriptedKv(), prompt=prompt, images=(placed,))
        feed.reuse()
        assert feed.next_is_image
        assert len(feed.chunk(1).tokens) == 4

    def test_a_second_turn_over_the_same_image_reuses_it(self) -> None:
        prompt, placed = _with_image(6)
        kv = ScriptedKv(tokens=list(prompt[:15]))
        feed = feeder(kv, prompt=prompt, images=(placed,))
        feed.reuse()
        assert feed.n_cached == 15

    def test_another_image_at_the_same_place_is_read_again(self) -> None:
        cached, _ = _with_image(6, seed=1)
        prompt, placed = _with_image(6, seed=2)
        kv = ScriptedKv(tokens=list(cached))
        feed = feeder(kv, prompt=prompt, images=(placed,))
        feed.reuse()
        assert feed.n_cached == 6

    def test_a_cached_prefix_that_ends_inside_an_image_is_cut_to_its_start(self) -> None:
        prompt, placed = _with_image(6)
        kv = ScriptedKv(tokens=list(prompt[:8]))  # half the image
        feed = feeder(kv, prompt=prompt, images=(placed,))
        feed.reuse()
        assert (feed.n_cached, kv.tokens) == (6, list(prompt[:6]))
        assert feed.next_is_image

    def test_a_prompt_with_an_image_never_shifts(self) -> None:
        prompt, placed = _with_image(6)
        feed = feeder(ScriptedKv(), n_ctx=24, shift=True, prompt=prompt, images=(placed,))
        assert not feed.shifting
        assert not feed.fits(4)
