"""``bubo serve`` with timers around each step of a token's way out, for bench/timeline.py.

Usage: python bench/traced_serve.py TRACE.json serve -m MODEL ... (every ``bubo serve`` flag)

The server is the real one, in this process, with timers wrapped around what
it calls (nothing in ``src/`` changes): ``llama_cpp.llama_decode`` and
``llama_cpp.llama_sampler_sample`` (the decode thread), the decode thread's
hand-over of each generated token to trio (``Courier.post`` or
``DirectPost.post``, which the producer calls on the decode thread, or on the thread that takes
tokens beside ``llama_decode``) and the moment trio runs it, every
``trio.SocketStream.send_all`` (the bytes as they leave), and the garbage
collector's passes (``gc.callbacks``, with the thread that ran each).  Every
time is ``time.perf_counter()``, the monotonic clock the benchmark's client
reads in its own process.  When the server stops (SIGTERM) the trace is
written to TRACE.json for :mod:`token_timeline` to read.

A timer costs about a microsecond a call: the traced server's own
inter-token gaps are measured beside a plain ``bubo serve``'s in the same run.
``BUBO_BENCH_SWITCH_INTERVAL_MS`` set runs the traced server with that
``sys.setswitchinterval`` (an experiment on the GIL's hand-over between the
decode thread and the event loop; ``bubo serve`` itself keeps Python's 5 ms).
``BUBO_BENCH_POST_AT_DECODE=1`` holds the decode thread's events until it
calls the next ``llama_decode`` (:class:`HeldPosts`): what handing a step's
events over while llama.cpp computes, instead of between two steps, would give.
(The courier experiment this tool ran is now the engine's own ``Courier``.)
"""

from __future__ import annotations

import functools
import gc
import itertools
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs


@attrs.define
class Trace:
    """What the timers saw, in the order it happened (each list appended from one thread at a time)."""

    decode: list[tuple[float, float, int]] = attrs.Factory(list)  # start, end, batch tokens
    sample: list[tuple[float, float]] = attrs.Factory(list)  # start, end
    emit: list[tuple[float, int, int, str]] = attrs.Factory(list)  # time, stream, seq, text
    deliver: list[tuple[float, float, int, int]] = attrs.Factory(list)  # start, end, stream, seq
    write: list[tuple[float, float, int, str]] = attrs.Factory(list)  # start, end, connection, bytes
    gc: list[tuple[float, float, int, str]] = attrs.Factory(list)  # start, end, generation, thread

    def to_json(self) -> dict[str, list[Any]]:
        return attrs.asdict(self)


@attrs.define
class Serials:
    """A number for each object seen, never reused: each is kept alive (an ``id`` is reused once freed)."""

    _seen: dict[int, tuple[object, int]] = attrs.Factory(dict)

    def of(self, thing: object) -> int:
        kept = self._seen.setdefault(id(thing), (thing, len(self._seen)))
        return kept[1]


SWITCH_INTERVAL = "BUBO_BENCH_SWITCH_INTERVAL_MS"
"""Set: the traced server's ``sys.setswitchinterval`` in ms (Python's default is 5 ms)."""

POST_AT_DECODE = "BUBO_BENCH_POST_AT_DECODE"
"""Set to 1: the decode thread's events reach trio only as it calls ``llama_decode`` (an experiment)."""

Undo = Callable[[], None]
CLOCK = time.perf_counter


@attrs.define
class HeldPosts:
    """The experiment of ``BUBO_BENCH_POST_AT_DECODE``: the decode thread's event posts, held in order.

    Held (``hold``), each event's post waits until :meth:`release`, called just
    before the next ``llama_decode``: trio then takes the GIL while llama.cpp
    computes, not between two steps.  Any other post (a generation's end)
    releases what is held first, so the order of everything trio hears is kept.
    """

    hold: bool = False
    _pending: list[tuple[Callable[..., None], tuple[object, ...]]] = attrs.Factory(list)

    def post(self, send: Callable[..., None], *args: object) -> None:
        if self.hold:
            self._pending.append((send, args))
        else:
            send(*args)

    def release(self) -> None:
        pending, self._pending = self._pending, []
        for send, args in pending:
            send(*args)


def install(trace: Trace, held: HeldPosts | None = None) -> Undo:
    """Wrap the timers around the server's calls; returns what takes them off again.

    *held*: the decode thread's event posts go through it (the ``BUBO_BENCH_POST_AT_DECODE`` experiment).
    """
    held = held or HeldPosts()
    undo = [
        _time_llama_cpp(trace, held),
        _time_hand_over(trace, held),
        _time_writes(trace),
        _time_collections(trace),
    ]

    def uninstall() -> None:
        for step in undo:
            step()

    return uninstall


