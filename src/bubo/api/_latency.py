"""Bubo's latency histograms (llama-server has none), fed by the service's request timelines.

One :class:`LatencyHistograms` per app (in :class:`~bubo.api._context.ApiContext`,
so it outlives a model reload); ``GET /metrics`` registers it in the scrape's
own registry, so no metric object is global.  Bucket bounds in seconds, for
local inference (docs/llama-server.md, "Latency histograms", says why).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import Histogram
from prometheus_client.core import Metric

from bubo.service.latency import Outcome

__all__ = [
    "INTER_TOKEN_BUCKETS",
    "QUEUE_WAIT_BUCKETS",
    "REQUEST_DURATION_BUCKETS",
    "TIME_TO_FIRST_TOKEN_BUCKETS",
    "LatencyHistograms",
]

# Measured on two CPU cores with SmolLM2-135M: a short chat's first token in 50-190 ms, its tokens 10-20 ms
# apart, a 64-token reply in 1-2.5 s.  The bounds reach down for faster hardware and drafted tokens (which
# arrive together), and up for long prompts evaluated on a CPU, deep queues and long agent turns.
TIME_TO_FIRST_TOKEN_BUCKETS = (
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0, 640.0,
)  # fmt: skip
INTER_TOKEN_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5, 5.0,
)  # fmt: skip
QUEUE_WAIT_BUCKETS = (
    0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0, 640.0,
)  # fmt: skip
REQUEST_DURATION_BUCKETS = (
    0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0, 640.0, 1280.0, 2560.0,
)  # fmt: skip


class LatencyHistograms:
    """The four histograms: a :class:`~bubo.service.latency.LatencyObserver` and a Prometheus collector."""

    def __init__(self) -> None:
        self._time_to_first_token = Histogram(
            "bubo:time_to_first_token_seconds",
            "Time from a request's arrival to its first generated token (queue wait and prefill included)",
            buckets=TIME_TO_FIRST_TOKEN_BUCKETS,
            registry=None,
        )
        self._inter_token = Histogram(
            "bubo:inter_token_latency_seconds",
            "Time between two consecutive generated tokens of one request",
            buckets=INTER_TOKEN_BUCKETS,
            registry=None,
        )
        self._queue_wait = Histogram(
            "bubo:queue_wait_seconds",
            "Time a request waited for a slot",
            buckets=QUEUE_WAIT_BUCKETS,
            registry=None,
        )
        self._request_duration = Histogram(
            "bubo:request_duration_seconds",
            "Time from a request's arrival until it finished, failed or its client left, by outcome",
            labelnames=("outcome",),
            buckets=REQUEST_DURATION_BUCKETS,
            registry=None,
        )
        for outcome in Outcome:  # every outcome is exposed from the start, at zero
            self._request_duration.labels(outcome=outcome.value)

    def observe_queue_wait(self, seconds: float) -> None:
        """A request got the slot after waiting *seconds*."""
        self._queue_wait.observe(seconds)

    def observe_time_to_first_token(self, seconds: float) -> None:
        """A request's first token came *seconds* after its arrival."""
        self._time_to_first_token.observe(seconds)

    def observe_inter_token(self, seconds: float) -> None:
        """A token came *seconds* after the request's previous one."""
        self._inter_token.observe(seconds)

    def observe_request(self, seconds: float, outcome: Outcome) -> None:
        """A request ended, *seconds* after its arrival."""
        self._request_duration.labels(outcome=outcome.value).observe(seconds)

    def collect(self) -> Iterator[Metric]:
        """The four families; without prometheus-client's ``_created`` samples, which say nothing here."""
        for histogram in (
            self._time_to_first_token,
            self._inter_token,
            self._queue_wait,
            self._request_duration,
        ):
            for metric in histogram.collect():
                metric.samples = [s for s in metric.samples if not s.name.endswith("_created")]
                yield metric
