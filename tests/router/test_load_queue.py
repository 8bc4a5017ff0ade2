"""The load queue under --models-max, as llama.cpp's router tests (test_router.py) check it.

Stand-in children (``stand_in_child.py``): a streaming request behind a gate file
keeps its model busy for as long as the test wants.  A busy model is never
unloaded for another; loads wait in arrival order; a client that leaves takes its
place in the queue with it; requests for one model share one eviction.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio
from quart_trio import QuartTrio

from .test_router_app import WAIT_S, context, make_router, post, statuses

SETTLE_S = 0.5  # time for a queued request to have done whatever it would wrongly do


async def _busy(app: QuartTrio, model: str, gate: Path, done: list[str]) -> None:
    """A stream from *model* that holds it until *gate* exists."""
    response = await post(app, "/completion", {"model": model, "stream": True, "gate": str(gate)})
    assert response.status_code == 200
    await response.get_data()
    done.append(f"busy {model}")


async def _tokenize(app: QuartTrio, model: str, done: list[str]) -> None:
    response = await post(app, "/tokenize", {"model": model, "content": "hello world"})
    assert response.status_code == 200, await response.get_data()
    assert (await response.get_json())["model"] == model
    done.append(model)


async def _until(check: Callable[[], bool]) -> None:
    with trio.fail_after(WAIT_S):
        while not check():
            await trio.sleep(0.02)


async def _until_busy(app: QuartTrio, model: str) -> None:
    """Until *model*'s child serves a request (its lease is held)."""
    record = context(app).registry.get(model)
    await _until(lambda: record.instance is not None and record.instance.in_flight == 1)


async def _until_queued(app: QuartTrio, model: str) -> None:
    router = context(app)
    record = router.registry.get(model)
    await _until(lambda: router.supervisor.queued(record))


async def _until_loaded(app: QuartTrio, model: str) -> None:
    record = context(app).registry.get(model)
    await _until(lambda: record.state.value == "loaded")


async def _hold(app: QuartTrio, nursery: trio.Nursery, model: str, gate: Path, done: list[str]) -> None:
    """Load *model* (if it is not), then keep it busy with a stream until *gate* exists."""
    await _tokenize(app, model, done)
    nursery.start_soon(_busy, app, model, gate, done)
    await _until_busy(app, model)


def _values(current: dict[str, dict[str, Any]]) -> dict[str, str]:
    return {name: status["value"] for name, status in current.items()}


async def test_a_busy_model_is_not_unloaded_for_a_queued_one(tmp_path: Path) -> None:
    """models_max 1, a busy: a request for b waits; a finishes its answer, then gives way to b."""
    gate, done = tmp_path / "gate", []
    async for app in make_router(tmp_path, "a", "b", router__models_max="1"):
        async with trio.open_nursery() as nursery:
            await _hold(app, nursery, "a", gate, done)
            nursery.start_soon(_tokenize, app, "b", done)
            await _until_queued(app, "b")
            await trio.sleep(SETTLE_S)
            assert _values(await statuses(app)) == {"a": "loaded", "b": "unloaded"}
            gate.write_text("go")
        assert done == ["a", "busy a", "b"]
        assert _values(await statuses(app)) == {"a": "unloaded", "b": "loaded"}


async def test_a_client_that_leaves_the_queue_costs_nothing(tmp_path: Path) -> None:
    """A request for b gives up while a is busy: nobody waits any more, so a stays loaded."""
    gate, done = tmp_path / "gate", []
    async for app in make_router(tmp_path, "a", "b", router__models_max="1"):
        async with trio.open_nursery() as nursery:
            await _hold(app, nursery, "a", gate, done)
            with trio.move_on_after(1.0) as gave_up:
                await _tokenize(app, "b", done)
            assert gave_up.cancelled_caught
            assert not context(app).supervisor.queued(context(app).registry.get("b"))
            gate.write_text("go")
        await trio.sleep(SETTLE_S)
        assert _values(await statuses(app)) == {"a": "loaded", "b": "unloaded"}


async def test_the_queue_is_served_in_arrival_order(tmp_path: Path) -> None:
    """a busy; b asked for, then c: b is served first, then c."""
    gate, done = tmp_path / "gate", []
    async for app in make_router(tmp_path, "a", "b", "c", router__models_max="1"):
        async with trio.open_nursery() as nursery:
            await _hold(app, nursery, "a", gate, done)
            nursery.start_soon(_tokenize, app, "b", done)
            await _until_queued(app, "b")
            nursery.start_soon(_tokenize, app, "c", done)
            await _until_queued(app, "c")
            gate.write_text("go")
        assert done == ["a", "busy a", "b", "c"]


async def test_two_waiters_share_one_eviction(tmp_path: Path) -> None:
    """a idle; b and c asked for at once: a gives way to b, b (once it has answered) to c; both served."""
    done: list[str] = []
    async for app in make_router(tmp_path, "a", "b", "c", router__models_max="1"):
        await _tokenize(app, "a", done)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_tokenize, app, "b", done)
            nursery.start_soon(_tokenize, app, "c", done)
        assert sorted(done) == ["a", "b", "c"]
        assert _values(await statuses(app))["a"] == "unloaded"


async def test_requests_for_one_model_coalesce(tmp_path: Path) -> None:
    """models_max 2, a busy, b idle: three requests for c cost one eviction (b's); a is left alone."""
    gate, done = tmp_path / "gate", []
    async for app in make_router(tmp_path, "a", "b", "c", router__models_max="2"):
        await _tokenize(app, "b", done)
        async with trio.open_nursery() as nursery:
            await _hold(app, nursery, "a", gate, done)
            async with trio.open_nursery() as waiters:
                for _ in range(3):
                    waiters.start_soon(_tokenize, app, "c", done)
            gate.write_text("go")
        assert done.count("c") == 3
        assert _values(await statuses(app)) == {"a": "loaded", "b": "unloaded", "c": "loaded"}


async def test_an_explicit_load_waits_its_turn_too(tmp_path: Path) -> None:
    """POST /models/load at the limit unloads the least recently used idle model (test_router_models_max_evicts_lru)."""
    done: list[str] = []
    async for app in make_router(tmp_path, "a", "b", "c", router__models_max="2"):
        await _tokenize(app, "a", done)
        await _tokenize(app, "b", done)
        response = await post(app, "/models/load", {"model": "c"})
        assert (await response.get_json()) == {"success": True}
        await _until_loaded(app, "c")
        assert _values(await statuses(app)) == {"a": "unloaded", "b": "loaded", "c": "loaded"}
