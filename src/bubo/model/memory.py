"""How much KV state a token costs, from a GGUF's attention metadata."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["kv_bytes_per_token"]

F16_BYTES = 2  # llama.cpp's default KV cache type


def kv_bytes_per_token(metadata: Mapping[str, Any]) -> int:
    """Bytes of K and V one token occupies across all layers (f16 cache); 0 when unknown.

    ``key_length``/``value_length`` default to ``embedding_length / head_count``;
    a per-layer ``head_count_kv`` array counts its largest entry for every layer.
    """
    arch = metadata.get("general.architecture")
    if not isinstance(arch, str):
        return 0
    layers = metadata.get(f"{arch}.block_count")
    embedding = metadata.get(f"{arch}.embedding_length")
    heads = _largest(metadata.get(f"{arch}.attention.head_count"))
    kv_heads = _largest(metadata.get(f"{arch}.attention.head_count_kv")) or heads
    if not isinstance(layers, int) or not isinstance(embedding, int) or not heads:
        return 0
    key = metadata.get(f"{arch}.attention.key_length") or embedding // heads
    value = metadata.get(f"{arch}.attention.value_length") or embedding // heads
    return int(layers * kv_heads * (key + value) * F16_BYTES)


def _largest(value: object) -> int:
    if isinstance(value, int):
        return value
    if isinstance(value, (list, tuple)):
        counts = [v for v in value if isinstance(v, int)]
        return max(counts, default=0)
    return 0
