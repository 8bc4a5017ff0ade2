"""Client disconnects cancel generation; the FIFO queue; the slot is released (fake engine)."""

from __future__ import annotations

import json
from collections.abc import Callable

import trio

from bubo.engine.fake import FakeEngine, FakeScript
from bubo.engine.stats import EngineStatistics
from bubo.server import drain

from .._asgi import exchange

CHAT = "/v1/chat/completions"


def body(stream: bool) -> bytes:
    return json.dumps(
        {"model": "bubo", "messages": [{"role": "user", "content": "Go on."}], "stream": stream}
    ).encode()


async def wait_for(engine: FakeEngine, condition: Callable[[EngineStatistics], bool]) -> None:
    """Wait (bounded) until *condition* holds for the engine's statistics: woken by each change."""
    with trio.fail_after(5):
        await engine.wait_until(condition)


class TestDisconnect:
    async def test_streaming_client_leaving_cancels_the_decode(
        self, app, script: FakeScript, fake_engine: FakeEngine
    ):
        """A streaming client that disconnects mid-way stops the generation and frees the slot."""
        script.reply = "word " * 500
        script.piece_delay = 0.01
        async with exchange(app.app, CHAT, body(stream=True)) as connection:
            await connection.receive_chunk()  # role chunk
            await connection.receive_chunk()  # first word
            assert fake_engine.statistics().requests_processing == 1
            await connection.disconnect()
        await wait_for(fake_engine, lambda s: s.requests_processing == 0)
        assert fake_engine.cancelled == 1
        assert fake_engine.statistics().slots[0].n_decoded < 500

    async def test_non_streaming_client_leaving_cancels_the_decode(
        self, app, script: FakeScript, fake_engine: FakeEngine
    ):
        """A non-streaming client that disconnects stops the generation too."""
        script.reply = "word " * 500
        script.piece_delay = 0.01
        async with exchange(app.app, CHAT, body(stream=False)) as connection:
            await wait_for(fake_engine, lambda s: s.slots[0].n_decoded >= 3)
            await connection.disconnect()
        await wait_for(fake_engine, lambda s: s.requests_processing == 0)
        assert fake_engine.cancelled == 1

    async def test_the_next_request_is_served_after_a_disconnect(self, app, script: FakeScript):
        """After a cancelled stream the slot serves the next request normally."""
        script.reply = "word " * 300
        script.piece_delay = 0.01
        async with exchange(app.app, CHAT, body(stream=True)) as connection:
            await connection.receive_chunk()
            await connection.disconnect()
        script.reply = "done"
        script.piece_delay = 0
        response = await app.test_client().post(CHAT, data=body(stream=False))
        assert (await response.get_json())["choices"][0]["message"]["content"] == "done"


class TestQueue:
    async def test_requests_wait_in_fifo_order(self, app, script: FakeScript, fake_engine: FakeEngine):
        """With one slot, concurrent requests are served one after another, first come first served."""
        script.piece_delay = 0.05
        script.reply = lambda request: f"reply {len(fake_engine.requests)} of three"
        order: list[str] = []
        client = app.test_client()

        async def ask(tag: str) -> None:
            response = await client.post(CHAT, data=body(stream=False))
            order.append(tag + ":" + (await response.get_json())["choices"][0]["message"]["content"])

        async with trio.open_nursery() as nursery:
            nursery.start_soon(ask, "a")
            await wait_for(fake_engine, lambda s: s.requests_processing == 1)
            nursery.start_soon(ask, "b")
            await wait_for(fake_engine, lambda s: s.requests_deferred == 1)
            nursery.start_soon(ask, "c")
            await wait_for(fake_engine, lambda s: s.requests_deferred == 2)
        assert order == ["a:reply 1 of three", "b:reply 2 of three", "c:reply 3 of three"]

    async def test_a_queued_client_leaving_does_not_touch_the_running_one(
        self, app, script: FakeScript, fake_engine: FakeEngine
    ):
        """A client that leaves while queued is dropped; the running generation completes whole."""
        script.reply = "word " * 40
        script.piece_delay = 0.01
        client = app.test_client()
        results: list[str] = []

        async def running() -> None:
            response = await client.post(CHAT, data=body(stream=False))
            results.append((await response.get_json())["choices"][0]["message"]["content"])

        async with trio.open_nursery() as nursery:
            nursery.start_soon(running)
            await wait_for(fake_engine, lambda s: s.requests_processing == 1)
            async with exchange(app.app, CHAT, body(stream=False)) as queued:
                await wait_for(fake_engine, lambda s: s.requests_deferred == 1)
                await queued.disconnect()
            await wait_for(fake_engine, lambda s: s.requests_deferred == 0)
        assert results == ["word " * 40]
        assert len(fake_engine.requests) == 1
        assert fake_engine.cancelled == 0


