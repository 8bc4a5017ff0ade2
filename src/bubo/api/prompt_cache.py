"""``GET /cache``: what the prompt cache holds, in host RAM and on disk.

Each entry is a snapshot of a sequence's KV state that a later prompt beginning
with its tokens restores instead of reading them again; the live slots' own
tokens are counted apart.  Like every route it needs the API key when one is set.
"""

from __future__ import annotations

from typing import Any

from quart import Blueprint, Response

from bubo.engine import CacheContents

from ._context import require_runtime
from ._json import json_response

__all__ = ["blueprint", "cache_listing"]

blueprint = Blueprint("prompt_cache", __name__)


@blueprint.get("/cache")
async def cache() -> Response:
    """The tiers' budgets and totals, and every entry, least recently used first within its tier."""
    return json_response(cache_listing(require_runtime().engine.cache_contents()))


def cache_listing(contents: CacheContents) -> dict[str, Any]:
    """The body of ``GET /cache``."""
    tiers = {
        "ram": (contents.budget_bytes, contents.snapshots),
        "disk": (contents.disk_budget_bytes, contents.disk_snapshots),
    }
    return {
        "live_tokens": contents.live_tokens,
        "tiers": {
            name: {
                "enabled": budget > 0,
                "budget_bytes": budget,
                "used_bytes": sum(s.size_bytes for s in entries),
                "n_entries": len(entries),
                "n_tokens": sum(s.n_tokens for s in entries),
            }
            for name, (budget, entries) in tiers.items()
        },
        "entries": [
            {
                "tier": s.tier,
                "n_tokens": s.n_tokens,
                "size_bytes": s.size_bytes,
                "last_used": round(s.last_used, 3),
            }
            for _, entries in tiers.values()
            for s in entries
        ],
    }
