"""How much KV state a token costs, from a GGUF's attention metadata and the cache's data types."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from bubo.domain.modes import KvCacheType

__all__ = ["KV_CACHE_TYPES", "KvCacheSize", "is_quantized", "kv_bytes_per_token"]

KV_CACHE_TYPES: Mapping[KvCacheType, tuple[int, int]] = {
    # ggml's type: (bytes of one block, values in a block), as ggml lays them out
    "f32": (4, 1),
    "f16": (2, 1),
    "bf16": (2, 1),
    "q8_0": (34, 32),
    "q4_0": (18, 32),
    "q4_1": (20, 32),
    "iq4_nl": (18, 32),
    "q5_0": (22, 32),
    "q5_1": (24, 32),
}
"""Each KV cache type (``-ctk``/``-ctv``) with its block layout."""

DEFAULT_KV_TYPE: KvCacheType = "f16"  # llama.cpp's


def is_quantized(cache_type: KvCacheType) -> bool:
    """Whether *cache_type* stores values in quantized blocks (a quantized V needs flash attention)."""
    return KV_CACHE_TYPES[cache_type][1] > 1


def _row_bytes(cache_type: KvCacheType, n_values: int) -> int:
    block_bytes, block_values = KV_CACHE_TYPES[cache_type]
    return -(-n_values // block_values) * block_bytes


def kv_bytes_per_token(
    metadata: Mapping[str, Any], type_k: KvCacheType = DEFAULT_KV_TYPE, type_v: KvCacheType = DEFAULT_KV_TYPE
) -> int:
    """Bytes of K and V one token occupies across all layers; 0 when unknown.

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
    return int(layers * (_row_bytes(type_k, kv_heads * key) + _row_bytes(type_v, kv_heads * value)))


@attrs.frozen(kw_only=True)
class KvCacheSize:
    """The KV cache a context holds: its data types and bytes, against the f16 cache llama.cpp defaults to."""

    type_k: KvCacheType
    type_v: KvCacheType
    n_ctx: int  # cells in the cache (every slot's together)
    bytes: int
    f16_bytes: int

    @classmethod
    def of(
        cls, metadata: Mapping[str, Any], *, type_k: KvCacheType, type_v: KvCacheType, n_ctx: int
    ) -> KvCacheSize:
        """The cache of *n_ctx* cells of the model *metadata* describes."""
        return cls(
            type_k=type_k,
            type_v=type_v,
            n_ctx=n_ctx,
            bytes=n_ctx * kv_bytes_per_token(metadata, type_k, type_v),
            f16_bytes=n_ctx * kv_bytes_per_token(metadata),
        )

    @property
    def saved_bytes(self) -> int:
        """What the chosen types save against f16 (negative for f32)."""
        return self.f16_bytes - self.bytes


def _largest(value: object) -> int:
    if isinstance(value, int):
        return value
    if isinstance(value, (list, tuple)):
        counts = [v for v in value if isinstance(v, int)]
        return max(counts, default=0)
    return 0
