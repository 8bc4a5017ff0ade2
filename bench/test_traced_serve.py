"""The held-posts experiment: the decode thread's posts wait, in order, until released."""

from __future__ import annotations

from traced_serve import HeldPosts, Serials


class TestHeldPosts:
    def test_held_posts_wait_for_the_release_in_order(self) -> None:
        sent: list[tuple[object, ...]] = []
        held = HeldPosts(hold=True)
        held.post(lambda *args: sent.append(args), "a", 1)
        held.post(lambda *args: sent.append(args), "b", 2)
        assert sent == []
        held.release()
        assert sent == [("a", 1), ("b", 2)]
        held.release()
        assert sent == [("a", 1), ("b", 2)]

    def test_without_holding_a_post_goes_at_once(self) -> None:
        sent: list[tuple[object, ...]] = []
        HeldPosts().post(lambda *args: sent.append(args), "a")
        assert sent == [("a",)]


class TestSerials:
    def test_one_number_per_object_never_reused(self) -> None:
        serials = Serials()
        first, second = object(), object()
        assert [serials.of(first), serials.of(second), serials.of(first)] == [0, 1, 0]
        del first
        assert serials.of(object()) == 2
