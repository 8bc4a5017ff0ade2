"""A native call that hangs, for fault-injection tests: it blocks its thread until the test lets it go."""

from __future__ import annotations

import threading
from types import TracebackType
from typing import Self

import trio
import trio.testing

WAIT_S = 10  # for a thread to reach the call: a bound on the test's own wait, never an assertion on time


class HangingCall:
    """Call it on the thread that should hang; leave its ``with`` block to let every call return."""

    def __init__(self, result: object = None) -> None:
        self.result = result
        self.stuck = threading.Event()
        self.release = threading.Event()
        self.returned = 0

    def __call__(self) -> object:
        self.stuck.set()
        self.release.wait()
        self.returned += 1
        return self.result

    async def wait_stuck(self) -> None:
        """Return once a thread hangs in the call and every trio task waits (their deadlines are set)."""
        assert await trio.to_thread.run_sync(self.stuck.wait, WAIT_S)
        await trio.testing.wait_all_tasks_blocked()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, _type: type[BaseException] | None, _error: BaseException | None, _tb: TracebackType | None
    ) -> None:
        self.release.set()  # at teardown: no thread outlives the test
