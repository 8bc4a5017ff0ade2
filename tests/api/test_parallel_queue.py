"""The queue in front of several slots: requests run side by side, then wait, then are refused."""

from __future__ import annotations

from typing import Any

import attrs
import pytest
import trio

from bubo.engine import EngineStatistics
from bubo.engine.fake import FakeEngine, FakeScript

from ..conftest import RuntimeFactory
from .test_cancellation import CHAT, body, wait_for


class Counted(FakeEngine):
    """Counts the full snapshots taken: the routes and admission must not need one."""

    snapshots = 0

    def statistics(self) -> EngineStatistics:
        self.snapshots += 1
        return super().statistics()


@pytest.fixture(name="fake_engine")
def _fake_engine(script: FakeScript) -> FakeEngine:
    return Counted(script=script, n_slots=2)


@pytest.fixture(name="max_queue")
def _max_queue() -> int:
    return 1


@pytest.fixture(name="slow_replies", autouse=True)
def _slow_replies(script: FakeScript) -> None:
    """Each request takes about a second: long enough for the slots and the queue to fill."""
    script.piece_delay = 0.05
    script.reply = "word " * 20


@attrs.define
class Asker:
    """Sends non-streaming chat requests and notes each one's status as it ends."""

    client: Any
    statuses: list[int] = attrs.Factory(list)

    async def ask(self) -> None:
        self.statuses.append((await self.client.post(CHAT, data=body(stream=False))).status_code)


@pytest.fixture(name="make_runtime")
def _make_runtime(make_runtime: RuntimeFactory, max_queue: int) -> RuntimeFactory:
    """conftest's runtimes, with ``--max-queue`` *max_queue*."""
    return lambda: attrs.evolve(make_runtime(), max_queue=max_queue)


async def test_two_run_one_waits_the_next_is_refused(app, fake_engine: FakeEngine) -> None:
    client = app.test_client()
    asker = Asker(client)
    ask, statuses = asker.ask, asker.statuses

    async with trio.open_nursery() as nursery:
        nursery.start_soon(ask)
        nursery.start_soon(ask)
        await wait_for(fake_engine, lambda s: s.requests_processing == 2)
        assert fake_engine.statistics().requests_deferred == 0  # both slots took one
        nursery.start_soon(ask)
        await wait_for(fake_engine, lambda s: s.requests_deferred == 1)
        refused = await client.post(CHAT, data=body(stream=True))
        assert refused.status_code == 503
        assert (await refused.get_json())["error"]["code"] == "queue_full"
        assert refused.headers["Retry-After"]
    assert statuses == [200, 200, 200]
    assert sorted(fake_engine.slots_used[:2]) == [0, 1]  # the third took whichever slot freed first


@pytest.mark.parametrize("max_queue", [0])
async def test_with_no_queue_a_free_slot_still_takes_a_request(app, fake_engine: FakeEngine) -> None:
    """--max-queue 0 refuses only what would wait: while one slot is free, a request runs in it."""
    client = app.test_client()
    asker = Asker(client)
    ask, statuses = asker.ask, asker.statuses

    async with trio.open_nursery() as nursery:
        nursery.start_soon(ask)
        await wait_for(fake_engine, lambda s: s.requests_processing == 1)
        nursery.start_soon(ask)
        await wait_for(fake_engine, lambda s: s.requests_processing == 2)
        refused = await client.post(CHAT, data=body(stream=False))
        assert refused.status_code == 503
        assert (await refused.get_json())["error"]["code"] == "queue_full"
    assert statuses == [200, 200]


async def test_admission_and_slot_checks_read_cheap_counts_not_a_snapshot(app, fake_engine: Counted) -> None:
    """Admitting, refusing, checking an id_slot and /props count slots without copying every slot's state."""
    client = app.test_client()
    ask = Asker(client).ask

    async with trio.open_nursery() as nursery:
        for _ in range(3):  # two run, one waits
            nursery.start_soon(ask)
        await wait_for(fake_engine, lambda s: s.requests_deferred == 1)
        taken = fake_engine.snapshots
        assert (await client.post(CHAT, data=body(stream=False))).status_code == 503  # queue_full
        bad_slot = await client.post("/completion", json={"prompt": "x", "id_slot": 7})
        assert bad_slot.status_code == 400
        assert (await (await client.get("/props")).get_json())["total_slots"] == 2
        assert fake_engine.snapshots == taken
