"""``GET /cache``: the prompt cache's tiers and entries, as the engine reports them."""

from __future__ import annotations

from bubo.api.prompt_cache import cache_listing
from bubo.engine import CacheContents
from bubo.engine.values import SnapshotInfo


async def test_an_engine_without_tiers(app) -> None:
    """The fake engine holds no snapshots: both tiers are off and listed empty."""
    response = await app.test_client().get("/cache")
    assert response.status_code == 200
    off = {"enabled": False, "budget_bytes": 0, "used_bytes": 0, "n_entries": 0, "n_tokens": 0}
    assert await response.get_json() == {"live_tokens": 0, "tiers": {"ram": off, "disk": off}, "entries": []}


def test_entries_of_both_tiers_with_their_totals() -> None:
    """Each tier's budget and use, then every entry with its tier, RAM first, least recently used first."""
    contents = CacheContents(
        live_tokens=7,
        budget_bytes=1000,
        snapshots=(SnapshotInfo(n_tokens=100, size_bytes=300, conversation="c", last_used=5.0),),
        disk_budget_bytes=5000,
        disk_snapshots=(
            SnapshotInfo(n_tokens=80, size_bytes=250, conversation=None, last_used=1.25, tier="disk"),
            SnapshotInfo(n_tokens=120, size_bytes=400, conversation=None, last_used=4.5, tier="disk"),
        ),
    )
    assert cache_listing(contents) == {
        "live_tokens": 7,
        "tiers": {
            "ram": {
                "enabled": True,
                "budget_bytes": 1000,
                "used_bytes": 300,
                "n_entries": 1,
                "n_tokens": 100,
            },
            "disk": {
                "enabled": True,
                "budget_bytes": 5000,
                "used_bytes": 650,
                "n_entries": 2,
                "n_tokens": 200,
            },
        },
        "entries": [
            {"tier": "ram", "n_tokens": 100, "size_bytes": 300, "last_used": 5.0},
            {"tier": "disk", "n_tokens": 80, "size_bytes": 250, "last_used": 1.25},
            {"tier": "disk", "n_tokens": 120, "size_bytes": 400, "last_used": 4.5},
        ],
    }
