"""The memory guard counts the log-probabilities an answer may carry (issue 36 §3).

``n_probs`` 100 adds about 10 kB to every token's event, and a non-streaming
answer holds them all until it is sent: a request's admission counts them for
every token it may generate.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from quart_trio import QuartTrio

from bubo.config import Settings

from ..conftest import RuntimeFactory, serving_app
from ._memory import MIB, with_memory


@pytest.fixture(name="short_app")
async def _short_app(settings: Settings, make_runtime: RuntimeFactory) -> AsyncIterator[QuartTrio]:
    """The app (a 2,048-token context, no context shift) on a machine with 24 MiB available."""
    async with serving_app(settings, with_memory(make_runtime(), 24 * MIB)) as test_app:
        yield test_app


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