def last_frame(raw: bytes) -> tuple[str | None, dict]:
    """The stream's last SSE frame: its event name (None without one) and its data."""
    frame = [f for f in raw.decode().split("\n\n") if f.strip()][-1]
    lines = dict(line.split(": ", 1) for line in frame.splitlines())
    return lines.get("event"), json.loads(lines["data"])


class TestShutdownDeadline:
    """At the --shutdown-timeout deadline every request still running or waiting ends with a word."""

    async def test_running_and_queued_requests_end_with_each_dialects_error(
        self, app, script: FakeScript, fake_engine: FakeEngine
    ):
        """The running stream and queued streams end with their error event; a queued plain request gets 503."""
        script.reply = "word " * 2000
        script.piece_delay = 0.01
        chat = json.dumps({"model": "bubo", "messages": [{"role": "user", "content": "Go"}], "stream": True})
        message = json.dumps(
            {
                "model": "bubo",
                "max_tokens": 50,
                "messages": [{"role": "user", "content": "Go"}],
                "stream": True,
            }
        )
        response = json.dumps({"model": "bubo", "input": "Go", "stream": True})
        raws: dict[str, bytes] = {}
        async with (
            exchange(app.app, CHAT, chat.encode()) as running,
            trio.open_nursery() as nursery,
        ):
            await running.receive_chunk()
            for path, payload in (
                ("/v1/messages", message),
                ("/v1/responses", response),
                ("/completion", json.dumps({"prompt": "Go"})),
            ):

                async def read(path: str = path, payload: str = payload) -> None:
                    async with exchange(app.app, path, payload.encode()) as queued:
                        raws[path] = await queued.read_all()
                        raws[path + " status"] = str(queued.status).encode()

                nursery.start_soon(read)
            await wait_for(fake_engine, lambda s: s.requests_deferred == 3)
            await drain(app.app, grace_s=0.05)
            raws[CHAT] = await running.read_all()
        assert fake_engine.statistics().requests_processing == 0
        assert fake_engine.cancelled == 1
        event, data = last_frame(raws[CHAT])
        assert (event, data["error"]["code"], data["error"]["type"]) == (None, "not_ready", "server_error")
        assert "shutting down" in data["error"]["message"]
        event, data = last_frame(raws["/v1/messages"])
        assert (event, data["type"], data["error"]["type"]) == ("error", "error", "overloaded_error")
        event, data = last_frame(raws["/v1/responses"])
        assert (event, data["type"]) == ("response.failed", "response.failed")
        assert (data["response"]["error"]["code"], data["response"]["error"]["type"]) == (
            "server_error",
            "not_ready",
        )
        assert raws["/completion status"] == b"503"
        assert json.loads(raws["/completion"])["error"]["code"] == "not_ready"

    async def test_what_finishes_before_the_deadline_is_untouched(
        self, app, script: FakeScript, fake_engine: FakeEngine
    ):
        """Drain waits for the work to finish; with none left at the deadline nothing is interrupted."""
        script.reply = "word " * 20
        script.piece_delay = 0.01
        async with exchange(app.app, CHAT, body(stream=True)) as running:
            await running.receive_chunk()
            await drain(app.app, grace_s=10)
            raw = await running.read_all()
        assert raw.endswith(b"data: [DONE]\n\n")
        assert fake_engine.cancelled == 0
