"""LoRA adapters: the ones loaded, the scales in force, and the adapter set a request decodes with.

Adapters are loaded once, at start (``--lora``, ``--lora-scaled``), and keep
their ids (the order they were given in).  The engine holds each one's global
scale (``POST /lora-adapters`` changes them); a request may bring scales of its
own (llama-server's ``lora`` field: the adapters it names at their scales,
every other one at 0).

What a decode applies is an :data:`AdapterSet`: the adapters whose scale is
not 0, with their scales (llama.cpp applies nothing for a scale of 0, so a set
of zeros is the base model).  Two requests with different sets are never in
one decode step, and a KV sequence computed under one set is never reused
under another: the set is part of what a cached prefix is.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import attrs

from bubo.domain.generation import GenerationRequest
from bubo.domain.requests import LoraScale
from bubo.errors import InvalidRequest

__all__ = [
    "NO_ADAPTERS",
    "AdapterSet",
    "LoraAdapter",
    "LoraFile",
    "LoraScales",
    "adapter_set",
    "adapter_set_from_json",
    "request_scales",
]

AdapterSet = tuple[tuple[int, float], ...]
"""``(id, scale)`` of each adapter applied, in id order; empty: the base model."""

NO_ADAPTERS: AdapterSet = ()


@attrs.frozen
class LoraFile:
    """An adapter to load (``--lora FILE``, ``--lora-scaled FILE SCALE``) and its first global scale."""

    path: Path
    scale: float = 1.0


@attrs.frozen(kw_only=True)
class LoraAdapter:
    """A loaded adapter as ``GET /lora-adapters`` lists it."""

    id: int
    path: str
    scale: float


def adapter_set(scales: Sequence[float]) -> AdapterSet:
    """The adapters *scales* (one per adapter, by id) applies: those whose scale is not 0."""
    return tuple((i, float(scale)) for i, scale in enumerate(scales) if scale != 0)


def adapter_set_from_json(value: object) -> AdapterSet:
    """An adapter set as a file's JSON holds it, ``[[id, scale], ...]`` (slot records, disk-cache headers).

    Raises:
        TypeError: *value* is not a list.
        ValueError: an entry is not an ``[id, scale]`` pair of a non-negative integer and a finite number.

    """
    if not isinstance(value, list):
        raise TypeError("adapters")
    pairs: list[tuple[int, float]] = []
    for pair in value:
        if not (isinstance(pair, list) and len(pair) == 2):
            raise ValueError("adapters")
        adapter, scale = pair
        if (
            type(adapter) is not int
            or adapter < 0
            or type(scale) not in (int, float)
            or not math.isfinite(scale)
        ):
            raise ValueError("adapters")
        pairs.append((adapter, float(scale)))
    return tuple(pairs)


def request_scales(entries: Sequence[LoraScale], n_adapters: int, param: str) -> tuple[float, ...]:
    """Every adapter's scale for *entries*: the ones named at their scale, the others at 0.

    *param* is the JSON path of the list, for errors (``lora``, or ``""`` for a whole body).

    Raises:
        InvalidRequest: an id names no loaded adapter, or a scale is not finite.

    """
    scales = [0.0] * n_adapters
    for index, entry in enumerate(entries):
        where = f"{param}[{index}]"
        if not 0 <= entry.id < n_adapters:
            loaded = f"ids 0 to {n_adapters - 1}" if n_adapters else "none"
            raise InvalidRequest(
                f"invalid adapter id {entry.id}: the loaded LoRA adapters have {loaded}", param=f"{where}.id"
            )
        if not math.isfinite(entry.scale):
            raise InvalidRequest("a LoRA scale must be a finite number", param=f"{where}.scale")
        scales[entry.id] = float(entry.scale)
    return tuple(scales)


class LoraScales:
    """The loaded adapters' global scales, and the scales a request decodes with (trio thread)."""

    def __init__(self, adapters: Sequence[LoraAdapter]) -> None:
        self._paths = tuple(adapter.path for adapter in adapters)
        self.scales = tuple(adapter.scale for adapter in adapters)

    @property
    def adapters(self) -> tuple[LoraAdapter, ...]:
        """The loaded adapters, by id, with their global scales now (``GET /lora-adapters``)."""
        return tuple(
            LoraAdapter(id=i, path=path, scale=scale)
            for i, (path, scale) in enumerate(zip(self._paths, self.scales, strict=True))
        )

    def set(self, scales: Sequence[float]) -> None:
        """Set every adapter's global scale (one per adapter, by id); a running request keeps its own."""
        if len(scales) != len(self._paths):
            raise ValueError(f"{len(scales)} scales for {len(self._paths)} adapters")
        self.scales = tuple(float(scale) for scale in scales)

    def settle(self, request: GenerationRequest) -> GenerationRequest:
        """*request* with every adapter's scale settled: its own, or the global ones now (llama-server's).

        Raises:
            InvalidRequest: the request gives a scale count other than the adapters'.

        """
        if request.lora is None:
            return attrs.evolve(request, lora=self.scales)
        if len(request.lora) != len(self._paths):
            raise InvalidRequest(
                f"lora gives {len(request.lora)} scales; {len(self._paths)} adapters are loaded",
                param="lora",
            )
        return request
