"""The decode thread's courier to trio (``engine/_courier.py``): order, one post for all queued, every end.

A stand-in token records each post the courier makes and passes it to the
test's own trio run; it can hold the courier inside its first post, so what
the test queues meanwhile is queued at once, whatever the machine's speed.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import pytest
import trio
import trio.testing

from bubo.domain.modes import CourierMode
from bubo.engine import _courier
from bubo.engine._courier import Courier

from ._hang import WAIT_S


class Token:
    """A trio token stand-in: counts the calls in each post; may hold the first, or fail some."""

    def __init__(self, token: trio.lowlevel.TrioToken, *, hold: bool = False) -> None:
        self.token = token
        self.posts: list[int] = []  # calls each post of the courier carried
        self.hold = hold
        self.entered = threading.Event()  # the courier is inside its first post
        self.release = threading.Event()
        self.failures: list[BaseException] = []  # raised by the next posts, in order

    def run_sync_soon(self, function: Callable[..., object], *args: object) -> None:
        if self.hold:
            self.hold = False
            self.entered.set()
            assert self.release.wait(WAIT_S)
        if self.failures:
            raise self.failures.pop(0)
        calls = args[0] if args and isinstance(args[0], list) else [function]
        self.posts.append(len(calls))
        self.token.run_sync_soon(function, *args)


async def until_heard(heard: list[int], n: int) -> None:
    """Wait (at most ``WAIT_S``) until trio has run *n* of the calls posted."""
    with trio.fail_after(WAIT_S):
        while len(heard) < n:
            await trio.sleep(0.01)


def courier_started() -> Courier:
    courier = Courier(name="test-courier")
    courier.start()
    return courier


async def test_everything_queued_meanwhile_goes_in_one_post_in_order() -> None:
    token = Token(trio.lowlevel.current_trio_token(), hold=True)
    heard: list[object] = []
    done = trio.Event()
    courier = courier_started()
    try:
        courier.post(token, heard.append, "first")
        assert await trio.to_thread.run_sync(token.entered.wait, WAIT_S)
        for index in range(5):  # two generations' events, interleaved, then one's end
            courier.post(token, heard.append, ("a", index))
            courier.post(token, heard.append, ("b", index))
        courier.post(token, heard.append, ("a", "end"))
        courier.post(token, done.set)
        token.release.set()
        await done.wait()
    finally:
        assert courier.stop(WAIT_S)
    expected = ["first", *[(name, i) for i in range(5) for name in "ab"], ("a", "end")]
    assert heard == expected
    assert token.posts == [1, 12]  # the first alone, then all twelve queued while it was posted


async def test_calls_for_different_trio_runs_keep_their_order() -> None:
    real = trio.lowlevel.current_trio_token()
    first, second = Token(real, hold=True), Token(real)  # two runs, as far as the courier can tell
    heard: list[object] = []
    done = trio.Event()
    courier = courier_started()
    try:
        courier.post(first, heard.append, 0)
        assert await trio.to_thread.run_sync(first.entered.wait, WAIT_S)
        for index in range(1, 7):
            courier.post(first if index < 3 or index == 5 else second, heard.append, index)
        courier.post(second, done.set)
        first.release.set()
        await done.wait()
    finally:
        assert courier.stop(WAIT_S)
    assert heard == list(range(7))
    assert (first.posts, second.posts) == ([1, 2, 1], [2, 2])  # one post for each run of calls


async def test_stop_posts_what_was_queued_before_it() -> None:
    token = Token(trio.lowlevel.current_trio_token(), hold=True)
    heard: list[int] = []
    courier = courier_started()
    courier.post(token, heard.append, 0)
    assert await trio.to_thread.run_sync(token.entered.wait, WAIT_S)
    for index in range(1, 4):
        courier.post(token, heard.append, index)
    stopped: list[bool] = []
    stopping = threading.Thread(target=lambda: stopped.append(courier.stop(WAIT_S)))
    stopping.start()
    token.release.set()
    await trio.to_thread.run_sync(stopping.join)
    assert stopped == [True]
    await trio.testing.wait_all_tasks_blocked()  # trio has run what the courier posted
    assert heard == [0, 1, 2, 3]
    courier.post(token, heard.append, 4)  # stopped: straight to trio
    await trio.testing.wait_all_tasks_blocked()
    assert heard == [0, 1, 2, 3, 4]


def test_stop_with_the_trio_run_gone_drops_what_it_holds() -> None:
    async def a_run() -> trio.lowlevel.TrioToken:
        return trio.lowlevel.current_trio_token()

    token = Token(trio.run(a_run), hold=True)  # the run has ended
    heard: list[int] = []
    courier = courier_started()
    courier.post(token, heard.append, 0)
    assert token.entered.wait(WAIT_S)
    courier.post(token, heard.append, 1)
    token.release.set()
    assert courier.stop(WAIT_S)  # the posts failed with RunFinishedError: dropped, nothing waits
    assert heard == []
    assert token.posts == [1, 1]
    courier.post(token, heard.append, 2)  # stopped, and the run gone: dropped


async def test_a_post_that_fails_costs_only_its_own_calls(caplog: pytest.LogCaptureFixture) -> None:
    real = trio.lowlevel.current_trio_token()
    refusing, token = Token(real), Token(real)
    refusing.failures.append(RuntimeError("that run refuses"))
    heard: list[int] = []
    done = trio.Event()
    courier = courier_started()
    try:
        with caplog.at_level(logging.ERROR, logger="bubo.engine._courier"):
            courier.post(refusing, heard.append, 0)
            courier.post(token, heard.append, 1)
            courier.post(token, done.set)
            await done.wait()
    finally:
        assert courier.stop(WAIT_S)
    assert heard == [1]
    assert "could not be posted to trio" in caplog.text


class Escaping(BaseException):
    """Not an Exception: it escapes the courier's handling of one post, to its guard."""


