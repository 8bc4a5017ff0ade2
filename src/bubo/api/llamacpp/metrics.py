"""``GET /metrics``: Prometheus text, llama-server's names and types.

The engine's statistics are read at scrape time, so nothing is counted twice
and no metric object outlives the app (no global registry); llama-server's
families are written as it prints them, Bubo's own through prometheus-client.
``prompt_tokens_seconds`` and ``predicted_tokens_seconds`` are averages over
the server's life (llama-server resets them per scrape, which makes a second
scraper see zeros).  The Responses store's size is Bubo's own
(``bubo:responses_store_*``), as are the latency histograms
(``bubo:*_seconds``, :mod:`bubo.api._latency`) and the gauges of the Gateway
API Inference Extension's model-server protocol (queued and running requests,
KV-cache usage, the cache's layout, the LoRA adapters: docs/deploy.md, "The
Gateway API Inference Extension and llm-d").
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import PurePath

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.utils import floatToGoString

from bubo.api._latency import LatencyHistograms
from bubo.engine import EngineStatistics, LoraAdapter
from bubo.service.response_store import StoreStatistics

__all__ = ["CONTENT_TYPE", "render_metrics"]

CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4


def _llama_server_families(s: EngineStatistics) -> Iterator[tuple[str, str, str, float]]:
    """``(name, type, help, value)`` of each llama-server metric, with llama-server's type."""
    counters = (
        ("prompt_tokens_total", "Number of prompt tokens processed, excluding cached tokens",
         s.prompt_tokens_total),
        ("prompt_tokens_cached_total", "Number of prompt tokens reused from the cache",
         s.prompt_tokens_cached_total),
        ("prompt_seconds_total", "Total time spent processing prompts", s.prompt_seconds_total),
        ("tokens_predicted_total", "Number of generation tokens processed", s.tokens_predicted_total),
        ("tokens_predicted_seconds_total", "Total time spent generating tokens",
         s.tokens_predicted_seconds_total),
        ("n_decode_total", "Total number of llama_decode() calls", s.n_decode_total),
        # a counter in llama-server, under this name (no _total)
        ("n_tokens_max", "Largest observed sequence length (prompt + generation)", s.n_tokens_max),
        ("spec_decode_num_draft_tokens_total", "Speculative: Total draft tokens generated",
         s.draft_tokens_total),
        ("spec_decode_num_accepted_tokens_total",
         "Speculative: Total draft tokens accepted by the target model", s.draft_accepted_total),
        ("spec_decode_num_drafts_total", "Speculative: Total speculative decoding verification steps",
         s.draft_steps_total),
    )  # fmt: skip
    for name, help_text, value in counters:
        yield f"llamacpp:{name}", "counter", help_text, value
    prompt_rate = s.prompt_tokens_total / s.prompt_seconds_total if s.prompt_seconds_total else 0.0
    gauges = (
        ("prompt_tokens_seconds", "Average prompt throughput in tokens/s", prompt_rate),
        ("predicted_tokens_seconds", "Average generation throughput in tokens/s", s.generation_rate),
        ("requests_processing", "Number of requests processing", s.requests_processing),
        ("requests_deferred", "Number of requests deferred", s.requests_deferred),
        ("n_busy_slots_per_decode", "Average number of busy slots per llama_decode() call",
         s.n_busy_slots_per_decode),
        ("kv_cache_usage_ratio", "KV-cache usage. 1 means 100 percent usage",
         s.kv_cache_tokens / s.kv_cache_capacity if s.kv_cache_capacity else 0.0),
        ("kv_cache_tokens", "KV-cache tokens", s.kv_cache_tokens),
        ("prompt_cache_hit_ratio", "Share of prompt tokens served from the prompt cache",
         s.prompt_cache_hit_ratio),
    )  # fmt: skip
    for name, help_text, value in gauges:
        yield f"llamacpp:{name}", "gauge", help_text, value


