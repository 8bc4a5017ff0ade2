"""Run a Hypothesis test for a bounded time, off the trio thread."""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import trio

# nox -s fuzz: keep drawing fresh batches of examples until this many seconds have passed.
SECONDS = float(os.environ.get("BUBO_FUZZ_SECONDS", "0"))


def _batches(test: Callable[[], None]) -> None:
    deadline = time.monotonic() + SECONDS
    test()  # at least one batch (the profile's max_examples)
    while time.monotonic() < deadline:
        test()


async def run_fuzz(test: Callable[[], None]) -> None:
    """Run *test* (a ``@given`` function) in a worker thread; it may call back with ``trio.from_thread``."""
    await trio.to_thread.run_sync(_batches, test)
