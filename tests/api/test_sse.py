"""The SSE response body: errors after the headers went out are events; silence is filled with keep-alives."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio

from bubo.api._sse import EventStreamBody
from bubo.api.anthropic.stream import MessageStream
from bubo.api.openai.stream import ChatStream, CompletionStream, StreamIdentity
from bubo.api.responses.stream import ResponseStream
from bubo.api.responses.wire import ResponsesRequest
from bubo.domain.generation import GenerationStats, StopCause
from bubo.domain.output import Done, OutputEvent, TextDelta
from bubo.engine import EngineFailure
from bubo.errors import DeviceLost

IDENTITY = StreamIdentity(id="chatcmpl-1", created=0, model="m", fingerprint="b0")


@asynccontextmanager
async def failing_on_entry(error: Exception) -> AsyncIterator[AsyncIterator[OutputEvent]]:
    raise error
    yield  # pragma: no cover


async def frames_of(body: EventStreamBody) -> list[bytes]:
    async with body as frames:
        return [frame async for frame in frames]


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (DeviceLost("the device was lost"), "device_lost"),
        (EngineFailure("llama_decode failed"), "engine_error"),
        (RuntimeError("a bug"), "internal_error"),
    ],
)
async def test_an_error_while_waiting_for_the_slot_is_an_error_event(error: Exception, code: str) -> None:
    """The slot wait happens after the 200 headers; its failure is reported in the stream."""
    encoder = ChatStream(IDENTITY, include_usage=False, logprobs=False)
    frames = await frames_of(EventStreamBody(failing_on_entry(error), encoder))
    assert len(frames) == 1
    assert frames[0].startswith(b"data: ")
    assert json.loads(frames[0][len(b"data: ") :])["error"]["code"] == code


def done_event() -> Done:
    return Done(finish_reason="stop", cause=StopCause.EOS, stats=GenerationStats(prompt_tokens=3))


@asynccontextmanager
async def slow_output(seconds: float, closed: list[bool]) -> AsyncIterator[AsyncIterator[OutputEvent]]:
    """A generation that waits *seconds* for its slot and prompt, then ends."""

    async def events() -> AsyncIterator[OutputEvent]:
        await trio.sleep(seconds)
        yield TextDelta(text="Hi")
        yield done_event()

    try:
        yield events()
    finally:
        closed.append(True)


def responses_stream() -> ResponseStream:
    body = ResponsesRequest(model="m", input="Hi")
    return ResponseStream(body, response_id="resp_1", created_at=0, model="m", on_finished=lambda *_: None)


class TestKeepAlive:
    @pytest.mark.parametrize(
        ("make_encoder", "keepalive", "in_opening"),
        [
            (lambda: ChatStream(IDENTITY, include_usage=False, logprobs=False), b": keep-alive\n\n", 0),
            (lambda: CompletionStream(IDENTITY, include_usage=False, logprobs=False), b": keep-alive\n\n", 0),
            (
                lambda: MessageStream(message_id="msg_1", model="m", prompt_tokens=3, request_id="r"),
                b'event: ping\ndata: {"type":"ping"}\n\n',
                0,
            ),
            (responses_stream, b"event: response.in_progress\n", 1),
        ],
        ids=["chat", "completions", "anthropic", "responses"],
    )
    async def test_a_silent_stream_sends_keep_alives(
        self, autojump_clock, make_encoder, keepalive, in_opening
    ) -> None:
        """Every dialect keeps a stream alive while the prompt is read: one keep-alive per silent interval."""
        closed: list[bool] = []
        body = EventStreamBody(slow_output(60, closed), make_encoder(), keepalive_s=5)
        frames = await frames_of(body)
        first_text = next(i for i, frame in enumerate(frames) if b"Hi" in frame)
        keepalives = sum(frame.startswith(keepalive) for frame in frames[:first_text]) - in_opening
        assert keepalives in (11, 12)  # 60 s of silence, 5 s apart (the last races the first text)
        assert closed == [True]

    async def test_no_keep_alive_while_output_flows(self, autojump_clock) -> None:
        """Frames that come within the interval reset it: none is sent."""
        closed: list[bool] = []
        encoder = ChatStream(IDENTITY, include_usage=False, logprobs=False)
        frames = await frames_of(EventStreamBody(slow_output(4, closed), encoder, keepalive_s=5))
        assert not any(frame.startswith(b":") for frame in frames)

    async def test_a_client_that_leaves_ends_the_generation(self, autojump_clock) -> None:
        """Leaving mid-stream cancels the producer task and closes the generation."""
        closed: list[bool] = []
        encoder = ChatStream(IDENTITY, include_usage=False, logprobs=False)
        body = EventStreamBody(slow_output(600, closed), encoder, keepalive_s=5)
        async with body as frames:
            async for frame in frames:
                if frame.startswith(b":"):
                    break
        assert closed == [True]


KEEPALIVE_ROUTES = [
    ("/v1/chat/completions", {"model": "bubo", "messages": [{"role": "user", "content": "Hi"}], "stream": True}, b": keep-alive\n\n"),
    ("/v1/completions", {"model": "bubo", "prompt": "Hi", "stream": True}, b": keep-alive\n\n"),
    ("/completion", {"prompt": "Hi", "stream": True}, b": keep-alive\n\n"),
    ("/v1/messages", {"model": "bubo", "max_tokens": 8, "messages": [{"role": "user", "content": "Hi"}], "stream": True}, b"event: ping\n"),
    ("/v1/responses", {"model": "bubo", "input": "Hi", "stream": True}, b"event: response.in_progress\n"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("path", "body", "keepalive"), KEEPALIVE_ROUTES, ids=[r[0] for r in KEEPALIVE_ROUTES]
)
async def test_every_streaming_route_keeps_a_long_prefill_alive(
    settings, make_runtime, script, path: str, body: dict, keepalive: bytes
) -> None:
    """With --sse-keepalive, a prompt read for longer than the interval sends keep-alives before the answer."""
    import attrs

    from bubo.server import create_app

    from .._asgi import post_stream
    from ..conftest import wait_until_ready

    script.prefill_delay = 0.6
    settings = attrs.evolve(settings, server=attrs.evolve(settings.server, sse_keepalive=0.05))
    app = create_app(settings, load=lambda _s, _p: make_runtime(), on_load_failure=lambda: None)
    async with app.test_app():
        await wait_until_ready(app)
        raw = await post_stream(app, path, body)
    frames = [frame + b"\n\n" for frame in raw.split(b"\n\n") if frame]
    answer = next(i for i, frame in enumerate(frames) if b"Hello" in frame)
    assert sum(frame.startswith(keepalive) for frame in frames[:answer]) >= 3
