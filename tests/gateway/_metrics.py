"""Counters read from Prometheus text: a replica's ``/metrics`` and the gateway's own endpoint.

A scrape is a snapshot; the tests compare the difference of two snapshots taken
around a workload, so whatever the processes counted before (start-up probes,
earlier tests) cancels out.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs
import httpx
from prometheus_client.parser import text_string_to_metric_families

# Bubo's generation requests, one sample per outcome (finished, failed, client left): every request that
# reached a slot's queue, and only those (probes, /metrics and refused requests are not in it).
REPLICA_REQUESTS = "bubo:request_duration_seconds_count"
REPLICA_PROMPT_TOKENS = "llamacpp:prompt_tokens_total"  # prompt tokens evaluated (cache misses)
REPLICA_CACHED_TOKENS = "llamacpp:prompt_tokens_cached_total"  # prompt tokens taken from the cache
# smg 1.13: requests the gateway sent to each worker (label ``worker``: its URL), counted at each send, so
# a retry on another worker counts there too; and the requests it routed, by endpoint.
GATEWAY_WORKER_REQUESTS = "smg_worker_requests_total"
GATEWAY_ROUTED_REQUESTS = "smg_router_requests_total"
GATEWAY_RETRIES = "smg_worker_retries_total"


@attrs.frozen
class Sample:
    name: str
    labels: Mapping[str, str]
    value: float


@attrs.frozen
class Scrape:
    """Every sample of one scrape."""

    samples: tuple[Sample, ...]

    def total(self, name: str, **labels: str) -> float:
        """The sum of *name*'s samples whose labels include *labels* (0 when there is none)."""
        return sum(
            sample.value
            for sample in self.samples
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items())
        )

    def label_values(self, name: str, label: str) -> set[str]:
        """The values *label* takes among *name*'s samples."""
        return {s.labels[label] for s in self.samples if s.name == name and label in s.labels}


def parse(text: str) -> Scrape:
    samples = [
        Sample(name=sample.name, labels=dict(sample.labels), value=sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    ]
    return Scrape(samples=tuple(samples))


def scrape(url: str) -> Scrape:
    """GET *url* (a ``/metrics`` endpoint) and parse it."""
    response = httpx.get(url, timeout=30)
    response.raise_for_status()
    return parse(response.text)
