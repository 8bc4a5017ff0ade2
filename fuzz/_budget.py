"""Run a Hypothesis test for a bounded time, off the trio thread."""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import hypothesis
import trio

# nox -s fuzz: keep drawing fresh batches of examples until this many seconds have passed.
SECONDS = float(os.environ.get("BUBO_FUZZ_SECONDS", "0"))
# Applied to each harness, not loaded globally: the tests' own Hypothesis profile stays as it is.
PROFILES = {
    "ci": hypothesis.settings(
        max_examples=150, deadline=None, suppress_health_check=[hypothesis.HealthCheck.too_slow]
    ),
    "long": hypothesis.settings(
        max_examples=int(os.environ.get("BUBO_FUZZ_EXAMPLES", "2000")),  # per batch
        deadline=None,
        suppress_health_check=list(hypothesis.HealthCheck),
    ),
}
PROFILE = PROFILES[os.environ.get("BUBO_FUZZ_PROFILE", "ci")]


def _batches(test: Callable[[], None]) -> None:
    deadline = time.monotonic() + SECONDS
    test()  # at least one batch (the profile's max_examples)
    while time.monotonic() < deadline:
        test()


async def run_fuzz(test: Callable[[], None]) -> None:
    """Run *test* (a ``@given`` function) in a worker thread; it may call back with ``trio.from_thread``."""
    await trio.to_thread.run_sync(_batches, PROFILE(test))
