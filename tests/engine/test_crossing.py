"""Crossing to the decode thread (``engine/_crossing.py``): every wait ends, a hung job within its bound.

The thread's side is a stand-in: a thread started for each job (as the fake
engine's), a queue nobody takes jobs from, or the real decode loop over a
scripted context that hangs.  Time passes only when a test moves trio's mock
clock, after every task has blocked, so a bound passes exactly when the test
says and never because the machine is slow.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import pytest
import trio
import trio.testing

from bubo.engine._crossing import Job, cross
from bubo.engine.errors import EngineFailure

from ._hang import WAIT_S, HangingCall
from .test_decode_loop import Run

START_S = 60.0
FINISH_S = 300.0


def on_a_thread(job: Job) -> None:
    threading.Thread(target=job.execute, daemon=True).start()


class Held:
    """A queue nobody takes jobs from (a thread busy with its step); the test runs or drops them."""

    def __init__(self) -> None:
        self.jobs: list[Job] = []

    def __call__(self, job: Job) -> None:
        self.jobs.append(job)


@pytest.fixture(name="gate")
def _gate() -> Iterator[HangingCall]:
    with HangingCall(result="written") as call:
        yield call


class Caller:
    """One call of :func:`cross` in a task, and what it ended with."""

    def __init__(self, post: Callable[[Job], None], work: Callable[[], object]) -> None:
        self.post = post
        self.work = work
        self.lost: list[str] = []
        self.result: object = None
        self.error: BaseException | None = None
        self.done = threading.Event()
        self.scope = trio.CancelScope()

    async def run(self) -> None:
        try:
            with self.scope:
                self.result = await cross(
                    self.post,
                    self.work,
                    what="a slot save",
                    start_within_s=START_S,
                    finish_within_s=FINISH_S,
                    lose=self.lost.append,
                )
        except Exception as error:  # noqa: BLE001 - the test looks at it
            self.error = error
        finally:
            self.done.set()

    async def ended(self) -> None:
        """Return once the call has ended, with no more trio time passing (the bound is the test's own)."""
        assert await trio.to_thread.run_sync(self.done.wait, WAIT_S)


async def test_the_result_and_the_error_of_the_work_come_back() -> None:
    lost: list[str] = []
    result = await cross(
        on_a_thread,
        lambda: 42,
        what="work",
        start_within_s=START_S,
        finish_within_s=FINISH_S,
        lose=lost.append,
    )
    assert result == 42
    with pytest.raises(KeyError):
        await cross(
            on_a_thread,
            lambda: {}["missing"],
            what="work",
            start_within_s=START_S,
            finish_within_s=FINISH_S,
            lose=lost.append,
        )
    assert lost == []


async def test_a_refused_job_fails_its_caller_and_only_a_fatal_refusal_loses_the_engine() -> None:
    for fatal in (False, True):
        lost: list[str] = []
        with pytest.raises(EngineFailure) as refused:
            await cross(
                lambda job, fatal=fatal: job.refuse(EngineFailure("closed", fatal=fatal)),
                lambda: pytest.fail("a refused job ran"),
                what="work",
                start_within_s=START_S,
                finish_within_s=FINISH_S,
                lose=lost.append,
            )
        assert refused.value.fatal is fatal
        assert lost == (["closed"] if fatal else [])


class TestAJobThatHangs:
    async def test_fails_its_caller_at_its_bound_and_loses_the_engine(
        self, mock_clock: trio.testing.MockClock, gate: HangingCall
    ) -> None:
        caller = Caller(on_a_thread, gate)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(caller.run)
            await gate.wait_stuck()
            mock_clock.jump(FINISH_S - 1)
            await trio.testing.wait_all_tasks_blocked()
            assert not caller.done.is_set()  # within its bound it waits
            mock_clock.jump(1)
            await caller.ended()
        assert isinstance(caller.error, EngineFailure)
        assert caller.error.fatal
        assert "a slot save did not finish within 300 s; the engine is lost" in caller.error.message
        assert caller.lost == ["a slot save did not finish within 300 s"]

    async def test_a_caller_cancelled_meanwhile_waits_for_it_shielded_then_the_engine_is_lost(
        self, mock_clock: trio.testing.MockClock, gate: HangingCall
    ) -> None:
        """The slot it writes is not handed on while it writes; past the bound the caller fails all the same."""
        caller = Caller(on_a_thread, gate)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(caller.run)
            await gate.wait_stuck()
            caller.scope.cancel()  # the client left
            await trio.testing.wait_all_tasks_blocked()
            assert not caller.done.is_set()
            mock_clock.jump(FINISH_S)
            await caller.ended()
        assert isinstance(caller.error, EngineFailure)
        assert caller.error.fatal
        assert len(caller.lost) == 1

    async def test_a_caller_cancelled_meanwhile_returns_once_it_ends_in_time(self, gate: HangingCall) -> None:
        caller = Caller(on_a_thread, gate)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(caller.run)
            await gate.wait_stuck()
            caller.scope.cancel()
            await trio.testing.wait_all_tasks_blocked()
            assert not caller.done.is_set()
            gate.release.set()
            await caller.ended()
        assert caller.scope.cancelled_caught  # it ends as a cancelled call does
        assert (caller.error, gate.returned, caller.lost) == (None, 1, [])


class TestAJobNotTakenUp:
    async def test_a_cancelled_caller_withdraws_it_and_it_never_runs(self) -> None:
        held = Held()
        ran: list[int] = []
        caller = Caller(held, lambda: ran.append(1))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(caller.run)
            await trio.testing.wait_all_tasks_blocked()
            caller.scope.cancel()
            await caller.ended()
        assert caller.scope.cancelled_caught
        assert (caller.error, caller.lost) == (None, [])
        held.jobs[0].execute()  # the thread gets to it later: nothing happens
        assert ran == []

    async def test_in_time_it_is_withdrawn_and_the_engine_is_lost(
        self, mock_clock: trio.testing.MockClock
    ) -> None:
        """The real loop, stuck in a decode: a slot action it cannot take up fails instead of waiting."""
        run = Run()
        run.context.wedged = threading.Event()
        run.submit(run.sequence(0, prompt=2, generate=3))
        assert await trio.to_thread.run_sync(run.context.stuck.wait, WAIT_S)
        ran: list[int] = []
        caller = Caller(run.loop.post, lambda: ran.append(1))
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(caller.run)
                await trio.testing.wait_all_tasks_blocked()
                mock_clock.jump(START_S)
                await caller.ended()
            assert isinstance(caller.error, EngineFailure)
            assert caller.error.fatal
            assert caller.lost == ["the decode thread did not take up a slot save within 60 s"]
        finally:
            run.context.wedged.set()
        run.wait()  # the loop serves on past the wedge, without running the withdrawn job
        assert run.post(lambda: None)() is None
        run.close()
        assert ran == []
