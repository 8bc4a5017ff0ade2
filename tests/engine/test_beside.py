"""``Beside``: work the decode thread hands over before ``llama_decode``, run on another thread, joined after.

Every join returns: the work finished, it failed (the thread then ends, and
later work runs at once on the caller's thread), or none was handed.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from bubo.engine._beside import Beside

WAIT_S = 5.0


def joined(beside: Beside) -> None:
    """Join *beside*'s work, failing the test (not hanging it) if the join does not return in ``WAIT_S``."""
    joining = threading.Thread(target=beside.join, daemon=True)
    joining.start()
    joining.join(WAIT_S)
    assert not joining.is_alive(), "a join did not return"


@pytest.fixture(name="beside")
def _beside() -> Iterator[Beside]:
    beside = Beside(name="test-beside")
    beside.start()
    yield beside
    assert beside.stop(WAIT_S)


def test_handed_work_runs_on_its_thread_while_the_caller_goes_on(beside: Beside) -> None:
    release, ran_on = threading.Event(), []

    def work() -> None:
        assert release.wait(WAIT_S)  # the caller goes on while it runs (as into llama_decode)
        ran_on.append(threading.current_thread().name)

    beside.hand(work)
    release.set()
    joined(beside)
    assert ran_on == ["test-beside"]


def test_a_join_waits_for_the_work_to_finish(beside: Beside) -> None:
    started, release, finished = threading.Event(), threading.Event(), []

    def work() -> None:
        started.set()
        assert release.wait(WAIT_S)
        finished.append(True)

    beside.hand(work)
    assert started.wait(WAIT_S)
    threading.Timer(0.05, release.set).start()
    joined(beside)
    assert finished == [True]


def test_a_join_with_nothing_handed_returns_at_once(beside: Beside) -> None:
    joined(beside)


def test_work_handed_in_turn_runs_in_turn(beside: Beside) -> None:
    done: list[int] = []
    for i in range(100):
        beside.hand(lambda i=i: done.append(i))
        joined(beside)
    assert done == list(range(100))


def test_without_its_thread_work_runs_at_once_on_the_caller_s() -> None:
    beside = Beside()  # never started
    ran_on: list[str] = []
    beside.hand(lambda: ran_on.append(threading.current_thread().name))
    assert ran_on == [threading.current_thread().name]
    joined(beside)
    assert beside.stop(WAIT_S)


def test_without_a_thread_to_be_had_work_runs_on_the_caller_s(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def refuse(_thread: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Thread, "start", refuse)
    beside = Beside()
    beside.start()  # logged, not raised
    assert "could not start" in caplog.text
    monkeypatch.undo()  # threads again, for the test's own bounded join
    ran_on: list[str] = []
    beside.hand(lambda: ran_on.append(threading.current_thread().name))
    joined(beside)
    assert ran_on == [threading.current_thread().name]
    assert beside.stop(WAIT_S)


def test_work_that_fails_ends_the_thread_and_later_work_runs_on_the_caller_s(
    beside: Beside, caplog: pytest.LogCaptureFixture
) -> None:
    def broken() -> None:
        raise RuntimeError("a bug")

    beside.hand(broken)
    joined(beside)  # returns: the failed work is finished too
    assert "work beside llama_decode failed" in caplog.text
    ran_on: list[str] = []
    beside.hand(lambda: ran_on.append(threading.current_thread().name))
    joined(beside)
    assert ran_on == [threading.current_thread().name]


def test_a_stopped_beside_runs_work_on_the_caller_s_thread(beside: Beside) -> None:
    assert beside.stop(WAIT_S)
    ran_on: list[str] = []
    beside.hand(lambda: ran_on.append(threading.current_thread().name))
    assert ran_on == [threading.current_thread().name]


def test_stop_lets_the_work_handed_finish(beside: Beside) -> None:
    release, finished = threading.Event(), []

    def work() -> None:
        assert release.wait(WAIT_S)
        finished.append(True)

    beside.hand(work)
    threading.Timer(0.05, release.set).start()
    assert beside.stop(WAIT_S)
    assert finished == [True]
