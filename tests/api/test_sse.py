"""The SSE response body: errors after the headers went out are events; silence is filled with keep-alives."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import pytest
import trio

from bubo.api._sse import EventStreamBody
from bubo.api.anthropic.stream import MessageStream
from bubo.api.ollama.stream import ChatChunks, NdjsonStream
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


@asynccontextmanager
async def queued_output(
    queued: float, reading: float, closed: list[bool]
) -> AsyncIterator[AsyncIterator[OutputEvent]]:
    """A generation that waits *queued* seconds for its slot, then *reading* for its prompt."""
    await trio.sleep(queued)
    try:
        yield slow_output_events(reading)
    finally:
        closed.append(True)


async def slow_output_events(seconds: float) -> AsyncIterator[OutputEvent]:
    await trio.sleep(seconds)
    yield TextDelta(text="Hi")
    yield done_event()


@asynccontextmanager
async def released_late(seconds: float, closed: list[bool]) -> AsyncIterator[AsyncIterator[OutputEvent]]:
    """A generation that ends at once, whose slot is released *seconds* later."""

    async def events() -> AsyncIterator[OutputEvent]:
        yield done_event()

    try:
        yield events()
        await trio.sleep(seconds)
    finally:
        closed.append(True)


def responses_stream() -> ResponseStream:
    body = ResponsesRequest(model="m", input="Hi")
    return ResponseStream(body, response_id="resp_1", created_at=0, model="m", on_finished=lambda *_: None)


def is_comment(frame: bytes) -> bool:
    return frame == b": keep-alive\n\n"


def data_of(frame: bytes) -> dict | None:
    """The JSON of a ``data:`` frame (None for anything else)."""
    if not frame.startswith(b"data: {"):
        return None
    parsed: dict = json.loads(frame[len(b"data: ") :])
    return parsed


def is_empty_delta(frame: bytes) -> bool:
    chunk = data_of(frame)
    return chunk is not None and chunk["choices"] == [{"index": 0, "delta": {}, "finish_reason": None}]


def is_empty_text(frame: bytes) -> bool:
    chunk = data_of(frame)
    return chunk is not None and chunk["choices"] == [
        {"index": 0, "text": "", "logprobs": None, "finish_reason": None}
    ]


def is_role(frame: bytes) -> bool:
    chunk = data_of(frame)
    return chunk is not None and [c["delta"] for c in chunk["choices"]] == [
        {"role": "assistant", "content": None}
    ]


class TestKeepAlive:
    @pytest.mark.parametrize(
        ("make_encoder", "is_keepalive", "in_opening"),
        [
            (lambda: ChatStream(IDENTITY, include_usage=False, logprobs=False), is_empty_delta, 0),
            (lambda: CompletionStream(IDENTITY, include_usage=False, logprobs=False), is_empty_text, 0),
            (
                lambda: MessageStream(message_id="msg_1", model="m", prompt_tokens=3, request_id="r"),
                lambda frame: frame == b'event: ping\ndata: {"type":"ping"}\n\n',
                0,
            ),
            (responses_stream, lambda frame: frame.startswith(b"event: response.in_progress\n"), 1),
        ],
        ids=["chat", "completions", "anthropic", "responses"],
    )
    async def test_a_silent_stream_sends_keep_alives(
        self, autojump_clock, make_encoder, is_keepalive, in_opening
    ) -> None:
        """Every dialect keeps a stream alive while the prompt is read: one keep-alive per silent interval,
        a frame its clients parse (chat: an empty delta; completions: an empty text), never a comment."""
        closed: list[bool] = []
        body = EventStreamBody(slow_output(60, closed), make_encoder(), keepalive_s=5)
        frames = await frames_of(body)
        first_text = next(i for i, frame in enumerate(frames) if b"Hi" in frame)
        keepalives = sum(map(is_keepalive, frames[:first_text])) - in_opening
        assert keepalives in (11, 12)  # 60 s of silence, 5 s apart (the last races the first text)
        assert not any(map(is_comment, frames))
        assert closed == [True]

    async def test_the_first_chat_keep_alive_while_queued_is_the_role_chunk(self, autojump_clock) -> None:
        """A request waiting for its slot gets the role chunk as its first keep-alive, then empty deltas;
        the role is sent once, first (the OpenAI Python SDK's helper would join a repeated role)."""
        closed: list[bool] = []
        encoder = ChatStream(IDENTITY, include_usage=True, logprobs=False)
        frames = await frames_of(EventStreamBody(queued_output(12, 12, closed), encoder, keepalive_s=5))
        assert is_role(frames[0])
        assert sum(map(is_role, frames)) == 1
        first_text = next(i for i, frame in enumerate(frames) if b"Hi" in frame)
        assert sum(map(is_empty_delta, frames[1:first_text])) in (3, 4)  # 24 s, the first 5 s one the role
        finish = [data_of(frame) for frame in frames if data_of(frame) and data_of(frame)["choices"]]
        assert [c["choices"][0]["finish_reason"] for c in finish].count("stop") == 1
        assert finish[-1]["choices"][0]["finish_reason"] == "stop"  # nothing with choices after the finish
        assert data_of(frames[-2])["usage"] is not None  # the usage chunk is still the last before [DONE]
        assert frames[-1] == b"data: [DONE]\n\n"

    @pytest.mark.parametrize(
        "make_encoder",
        [
            lambda: ChatStream(IDENTITY, include_usage=True, logprobs=False),
            lambda: CompletionStream(IDENTITY, include_usage=True, logprobs=False),
            lambda: MessageStream(message_id="msg_1", model="m", prompt_tokens=3, request_id="r"),
            responses_stream,
            lambda: NdjsonStream(ChatChunks(model="m", received=0.0, top_logprobs=False)),
        ],
        ids=["chat", "completions", "anthropic", "responses", "ollama"],
    )
    async def test_nothing_follows_the_last_event(self, autojump_clock, make_encoder) -> None:
        """A slot released 60 s after the answer ended sends no keep-alive after the end: the finish chunk,
        usage and ``[DONE]``, ``message_stop``, ``response.completed`` or the ``done`` line stays last."""
        alone = make_encoder()
        expected = len(list(alone.opening())) + len(list(alone.encode(done_event())))  # no keep-alive
        closed: list[bool] = []
        frames = await frames_of(EventStreamBody(released_late(60, closed), make_encoder(), keepalive_s=5))
        assert len(frames) == expected
        assert closed == [True]

    async def test_an_ollama_keep_alive_is_an_empty_line_of_the_stream(self) -> None:
        """An NDJSON keep-alive is a ``done: false`` chunk with empty content."""
        encoder = NdjsonStream(ChatChunks(model="m", received=0.0, top_logprobs=False))
        list(encoder.opening())
        (idle,) = encoder.keepalive()
        assert json.loads(idle) == {
            "model": "m", "created_at": json.loads(idle)["created_at"], "message": {"role": "assistant", "content": ""},
            "done": False,
        }  # fmt: skip

    async def test_no_keep_alive_while_output_flows(self, autojump_clock) -> None:
        """Frames that come within the interval reset it: none is sent."""
        closed: list[bool] = []
        encoder = ChatStream(IDENTITY, include_usage=False, logprobs=False)
        frames = await frames_of(EventStreamBody(slow_output(4, closed), encoder, keepalive_s=5))
        assert not any(map(is_empty_delta, frames))

    async def test_a_client_that_leaves_ends_the_generation(self, autojump_clock) -> None:
        """Leaving mid-stream cancels the producer task and closes the generation."""
        closed: list[bool] = []
        encoder = ChatStream(IDENTITY, include_usage=False, logprobs=False)
        body = EventStreamBody(slow_output(600, closed), encoder, keepalive_s=5)
        async with body as frames:
            async for frame in frames:
                if is_empty_delta(frame):
                    break
        assert closed == [True]


def is_progress(frame: bytes) -> bool:
    chunk = data_of(frame)
    """The first ``prompt_progress`` chunk (none of the prompt read yet), or the same again."""
    return chunk is not None and (chunk.get("prompt_progress") or {}).get("processed") == 0


def ndjson_idle(field: str) -> Callable[[bytes], bool]:
    """An Ollama keep-alive line: ``done: false`` and nothing in *field* (``message`` or ``response``)."""

    def idle(frame: bytes) -> bool:
        chunk = json.loads(frame)
        empty = {"role": "assistant", "content": ""} if field == "message" else ""
        return (
            chunk["done"] is False
            and chunk[field] == empty
            and set(chunk) == {"model", "created_at", field, "done"}
        )

    return idle


CHAT = {"model": "bubo", "messages": [{"role": "user", "content": "Hi"}], "stream": True}
KEEPALIVE_ROUTES = [
    ("/v1/chat/completions", CHAT, is_empty_delta),
    ("/v1/completions", {"model": "bubo", "prompt": "Hi", "stream": True}, is_empty_text),
    ("/completion", {"prompt": "Hi", "stream": True}, is_comment),
    ("/completion", {"prompt": "Hi", "stream": True, "return_progress": True}, is_progress),
    ("/v1/messages", {**CHAT, "max_tokens": 8}, lambda frame: frame.startswith(b"event: ping\n")),
    ("/v1/responses", {"model": "bubo", "input": "Hi", "stream": True}, lambda frame: frame.startswith(b"event: response.in_progress\n")),
    ("/api/chat", {"model": "bubo", "messages": [{"role": "user", "content": "Hi"}]}, ndjson_idle("message")),
    ("/api/generate", {"model": "bubo", "prompt": "Hi"}, ndjson_idle("response")),
]  # fmt: skip
ROUTE_IDS = [
    f"{path}{'+progress' if 'return_progress' in body else ''}" for path, body, _ in KEEPALIVE_ROUTES
]


@pytest.mark.parametrize(("path", "body", "is_keepalive"), KEEPALIVE_ROUTES, ids=ROUTE_IDS)
async def test_every_streaming_route_keeps_a_long_prefill_alive(
    settings, make_runtime, script, path: str, body: dict, is_keepalive: Callable[[bytes], bool]
) -> None:
    """With --sse-keepalive, a prompt read for longer than the interval sends keep-alives before the answer:
    each dialect's own (llama-server's /completion a comment, or its last prompt_progress chunk again when
    the client asked for progress; Ollama's NDJSON an empty ``done: false`` line), and none after the end."""
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
    if path.startswith("/api/"):
        frames = raw.splitlines()
    else:
        frames = [frame + b"\n\n" for frame in raw.split(b"\n\n") if frame]
    answer = next(i for i, frame in enumerate(frames) if b"Hello" in frame)
    assert sum(map(is_keepalive, frames[:answer])) >= 3
    assert not any(map(is_keepalive, frames[answer:]))
