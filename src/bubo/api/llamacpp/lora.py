"""llama-server's ``GET /lora-adapters`` and ``POST /lora-adapters``: the adapters and their global scales.

The global scales apply to every request that brings no ``lora`` of its own
and starts after the change; a request already running keeps the scales it
started with (llama-server's behaviour too).
"""

from __future__ import annotations

import attrs
from quart import Response

from bubo.api._context import require_runtime, structured_array
from bubo.api._json import json_response, unstructure
from bubo.api._llama_fields import LoraEntry, lora_scales
from bubo.engine import request_scales

from .routes import blueprint

__all__ = ["LoraAdapterEntry", "LoraScalesSet"]


@attrs.frozen(kw_only=True)
class LoraAdapterEntry:
    """One entry of ``GET /lora-adapters``."""

    id: int
    path: str
    scale: float


@attrs.frozen(kw_only=True)
class LoraScalesSet:
    """``POST /lora-adapters``' answer."""

    success: bool = True


@blueprint.get("/lora-adapters")
async def lora_adapters() -> Response:
    """Every loaded adapter, by id, with its global scale."""
    runtime = require_runtime()
    return json_response(
        [
            unstructure(LoraAdapterEntry(id=adapter.id, path=adapter.path, scale=adapter.scale))
            for adapter in runtime.engine.lora_adapters
        ]
    )


@blueprint.post("/lora-adapters")
async def set_lora_adapters() -> Response:
    """Set the global scales: ``[{"id": 0, "scale": 0.5}, ...]``; the adapters not listed get 0."""
    runtime = require_runtime()
    n_adapters = len(runtime.engine.lora_adapters)

    def scales(entries: list[LoraEntry]) -> tuple[float, ...]:
        return request_scales(lora_scales(entries) or (), n_adapters, "")

    runtime.engine.set_lora_scales(await structured_array(runtime, LoraEntry, scales))
    return json_response(LoraScalesSet())