def _time_llama_cpp(trace: Trace, held: HeldPosts) -> Undo:
    """``llama_decode`` and ``llama_sampler_sample``, looked up on the module at each call by the engine."""
    import llama_cpp  # noqa: PLC0415 - imported only once the trace is wanted

    decode, sample = llama_cpp.llama_decode, llama_cpp.llama_sampler_sample

    def timed_decode(ctx: Any, batch: Any) -> Any:
        held.release()
        started = CLOCK()
        try:
            return decode(ctx, batch)
        finally:
            trace.decode.append((started, CLOCK(), batch.n_tokens))

    def timed_sample(chain: Any, ctx: Any, index: int) -> Any:
        started = CLOCK()
        try:
            return sample(chain, ctx, index)
        finally:
            trace.sample.append((started, CLOCK()))

    llama_cpp.llama_decode, llama_cpp.llama_sampler_sample = timed_decode, timed_sample

    def undo() -> None:
        llama_cpp.llama_decode, llama_cpp.llama_sampler_sample = decode, sample

    return undo


def _time_hand_over(trace: Trace, held: HeldPosts) -> Undo:
    """Each generated token's hand-over: when the decode thread queues it for trio, when trio runs it.

    Both ways the loop may post (``--courier``): the courier's queue and the decode thread's direct post.
    """
    from bubo.domain.generation import EngineEvent, TokenGenerated  # noqa: PLC0415
    from bubo.engine._courier import Courier, DirectPost  # noqa: PLC0415

    streams = Serials()  # the decode thread's own
    counters: dict[int, itertools.count[int]] = {}  # each stream's tokens
    originals = {poster: poster.post for poster in (Courier, DirectPost)}

    def timed(queue_it: Callable[..., None]) -> Callable[..., None]:
        def timed_post(poster: object, token: Any, function: Callable[..., object], *args: object) -> None:
            post = functools.partial(queue_it, poster)
            event = args[0] if args else None
            if not isinstance(event, EngineEvent):  # a generation's end: after everything held
                held.release()
                post(token, function, *args)
                return
            if not isinstance(event, TokenGenerated):
                held.post(post, token, function, *args)
                return
            stream = streams.of(getattr(function, "__self__", function))  # the generation's event backlog
            seq = next(counters.setdefault(stream, itertools.count()))
            trace.emit.append((CLOCK(), stream, seq, event.text))

            def delivered(*given: object) -> object:
                started = CLOCK()
                try:
                    return function(*given)
                finally:
                    trace.deliver.append((started, CLOCK(), stream, seq))

            held.post(post, token, delivered, *args)

        return timed_post

    for poster, post in originals.items():
        poster.post = timed(post)  # type: ignore[method-assign]

    def undo() -> None:
        for poster, post in originals.items():
            poster.post = post  # type: ignore[method-assign]

    return undo


def _time_writes(trace: Trace) -> Undo:
    """Every ``send_all`` on a TCP stream (Hypercorn's writes), with its bytes."""
    import trio  # noqa: PLC0415

    send_all = trio.SocketStream.send_all
    connections = Serials()  # the trio thread's own

    async def timed_send_all(self: Any, data: bytes | bytearray | memoryview) -> None:
        started = CLOCK()
        try:
            await send_all(self, data)
        finally:
            trace.write.append((started, CLOCK(), connections.of(self), bytes(data).decode("latin-1")))

    trio.SocketStream.send_all = timed_send_all  # type: ignore[method-assign]

    def undo() -> None:
        trio.SocketStream.send_all = send_all  # type: ignore[method-assign]

    return undo


def _time_collections(trace: Trace) -> Undo:
    """Every pass of the garbage collector, and the thread it ran on."""
    collecting: dict[int, tuple[float, int]] = {}

    def on_gc(phase: str, info: dict[str, int]) -> None:
        thread = threading.current_thread()
        if phase == "start":
            collecting[thread.ident or 0] = (CLOCK(), info["generation"])
        elif (began := collecting.pop(thread.ident or 0, None)) is not None:
            trace.gc.append((began[0], CLOCK(), began[1], thread.name))

    gc.callbacks.append(on_gc)
    return lambda: gc.callbacks.remove(on_gc)


def main() -> int:
    if len(sys.argv) < 3 or sys.argv[2] != "serve":
        sys.exit(__doc__)
    from bubo.cli import main as bubo_main  # noqa: PLC0415

    interval_ms = os.environ.get(SWITCH_INTERVAL)
    if interval_ms:  # an experiment: how long a thread keeps the GIL while another waits for it
        sys.setswitchinterval(float(interval_ms) / 1000)
    trace = Trace()
    held = HeldPosts(hold=os.environ.get(POST_AT_DECODE) == "1")
    uninstall = install(trace, held)
    try:
        return bubo_main(sys.argv[2:])
    finally:
        uninstall()
        Path(sys.argv[1]).write_text(json.dumps(trace.to_json()))


if __name__ == "__main__":
    sys.exit(main())
