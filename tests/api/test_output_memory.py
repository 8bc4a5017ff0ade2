"""The memory guard counts the log-probabilities an answer may carry (issue 36 §3).

``n_probs`` 100 adds about 10 kB to every token's event, and a non-streaming
answer holds them all until it is sent: a request's admission counts them for
every token it may generate.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import attrs
import pytest
from quart_trio import QuartTrio

from bubo.config import Settings
from bubo.server import create_app
from bubo.service.memory import MemoryGuard, MemoryReading
from bubo.service.work import Workers

from ..conftest import RuntimeFactory, wait_until_ready

MIB = 1024 * 1024


@attrs.frozen
class _Probe:
    available: int
    limit: int

    def read(self) -> MemoryReading:
        return MemoryReading(available_bytes=self.available, limit_bytes=self.limit)


@pytest.fixture(name="short_app")
async def _short_app(settings: Settings, make_runtime: RuntimeFactory) -> AsyncIterator[QuartTrio]:
    """The app (a 2,048-token context, no context shift) on a machine with 24 MiB available."""
    guard = MemoryGuard(
        probe=_Probe(available=24 * MIB, limit=1024 * MIB),
        kv_bytes_per_token=1,
        step_bytes=0,
        low_water_bytes=0,
    )
    runtime = attrs.evolve(make_runtime(), memory_guard=guard, workers=Workers(guard=guard))
    app = create_app(settings, load=lambda _settings, _progress: runtime, on_load_failure=lambda: None)
    async with app.test_app() as test_app:
        await wait_until_ready(app)
        yield test_app  # type: ignore[misc]


@pytest.mark.parametrize(
    ("fields", "status"),
    [
        ({"n_predict": -1}, 200),  # the text alone fits in the working margin
        ({"n_predict": -1, "n_probs": 100}, 503),  # ~2,040 tokens x 101 x 100 bytes: 20 MiB more
        ({"n_predict": 512, "n_probs": 100}, 200),  # 5 MiB more
        ({"n_predict": 100_000, "n_probs": 100}, 503),  # at most the context left: as -1
    ],
)
async def test_log_probabilities_are_admitted_against_memory(
    short_app, fields: dict[str, int], status: int
) -> None:
    response = await short_app.test_client().post("/completion", json={"prompt": "hi", **fields})
    assert response.status_code == status, await response.get_json()
    if status == 503:
        assert (await response.get_json())["error"]["code"] == "insufficient_memory"