async def test_a_courier_that_fails_hands_everything_after_to_trio_directly(
    caplog: pytest.LogCaptureFixture,
) -> None:
    token = Token(trio.lowlevel.current_trio_token(), hold=True)
    token.failures.append(Escaping())
    heard: list[int] = []
    done = trio.Event()
    courier = courier_started()
    with caplog.at_level(logging.CRITICAL, logger="bubo.engine._courier"):
        courier.post(token, heard.append, 0)  # held, then escapes
        assert await trio.to_thread.run_sync(token.entered.wait, WAIT_S)
        courier.post(token, heard.append, 1)  # queued behind it: the guard posts it
        token.release.set()
        assert await trio.to_thread.run_sync(courier.stop, WAIT_S)  # the thread has ended
        courier.post(token, heard.append, 2)  # and later ones go directly
        courier.post(token, done.set)
        await done.wait()
    assert heard == [1, 2]  # the batch whose post escaped is lost to it; nothing after is
    assert "the courier to trio failed" in caplog.text


def test_a_failing_callback_lets_the_rest_of_its_post_run() -> None:
    heard: list[int] = []

    def fail() -> None:
        raise RuntimeError("a bug on the trio thread")

    with pytest.raises(RuntimeError, match="a bug"):
        _courier._run_in_order(  # what trio runs for one post
            [(heard.append, (0,)), (fail, ()), (heard.append, (1,))]
        )
    assert heard == [0, 1]


def test_a_courier_never_started_posts_directly_and_stops_at_once() -> None:
    heard: list[int] = []

    async def post_and_run() -> None:
        Courier().post(trio.lowlevel.current_trio_token(), heard.append, 0)
        await trio.testing.wait_all_tasks_blocked()

    trio.run(post_and_run)
    assert heard == [0]
    assert Courier().stop(0)


class CountedCondition(threading.Condition):
    """A condition that counts its notifications: how often the courier was woken."""

    notified = 0

    def notify(self, n: int = 1) -> None:
        self.notified += 1
        super().notify(n)


