"""Fairness: streams that are decoding while a long prompt arrives, and that prompt's first token.

Three chat streams (``scenarios.story_bodies``: short distinct prompts, the
end-of-generation tokens biased away so none ends early) start together.  Once
each has received ``WARM_TOKENS`` tokens a newcomer arrives, a cold prompt of
~2,400 tokens (``cold_body``: a fresh nonce leads it).  Its prefill is the
window from sending it to its first token; every inter-token gap of the streams
that overlaps that window counts (``timing.gaps_overlapping``: the gap in which
the prefill starts and the one in which it ends included).  The streams are
closed once each has received ``TAIL_TOKENS`` more after the window, so that the
gap in which the window closed is complete.  The same-sized newcomer is also
read with nothing else running, once before all this and once after: the mean
of the two is what "within 10 % of reading its prompt alone" compares with.  A
shared VM's speed drifts by up to ±10 % within a minute, and one lone read just
before put all of that drift into the ratio; a read on each side cancels a
steady drift (both servers are measured the same way).

Neither server reports which tokens each decode step carried, so the gaps as the
client saw them are the measurement.
"""

from __future__ import annotations

import concurrent.futures
import statistics
import threading
import time
from collections.abc import Callable

import attrs
import httpx
import scenarios
import timing

STREAMS = 3
WARM_TOKENS = 8  # each stream's tokens before the newcomer is sent: all are decoding
TAIL_TOKENS = 2  # each stream's tokens after the newcomer's first, before they are closed
MAX_STREAM_TOKENS = 1024  # a bound only: the streams are closed long before
WAIT_S = 600.0  # the longest any phase may take before the round is given up


@attrs.define
class _Tap:
    """One stream's arrival times as they come, and the signal that closes it."""

    stop: threading.Event
    times: list[float] = attrs.Factory(list)

    def __call__(self, at: float) -> bool:
        self.times.append(at)
        return not self.stop.is_set()

    def count_after(self, moment: float) -> int:
        return sum(1 for t in list(self.times) if t > moment)


def fairness(client: httpx.Client, newcomer: str, eog: tuple[int, ...]) -> dict[str, float | list[float]]:
    """The newcomer's TTFT alone and beside three streams, and the streams' gaps while it is read."""
    before_alone = _alone(client, newcomer)
    time.sleep(scenarios.CLIENT_TURN_GAP_S)
    stop = threading.Event()
    taps = [_Tap(stop) for _ in range(STREAMS)]
    bodies = scenarios.story_bodies(STREAMS, MAX_STREAM_TOKENS, eog)

    def one(body: dict, tap: _Tap) -> scenarios.StreamResult:
        with httpx.Client(base_url=str(client.base_url)) as own:
            return scenarios.stream(own, "/v1/chat/completions", body, keep_going=tap)

    with concurrent.futures.ThreadPoolExecutor(STREAMS) as pool:
        futures = [pool.submit(one, body, tap) for body, tap in zip(bodies, taps, strict=True)]
        try:
            _wait_for(lambda: all(len(tap.times) >= WARM_TOKENS for tap in taps), futures)
            late = scenarios.stream(client, "/v1/chat/completions", scenarios.cold_body(newcomer))
            end = late.token_times[0]
            start = end - late.ttft_s
            _wait_for(lambda: all(tap.count_after(end) >= TAIL_TOKENS for tap in taps), futures)
        finally:
            stop.set()
        for future in futures:
            future.result()
    time.sleep(scenarios.CLIENT_TURN_GAP_S)
    after_alone = _alone(client, newcomer)
    alone_s = (before_alone + after_alone) / 2
    during = [timing.gaps_overlapping(tap.times, start, end) for tap in taps]
    before = [gap for tap in taps for gap in timing.gaps([t for t in tap.times if t < start])]
    pooled = [gap for stream_gaps in during for gap in stream_gaps]
    return {
        "fair_alone_ttft_s": alone_s,
        "fair_alone_before_s": before_alone,
        "fair_alone_after_s": after_alone,
        "fair_newcomer_ttft_s": late.ttft_s,
        "fair_newcomer_over_alone": late.ttft_s / alone_s,
        "fair_newcomer_prompt_tokens": late.final.get("usage", {}).get("prompt_tokens", float("nan")),
        "fair_gap_worst_s": max(pooled, default=float("nan")),
        "fair_gaps_s": pooled,
        "fair_gap_before_s": statistics.median(before) if before else float("nan"),
        "fair_streams_outlasted": float(all(timing.outlasted(tap.times, end) for tap in taps)),
    }


def _alone(client: httpx.Client, newcomer: str) -> float:
    """The TTFT of a cold newcomer read with nothing else running."""
    return scenarios.stream(client, "/v1/chat/completions", scenarios.cold_body(newcomer)).ttft_s


def _wait_for(condition: Callable[[], bool], streams: list[concurrent.futures.Future]) -> None:
    """Poll *condition* until it holds or a stream has ended (its error then surfaces)."""
    deadline = time.monotonic() + WAIT_S
    while not condition():
        if any(future.done() for future in streams):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"the fairness round did not get there within {WAIT_S:.0f} s")
        time.sleep(0.01)
