"""``bubo serve``'s descriptor budget: the open-file limit raised, the connection cap kept below it."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest

from bubo.transport import FD_RESERVE, ConnectionLimiter


def test_soft_open_file_limit_is_raised_to_the_hard_limit() -> None:
    probe = (
        "import resource; from bubo.transport import raise_open_file_limit; "
        "print(raise_open_file_limit(), resource.getrlimit(resource.RLIMIT_NOFILE)[0])"
    )
    result = subprocess.run(
        ["sh", "-c", 'ulimit -S -n 256 && ulimit -H -n 512 && exec "$0" "$@"', sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert result.stdout.split() == ["512", "512"]


def test_cap_is_kept_below_the_descriptor_limit(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="bubo.transport"):
        limiter = ConnectionLimiter.below_descriptor_limit(1000, 256)
    assert limiter.cap == 256 - FD_RESERVE
    assert "not --max-connections 1000" in caplog.text


def test_cap_as_asked_when_descriptors_suffice(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="bubo.transport"):
        limiter = ConnectionLimiter.below_descriptor_limit(32, 1 << 20)
    assert limiter.cap == 32
    assert not caplog.text