def _llama_server_text(s: EngineStatistics) -> bytes:
    """llama-server's families in the text format, each name printed as llama-server prints it.

    Written here rather than through prometheus-client, whose counter families
    always print a ``_total`` name: llama-server's ``n_tokens_max`` is a counter
    without one.
    """
    lines = []
    for name, kind, help_text, value in _llama_server_families(s):
        sample = floatToGoString(value)  # type: ignore[no-untyped-call]  # untyped in prometheus-client
        lines.append(f"# HELP {name} {help_text}\n# TYPE {name} {kind}\n{name} {sample}\n")
    return "".join(lines).encode()


class _StoreCollector:
    """The Responses store's size against its budget."""

    def __init__(self, read: Callable[[], StoreStatistics]) -> None:
        self._read = read

    def collect(self) -> Iterator[Metric]:
        s = self._read()
        yield GaugeMetricFamily(
            "bubo:responses_store_bytes", "Bytes held by stored Responses-API responses", value=s.bytes
        )
        yield GaugeMetricFamily(
            "bubo:responses_store_entries", "Stored Responses-API responses", value=s.entries
        )
        yield GaugeMetricFamily(
            "bubo:responses_store_budget_bytes",
            "Byte budget of the Responses store (--responses-store-mib)",
            value=s.budget_bytes,
        )
        yield CounterMetricFamily(
            "bubo:responses_store_evictions_total",
            "Responses evicted (or not kept) to hold the store's budgets",
            value=s.evictions,
        )


class _ModelServerCollector:
    """The model-server protocol's gauges (Gateway API Inference Extension), read from one snapshot.

    Queued and running requests, and the KV cache the running requests pin
    (idle slots' cached prefixes are evictable, as vLLM counts its cached free
    blocks free); the cache's layout as vLLM's ``cache_config_info`` labels it
    (llama.cpp's cache is one cell a token: blocks of 1); and, while adapters
    are loaded, vLLM's ``lora_requests_info``: every adapter is loaded at start
    and serves any request, so none waits, and the value is when they loaded.
    """

    def __init__(self, s: EngineStatistics, adapters: Sequence[LoraAdapter], loaded_at: float) -> None:
        self._s = s
        self._adapters = adapters
        self._loaded_at = loaded_at

    def collect(self) -> Iterator[Metric]:
        s = self._s
        yield GaugeMetricFamily(
            "bubo:num_requests_waiting", "Requests waiting for a slot", value=s.requests_deferred
        )
        yield GaugeMetricFamily(
            "bubo:num_requests_running", "Requests holding a slot", value=s.requests_processing
        )
        yield GaugeMetricFamily(
            "bubo:kv_cache_usage_perc",
            "KV-cache usage by the running requests; 1 means 100 percent",
            value=s.kv_cache_running_ratio,
        )
        layout = GaugeMetricFamily(
            "bubo:cache_config_info", "The KV cache's layout", labels=["block_size", "num_gpu_blocks"]
        )
        layout.add_metric(["1", str(s.kv_cache_capacity)], 1)
        yield layout
        if self._adapters:
            lora = GaugeMetricFamily(
                "bubo:lora_requests_info",
                "LoRA adapters loaded (all serve requests); the value is when they were loaded",
                labels=["max_lora", "running_lora_adapters", "waiting_lora_adapters"],
            )
            names = ",".join(PurePath(adapter.path).stem for adapter in self._adapters)
            lora.add_metric([str(len(self._adapters)), names, ""], self._loaded_at)
            yield lora


def render_metrics(
    read: Callable[[], EngineStatistics],
    store: Callable[[], StoreStatistics],
    latency: LatencyHistograms,
    *,
    adapters: Sequence[LoraAdapter] = (),
    loaded_at: float = 0.0,
) -> bytes:
    """The Prometheus text exposition of the engine's and the Responses store's statistics, and latencies.

    *adapters* are the loaded LoRA adapters, loaded at unix time *loaded_at*.
    """
    statistics = read()  # one snapshot for every family of the engine's
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_ModelServerCollector(statistics, adapters, loaded_at))
    registry.register(_StoreCollector(store))
    registry.register(latency)
    return _llama_server_text(statistics) + generate_latest(registry)