async def test_a_hold_keeps_everything_queued_until_it_ends_then_wakes_the_courier_once() -> None:
    token = Token(trio.lowlevel.current_trio_token())
    heard: list[int] = []
    courier = Courier(name="test-courier")
    courier._ready = woken = CountedCondition(courier._lock)  # the courier waits on its lock
    courier.start()
    try:
        with courier.holding():  # nothing queued: its end wakes nobody
            pass
        assert woken.notified == 0
        with courier.holding():  # held by the trio thread, as the decode thread holds a step's results
            courier.post(token, heard.append, 0)
            await trio.to_thread.run_sync(courier.post, token, heard.append, 1)  # another thread's waits too
            await trio.sleep(0.05)  # time enough for a courier that took it to post it
            assert (woken.notified, token.posts, heard) == (0, [], [])
        assert woken.notified == 1
        await until_heard(heard, 2)
    finally:
        assert courier.stop(WAIT_S)
    assert heard == [0, 1]
    assert token.posts == [2]  # the hold's posts went in one


async def test_a_hold_left_by_an_exception_still_ends_and_its_posts_go() -> None:
    token = Token(trio.lowlevel.current_trio_token())
    heard: list[int] = []
    courier = courier_started()
    try:

        def a_step_with_a_bug() -> None:
            with courier.holding():  # a step's results, and a bug among them
                courier.post(token, heard.append, 0)
                raise KeyError

        with pytest.raises(KeyError):
            a_step_with_a_bug()
        with courier.holding():  # the same hold again, for the next step
            courier.post(token, heard.append, 1)
        await until_heard(heard, 2)
    finally:
        assert courier.stop(WAIT_S)
    assert heard == [0, 1]


async def test_a_hold_on_a_courier_not_running_holds_nothing() -> None:
    heard: list[int] = []
    token = trio.lowlevel.current_trio_token()
    for courier in (Courier(), courier_started()):  # never started; started, then stopped
        courier.stop(WAIT_S)
        with courier.holding():
            courier.post(token, heard.append, len(heard))  # straight to trio: nobody would take it later
        await trio.testing.wait_all_tasks_blocked()
    assert heard == [0, 1]


def test_a_courier_whose_thread_cannot_start_posts_directly(monkeypatch: pytest.MonkeyPatch) -> None:
    courier = Courier()

    def refuse(_thread: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    with monkeypatch.context() as patched:
        patched.setattr(threading.Thread, "start", refuse)
        with pytest.raises(RuntimeError, match="can't start"):
            courier.start()
    heard: list[int] = []

    async def post_and_run() -> None:
        courier.post(trio.lowlevel.current_trio_token(), heard.append, 0)
        await trio.testing.wait_all_tasks_blocked()

    trio.run(post_and_run)
    assert heard == [0]
    assert courier.stop(0)


@pytest.mark.parametrize(
    ("mode", "n_threads", "cpus", "gpu_layers", "enabled"),
    [
        ("auto", 2, 2, False, False),  # llama.cpp computes on every CPU: trio's work would slow it
        ("auto", 4, 2, False, False),  # more threads than CPUs: none free either
        ("auto", 1, 2, False, True),  # a CPU free beside llama.cpp's thread
        ("auto", 8, 8, True, True),  # the layers on a GPU: llama.cpp's threads mostly wait
        ("on", 2, 2, False, True),
        ("off", 1, 16, True, False),
    ],
)
def test_a_courier_is_used_where_a_cpu_is_free_for_it_or_as_told(
    mode: CourierMode, n_threads: int, cpus: int, gpu_layers: bool, enabled: bool
) -> None:
    decision = _courier.decide_courier(mode, n_threads=n_threads, cpus=cpus, gpu_layers=gpu_layers)
    assert decision.enabled is enabled
    assert decision.reason  # the log says why


async def test_direct_posts_reach_trio_in_order_and_hold_nothing() -> None:
    heard: list[int] = []
    done = trio.Event()
    direct = _courier.DirectPost()
    direct.start()
    token = trio.lowlevel.current_trio_token()
    with direct.holding():
        await trio.to_thread.run_sync(lambda: [direct.post(token, heard.append, i) for i in range(3)])
        await trio.testing.wait_all_tasks_blocked()
        assert heard == [0, 1, 2]  # posted as they came, the hold notwithstanding
    direct.post(token, done.set)
    await done.wait()
    assert direct.stop(0)
