"""Generated text, cut into tokens anywhere, through the parsers and every dialect's SSE encoder.

The pipeline is the server's own: engine events -> ``output_events`` (reasoning
and tool-call parsers) -> ``EventStreamBody`` with each dialect's encoder.
Invariants: nothing raises; every frame is one SSE event whose data the
official SDK's own models accept; each dialect's event grammar holds (roles
first, blocks opened before their deltas and closed once, sequence numbers
counting up, exactly one terminal event); the text, reasoning and tool-call
arguments the client reassembles are exactly what the parsers produced; the
finish reason says a limit cut the output even after a call; and the streamed
message or response holds the same blocks or items, in the same order, as the
non-streaming one built from the same output.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing, asynccontextmanager
from typing import Any

import attrs
import pydantic
import trio
from anthropic.lib.streaming._messages import accumulate_event
from anthropic.types import RawMessageStreamEvent
from hypothesis import given
from hypothesis import strategies as st
from openai.types.chat import ChatCompletionChunk
from openai.types.completion import Completion as OpenAICompletion
from openai.types.responses import ResponseStreamEvent

from bubo.api._converter import make_converter, structure
from bubo.api._json import unstructure
from bubo.api._sse import EventStreamBody, StreamEncoder
from bubo.api.anthropic import translate as anthropic_translate
from bubo.api.anthropic.stream import MessageStream
from bubo.api.openai.stream import ChatStream, CompletionStream, StreamIdentity
from bubo.api.responses import translate as responses_translate
from bubo.api.responses import wire as responses_wire
from bubo.api.responses.stream import ResponseStream
from bubo.api.responses.tools import OfferedTools
from bubo.domain.generation import (
    EngineEvent,
    GenerationFailed,
    GenerationFinished,
    GenerationStats,
    StopCause,
    TokenGenerated,
)
from bubo.domain.messages import ToolSpec
from bubo.domain.output import (
    Completion,
    OutputEvent,
    ReasoningDelta,
    TextDelta,
    ToolCallArgumentsDelta,
    ToolCallStart,
)
from bubo.engine import EngineFailure
from bubo.parsers import ParserConfig, available_tool_parsers
from bubo.service.generation import collect
from bubo.service.output import OutputPlan, output_events

from ._budget import run_fuzz

WEATHER = ToolSpec(
    name="get_weather",
    parameters={"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}},
)
# Pieces models really emit, so the random text often forms (or nearly forms) markers and calls.
FRAGMENTS = [
    "<think>", "</think>", "<tool_call>", "</tool_call>", "\n", " ", "{", "}", '"', "<", ">", "/",
    '{"name": "get_weather", "arguments": {"city": "Paris"}}', '{"name": ', '"arguments": ',
    '"get_weather"', '{"city": "Oslo", "days": 2}', "<function=get_weather>", "<parameter=city>",
    "<parameter=days>", "</parameter>", "</function>", "```json\n", "```", "Rome", "é", "🦉", "Hello",
]  # fmt: skip

outputs = st.lists(st.sampled_from(FRAGMENTS) | st.text(max_size=8), max_size=24).map("".join)
plans = st.builds(
    OutputPlan,
    reasoning=st.booleans(),
    starts_inside=st.booleans(),
    tool_format=st.none() | st.sampled_from(available_tool_parsers()),
    tool_config=st.builds(
        ParserConfig,
        tools=st.just((WEATHER,)),
        max_calls=st.sampled_from([None, 1]),
        new_id=st.just(lambda: "call_fuzz"),
    ),
)
endings = st.sampled_from([*StopCause, "failure"])


def engine_events(text: str, cuts: list[int], ending: StopCause | str) -> list[EngineEvent]:
    bounds = sorted({0, len(text), *(c for c in cuts if c <= len(text))})
    events: list[EngineEvent] = [
        TokenGenerated(token_id=i, text=text[a:b]) for i, (a, b) in enumerate(itertools.pairwise(bounds))
    ]
    if isinstance(ending, StopCause):
        stats = GenerationStats(
            prompt_tokens=5, completion_tokens=len(events), prompt_ms=1.0, predicted_ms=2.0
        )
        events.append(
            GenerationFinished(
                cause=ending, stats=stats, stop_word="x" if ending is StopCause.STOP_WORD else None
            )
        )
    else:
        events.append(GenerationFailed(error=EngineFailure("decode failed", fatal=True)))
    return events


@asynccontextmanager
async def open_output(
    events: list[EngineEvent], plan: OutputPlan, seen: list[OutputEvent]
) -> AsyncIterator[AsyncIterator[OutputEvent]]:
    send, receive = trio.open_memory_channel[EngineEvent](len(events))
    for event in events:
        send.send_nowait(event)
    send.close()

    async def recorded() -> AsyncIterator[OutputEvent]:
        async for event in output_events(receive, plan):
            seen.append(event)
            yield event

    yield recorded()


async def stream(
    encoder: StreamEncoder, events: list[EngineEvent], plan: OutputPlan
) -> tuple[list[OutputEvent], bytes]:
    seen: list[OutputEvent] = []
    body = bytearray()
    async with EventStreamBody(open_output(events, plan, seen), encoder) as frames:
        async for frame in frames:
            body.extend(frame)
    return seen, bytes(body)


def sse_events(body: bytes) -> list[tuple[str | None, str]]:
    """(event name, data) per frame; asserts the framing."""
    text = body.decode()
    assert text.endswith("\n\n")
    parsed = []
    for frame in text[:-2].split("\n\n"):
        lines = frame.split("\n")
        name = None
        if lines[0].startswith("event: "):
            name = lines.pop(0)[len("event: ") :]
        assert len(lines) == 1, frame
        assert lines[0].startswith("data: "), frame
        parsed.append((name, lines[0][len("data: ") :]))
    return parsed


@attrs.frozen
class Expected:
    """What the parsers produced, as a client should reassemble it."""

    text: str
    reasoning: str
    calls: dict[int, tuple[str, str]]  # index -> (name, arguments)
    failed: bool
    truncated: bool  # a limit ended the generation
    whole: Completion | None  # the same output gathered for a non-streaming response

    @property
    def finish_reason(self) -> str:
        """Truncation wins over calls (llama-server's rule)."""
        return "length" if self.truncated else "tool_calls" if self.calls else "stop"

    @classmethod
    def of(cls, seen: list[OutputEvent], events: list[EngineEvent], whole: Completion | None) -> Expected:
        calls: dict[int, list[str]] = {}
        names: dict[int, str] = {}
        for event in seen:
            if isinstance(event, ToolCallStart):
                names[event.index] = event.name
                calls[event.index] = []
            elif isinstance(event, ToolCallArgumentsDelta):
                calls[event.index].append(event.fragment)
        return cls(
            text="".join(e.text for e in seen if isinstance(e, TextDelta)),
            reasoning="".join(e.text for e in seen if isinstance(e, ReasoningDelta)),
            calls={i: (names[i], "".join(parts)) for i, parts in calls.items()},
            failed=isinstance(events[-1], GenerationFailed),
            truncated=isinstance(events[-1], GenerationFinished) and events[-1].cause.truncated,
            whole=whole,
        )


IDENTITY = StreamIdentity(id="chatcmpl-fuzz", created=0, model="m", fingerprint="b0")
chunk_adapter = pydantic.TypeAdapter(ChatCompletionChunk)
anthropic_adapter: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(RawMessageStreamEvent)
responses_adapter: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(ResponseStreamEvent)


def openai_payloads(body: bytes, expected: Expected) -> list[dict[str, Any]]:
    """The chunks; a failure ends the stream with an error object instead of ``[DONE]``."""
    frames = sse_events(body)
    if not expected.failed:
        assert frames.pop() == (None, "[DONE]")
    payloads = [json.loads(data) for _, data in frames]
    if expected.failed:
        error = payloads.pop()["error"]
        assert error["code"] == "engine_error"
        assert error["message"]
    return payloads


def check_chat(body: bytes, expected: Expected) -> None:
    payloads = openai_payloads(body, expected)
    for payload in payloads:
        chunk_adapter.validate_python(payload)
    if not expected.failed:  # include_usage: the usage chunk comes last, without choices
        usage = payloads.pop()
        assert usage["choices"] == []
        assert (
            usage["usage"]["total_tokens"]
            == usage["usage"]["prompt_tokens"] + usage["usage"]["completion_tokens"]
        )
    text, reasoning, calls = [], [], {}
    finish = [p["choices"][0]["finish_reason"] for p in payloads]
    for index, payload in enumerate(payloads):
        delta = payload["choices"][0]["delta"]
        assert ("role" in delta) == (index == 0)
        text.append(delta.get("content") or "")
        reasoning.append(delta.get("reasoning_content") or "")
        for call in delta.get("tool_calls") or []:
            if "id" in call:
                assert call["index"] not in calls
                calls[call["index"]] = (call["function"]["name"], [])
            calls[call["index"]][1].append(call["function"].get("arguments") or "")
    assert "".join(text) == expected.text
    assert "".join(reasoning) == expected.reasoning
    assert {i: (n, "".join(a)) for i, (n, a) in calls.items()} == expected.calls
    if not expected.failed:
        assert finish[-1] == expected.finish_reason
        assert all(f is None for f in finish[:-1])


def check_completion(body: bytes, expected: Expected) -> None:
    payloads = openai_payloads(body, expected)
    if not expected.failed:  # include_usage: the usage chunk comes last, without choices
        usage = payloads.pop()
        assert usage["choices"] == []
        pydantic.TypeAdapter(OpenAICompletion).validate_python(usage)
        assert usage["usage"]["completion_tokens"] >= 0
        assert payloads[-1]["choices"][0]["finish_reason"] == expected.finish_reason
        assert "usage" not in payloads[-1]
    for payload in payloads[:-1]:  # the SDK's type lacks the null finish_reason of chunks before the last
        assert payload["choices"][0]["finish_reason"] is None
        pydantic.TypeAdapter(OpenAICompletion).validate_python(
            {**payload, "choices": [{**payload["choices"][0], "finish_reason": "stop"}]}
        )
    if payloads and not expected.failed:
        pydantic.TypeAdapter(OpenAICompletion).validate_python(payloads[-1])
    text = "".join(p["choices"][0]["text"] for p in payloads)
    assert text == expected.text


def check_anthropic_blocks(payloads: list[dict[str, Any]]) -> None:
    """Blocks are opened in index order, receive only their own kind of delta, and are closed once."""
    delta_kinds = {
        "text": {"text_delta"},
        "thinking": {"thinking_delta", "signature_delta"},
        "tool_use": {"input_json_delta"},
    }
    open_block: str | None = None
    next_index = 0
    for payload in payloads:
        kind = payload["type"]
        if kind.startswith("content_block_"):
            assert payload["index"] == next_index
        if kind == "content_block_start":
            assert open_block is None
            open_block = payload["content_block"]["type"]
        elif kind == "content_block_delta":
            assert open_block is not None
            assert payload["delta"]["type"] in delta_kinds[open_block]
        elif kind == "content_block_stop":
            assert open_block is not None
            open_block, next_index = None, next_index + 1
        elif kind == "message_delta":
            assert open_block is None


def check_anthropic(body: bytes, expected: Expected) -> None:
    frames = sse_events(body)
    payloads = [json.loads(data) for _, data in frames]
    assert [p["type"] for p in payloads] == [name for name, _ in frames]
    if expected.failed:
        assert payloads.pop()["error"]["type"] == "api_error"
        if not payloads:
            return  # failed before the prompt was read: nothing but the error event
    else:
        assert [p["type"] for p in payloads[-2:]] == ["message_delta", "message_stop"]
    for payload in payloads:
        anthropic_adapter.validate_python(payload)
    check_anthropic_blocks(payloads)
    message = None  # reassembled exactly as the official SDK does
    json_buffers: dict[int, bytes] = {}
    for payload in payloads:
        message = accumulate_event(event=payload, current_snapshot=message, json_bufs=json_buffers)  # type: ignore[arg-type]
    assert message is not None
    blocks = [block.to_dict() for block in message.content]
    assert "".join(b["text"] for b in blocks if b["type"] == "text") == expected.text
    assert "".join(b["thinking"] for b in blocks if b["type"] == "thinking") == expected.reasoning
    calls = [(b["name"], b["input"]) for b in blocks if b["type"] == "tool_use"]
    assert calls == [(n, json.loads(a or "{}")) for _, (n, a) in sorted(expected.calls.items())]
    if not expected.failed:
        reason = {"length": "max_tokens", "tool_calls": "tool_use"}.get(expected.finish_reason)
        if reason is not None:
            assert message.stop_reason == reason
        else:
            assert message.stop_reason in ("end_turn", "stop_sequence")
        assert expected.whole is not None
        whole = anthropic_translate.message(expected.whole, message_id="msg_fuzz", model="m")
        assert [_without_id(b) for b in blocks] == [_without_id(unstructure(b)) for b in whole.content]
        assert message.stop_reason == whole.stop_reason


def _without_id(value: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in value.items() if k != "id"}


def check_responses(body: bytes, expected: Expected) -> None:
    frames = sse_events(body)
    payloads = [json.loads(data) for _, data in frames]
    assert [p["sequence_number"] for p in payloads] == list(range(len(payloads)))
    for name, payload in zip(frames, payloads, strict=True):
        assert payload["type"] == name[0]
        try:
            responses_adapter.validate_python(payload)
        except pydantic.ValidationError as error:
            raise AssertionError(payload) from error
    kinds = [p["type"] for p in payloads]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    if expected.failed:  # the error event, then response.failed
        assert kinds[-2:] == ["error", "response.failed"]
        kinds.pop()
    terminal = {"response.completed", "response.incomplete", "response.failed", "error"}
    assert kinds[-1] in terminal
    assert not terminal & set(kinds[:-1])
    assert (kinds[-1] in ("response.failed", "error")) == expected.failed
    if expected.failed:
        return
    final = payloads[-1]["response"]
    text = "".join(
        part["text"] for item in final["output"] if item["type"] == "message" for part in item["content"]
    )
    reasoning = "".join(
        part["text"]
        for item in final["output"]
        if item["type"] == "reasoning"
        for part in item.get("content") or []
    )
    calls = [(item["name"], item["arguments"]) for item in final["output"] if item["type"] == "function_call"]
    deltas = "".join(p["delta"] for p in payloads if p["type"] == "response.output_text.delta")
    assert text == deltas == expected.text
    assert reasoning == expected.reasoning
    assert [(n, json.loads(a or "{}")) for n, a in calls] == [
        (n, json.loads(a or "{}")) for _, (n, a) in sorted(expected.calls.items())
    ]
    assert expected.whole is not None
    whole = responses_translate.output_items(expected.whole, OfferedTools())
    assert [_without_id(item) for item in final["output"]] == [_without_id(unstructure(i)) for i in whole]
    if final["status"] == "incomplete" and final["output"][-1]["type"] == "message":
        assert final["output"][-1]["status"] == "incomplete"


async def gathered(seen: list[OutputEvent]) -> Completion:
    """The output events gathered as for a non-streaming response."""

    async def replay() -> AsyncIterator[OutputEvent]:
        for event in seen:
            yield event

    async with aclosing(replay()) as events:
        return await collect(events)


def responses_encoder() -> ResponseStream:
    body = structure(make_converter(), {"model": "m", "input": "hi"}, responses_wire.ResponsesRequest)
    return ResponseStream(body, response_id="resp_fuzz", created_at=0, model="m", on_finished=lambda *_: None)


DIALECTS: dict[str, tuple[Callable[[], StreamEncoder], Callable[[bytes, Expected], None]]] = {
    "chat": (lambda: ChatStream(IDENTITY, include_usage=True, logprobs=False), check_chat),
    "completion": (lambda: CompletionStream(IDENTITY, include_usage=True, logprobs=False), check_completion),
    "anthropic": (
        lambda: MessageStream(message_id="msg_fuzz", model="m", prompt_tokens=5, request_id="req_fuzz"),
        check_anthropic,
    ),
    "responses": (responses_encoder, check_responses),
}


async def test_every_dialect_streams_what_the_parsers_saw() -> None:
    @given(
        text=outputs,
        cuts=st.lists(st.integers(0, 200), max_size=16),
        plan=plans,
        ending=endings,
        dialect=st.sampled_from(sorted(DIALECTS)),
    )
    def example(text: str, cuts: list[int], plan: OutputPlan, ending: StopCause | str, dialect: str) -> None:
        make_encoder, check = DIALECTS[dialect]
        if dialect == "completion":
            plan = OutputPlan()  # raw completions parse nothing
        events = engine_events(text, cuts, ending)
        seen, body = trio.from_thread.run(stream, make_encoder(), events, plan)
        whole = None if ending == "failure" else trio.from_thread.run(gathered, seen)
        check(body, Expected.of(seen, events, whole))

    await run_fuzz(example)
