"""Sleeping while idle (``--sleep-idle-seconds``, Ollama's ``keep_alive``) over the fake engine.

The fake engine "frees its model" by forgetting its slots' prompts and counts its loads; the real
engine's sleep is tested in tests/engine/test_sleep.py, and end to end in tests/e2e/test_sleep.py.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator

import attrs
import pytest
import trio
from quart_trio import QuartTrio

from bubo.engine.fake import FakeEngine
from bubo.service.idle import IdleSleeper

from ..conftest import RuntimeFactory, serving_app

MODEL = "smollm2-135m-instruct-q4-1"


async def until(condition: object, timeout_s: float = 10) -> None:
    with trio.fail_after(timeout_s):
        while not condition():  # type: ignore[operator]
            await trio.sleep(0.02)


@pytest.fixture(name="sleepy")
async def _sleepy(settings, make_runtime: RuntimeFactory) -> AsyncIterator[QuartTrio]:
    runtime = attrs.evolve(make_runtime(), sleeper=IdleSleeper(idle_s=0.3))
    async with serving_app(settings, runtime) as test_app:
        yield test_app


class TestSleepIdleSeconds:
    async def test_the_idle_model_sleeps_and_the_status_routes_say_so_without_waking_it(
        self, sleepy, fake_engine: FakeEngine
    ) -> None:
        client = sleepy.test_client()
        assert (await (await client.get("/props")).get_json())["is_sleeping"] is False
        await until(lambda: fake_engine.sleeping)
        props = await (await client.get("/props")).get_json()
        assert props["is_sleeping"] is True
        assert await (await client.get("/health")).get_json() == {"status": "ok", "is_sleeping": True}
        ready = await client.get("/ready")
        assert ready.status_code == 200
        assert (await ready.get_json())["is_sleeping"] is True
        assert all(s["is_sleeping"] for s in await (await client.get("/slots")).get_json())
        assert (await client.get("/metrics")).status_code == 200
        assert fake_engine.sleeping
        assert fake_engine.loads == 1

    async def test_the_next_request_loads_it_again(self, sleepy, fake_engine: FakeEngine) -> None:
        client = sleepy.test_client()
        await until(lambda: fake_engine.sleeping)
        response = await client.post("/completion", json={"prompt": "Hello", "n_predict": 2})
        assert response.status_code == 200
        assert fake_engine.loads == 2
        assert (await (await client.get("/props")).get_json())["is_sleeping"] is False
        assert await (await client.get("/health")).get_json() == {"status": "ok"}
        await until(lambda: fake_engine.sleeping)  # and sleeps again once idle
        assert fake_engine.sleeps == 2

    async def test_a_running_request_keeps_it_awake(self, sleepy, fake_engine: FakeEngine, script) -> None:
        script.piece_delay = 0.1  # ten pieces: a second, three times the idle timeout
        script.reply = "one two three four five six seven eight nine ten"
        client = sleepy.test_client()
        await client.post("/completion", json={"prompt": "Hello", "n_predict": 1})  # awake now, and idle
        sleeps = fake_engine.sleeps
        response = await client.post("/completion", json={"prompt": "Hello"})
        assert response.status_code == 200
        assert (await response.get_json())["content"] == script.reply
        assert fake_engine.sleeps == sleeps  # not while it generated


class TestKeepAlive:
    async def test_zero_with_an_empty_request_frees_the_model_now(self, app, fake_engine: FakeEngine) -> None:
        client = app.test_client()
        body = await (await client.post("/api/generate", json={"model": MODEL, "keep_alive": 0})).get_json()
        assert body["done_reason"] == "unload"
        assert fake_engine.sleeping
        assert (await (await client.get("/api/ps")).get_json())["models"] == []
        body = await (await client.post("/api/chat", json={"model": MODEL})).get_json()
        assert body["done_reason"] == "load"
        assert not fake_engine.sleeping
        assert fake_engine.loads == 2
        assert len((await (await client.get("/api/ps")).get_json())["models"]) >= 1

    async def test_ps_shows_when_the_idle_model_will_be_freed(self, app, fake_engine: FakeEngine) -> None:
        client = app.test_client()
        ps = await (await client.get("/api/ps")).get_json()
        assert dt.datetime.fromisoformat(ps["models"][0]["expires_at"]).year > 2200  # no timeout: for good
        await client.post("/api/generate", json={"model": MODEL, "keep_alive": "5m"})
        ps = await (await client.get("/api/ps")).get_json()
        expires = dt.datetime.fromisoformat(ps["models"][0]["expires_at"])
        left = (expires - dt.datetime.now(tz=dt.UTC)).total_seconds()
        assert 290 < left <= 300
        await client.post("/api/generate", json={"model": MODEL, "keep_alive": -1})
        ps = await (await client.get("/api/ps")).get_json()
        assert dt.datetime.fromisoformat(ps["models"][0]["expires_at"]).year > 2200

    async def test_seconds_free_the_model_that_long_after_the_answer(
        self, app, fake_engine: FakeEngine
    ) -> None:
        client = app.test_client()
        response = await client.post(
            "/api/generate", json={"model": MODEL, "prompt": "Hi", "stream": False, "keep_alive": 0.2}
        )
        assert response.status_code == 200
        assert not fake_engine.sleeping
        await until(lambda: fake_engine.sleeping)
        await client.post("/api/generate", json={"model": MODEL, "prompt": "Hi", "stream": False})
        assert fake_engine.loads == 2
        ps = await (await client.get("/api/ps")).get_json()  # no keep_alive: the server's own timeout (never)
        assert dt.datetime.fromisoformat(ps["models"][0]["expires_at"]).year > 2200
        assert not fake_engine.sleeping

    async def test_a_bad_keep_alive_is_still_a_400(self, app) -> None:
        response = await app.test_client().post("/api/generate", json={"model": MODEL, "keep_alive": "soon"})
        assert response.status_code == 400
