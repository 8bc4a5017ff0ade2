"""How a request's images stand in its prompt: numbered markers, and stand-in ids for their positions."""

from __future__ import annotations

import hashlib

from tests._linear import assert_linear

from bubo.domain.media import (
    DEFAULT_MEDIA_MARKER,
    image_marker,
    new_media_marker,
    split_at_images,
    stand_in_ids,
    without_markers,
)

MARKER = "<__media_0123456789abcdef"


class TestMarkers:
    def test_each_request_has_its_own(self) -> None:
        assert new_media_marker() != new_media_marker()

    def test_the_text_is_split_where_each_image_stands_whatever_their_order(self) -> None:
        text = f"a{image_marker(MARKER, 1)}b{image_marker(MARKER, 0)}c"
        assert split_at_images(text, MARKER) == (["a", "b", "c"], [1, 0])

    def test_what_only_looks_like_a_marker_stays_text(self) -> None:
        """llama.cpp's marker, the request's without a number, or with something else, are text."""
        text = f"{DEFAULT_MEDIA_MARKER} {MARKER}__> {MARKER}_x__> {MARKER}_12 {image_marker(MARKER, 7)}!"
        pieces, order = split_at_images(text, MARKER)
        assert order == [7]
        assert pieces == [f"{DEFAULT_MEDIA_MARKER} {MARKER}__> {MARKER}_x__> {MARKER}_12 ", "!"]

    def test_llama_cpp_s_marker_places_images_in_order(self) -> None:
        text = f"x{DEFAULT_MEDIA_MARKER}y{DEFAULT_MEDIA_MARKER}"
        assert split_at_images(text, DEFAULT_MEDIA_MARKER) == (["x", "y", ""], [0, 1])

    def test_replaced_for_display(self) -> None:
        text = f"look {image_marker(MARKER, 0)} and {image_marker(MARKER, 1)}"
        assert without_markers(text, MARKER, "<image>") == "look <image> and <image>"

    def test_splitting_is_linear_in_the_text(self) -> None:
        """A text full of near-markers (no closing) costs one pass."""
        assert_linear(lambda n: f"{MARKER}_1234" * n, lambda text: split_at_images(text, MARKER), 2_000)


class TestStandIns:
    def test_are_negative_32_bit_ids_one_per_position(self) -> None:
        ids = stand_in_ids(hashlib.sha256(b"a").digest(), 300)
        assert len(ids) == 300
        assert all(-(2**31) <= token <= -1 for token in ids)

    def test_the_same_image_gives_the_same_ids_another_differs_from_the_first(self) -> None:
        a, b = hashlib.sha256(b"a").digest(), hashlib.sha256(b"b").digest()
        assert stand_in_ids(a, 16) == stand_in_ids(a, 16)
        assert stand_in_ids(a, 16)[0] != stand_in_ids(b, 16)[0]
        assert stand_in_ids(a, 4) == stand_in_ids(a, 16)[:4]
