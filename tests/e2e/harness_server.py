"""A real Bubo server process whose faults the end-to-end tests inject through files.

Usage: python tests/e2e/harness_server.py --port N --control DIR  (settings from BUBO_* variables)

It is ``bubo serve`` with the real model and Hypercorn, plus four switches a
test flips by creating files in DIR:

- ``decode-fails``: every ``llama_decode`` returns -3, what llama.cpp returns
  when the device's compute fails (a lost GPU context): the engine is lost;
- ``prefill-delay``: a number of seconds each ``llama_decode`` of more than one
  token (a prompt chunk; generation decodes one token a step) sleeps first, in
  the decode thread: a prompt read as slowly as a long one on a busy CPU, on
  any machine (the keep-alive tests);
- ``load-fails``: loading the model raises (so recovery keeps retrying);
- ``memory.json``: ``{"available_bytes": …, "limit_bytes": …}`` replaces the
  system's memory reading for the memory guard.

Nothing here is part of Bubo; it replaces llama.cpp's decode function and the
memory probe from the outside, as a fault injector would.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import llama_cpp
import trio
from hypercorn.config import Config
from hypercorn.trio import serve

from bubo._logging import configure_logging
from bubo.config import Settings, load_settings
from bubo.loader import load_runtime
from bubo.server import create_app
from bubo.service.memory import MemoryReading, SystemMemory
from bubo.service.runtime import Runtime

DEVICE_LOST_STATUS = -3


@attrs.frozen
class FileMemory:
    """The memory reading in ``memory.json`` when it exists, else the system's."""

    path: Path

    def read(self) -> MemoryReading:
        try:
            values = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return SystemMemory().read()
        return MemoryReading(available_bytes=values["available_bytes"], limit_bytes=values["limit_bytes"])


def failing_decode(original: Callable[..., int], switch: Path) -> Callable[..., int]:
    def decode(*args: Any) -> int:
        return DEVICE_LOST_STATUS if switch.exists() else original(*args)

    return decode


def slowed_prefill(original: Callable[..., int], switch: Path) -> Callable[..., int]:
    def decode(ctx: Any, batch: Any) -> int:
        if batch.n_tokens > 1:
            try:
                seconds = float(switch.read_text())
            except (OSError, ValueError):
                seconds = 0.0
            time.sleep(seconds)
        return original(ctx, batch)

    return decode


def loader(control: Path) -> Callable[[Settings, Callable[[float], None]], Runtime]:
    def load(settings: Settings, progress: Callable[[float], None]) -> Runtime:
        if (control / "load-fails").exists():
            raise RuntimeError("the harness was told to fail loading")
        runtime = load_runtime(settings, progress)
        assert runtime.memory_guard is not None
        guard = attrs.evolve(runtime.memory_guard, probe=FileMemory(control / "memory.json"))
        return attrs.evolve(runtime, memory_guard=guard)

    return load


async def main_async(port: int, control: Path) -> None:
    settings = load_settings()
    configure_logging(settings.log_level)
    slowed = slowed_prefill(llama_cpp.llama_decode, control / "prefill-delay")
    llama_cpp.llama_decode = failing_decode(slowed, control / "decode-fails")
    app = create_app(settings, load=loader(control))
    config = Config()
    config.bind = [f"127.0.0.1:{port}"]
    config.errorlog = logging.getLogger("hypercorn.error")
    config.graceful_timeout = 5

    async def until_signalled() -> None:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for _ in signals:
                return

    await serve(app, config, shutdown_trigger=until_signalled)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--control", type=Path, required=True)
    args = parser.parse_args()
    trio.run(main_async, args.port, args.control)
    return 0


if __name__ == "__main__":
    sys.exit(main())
