"""The SSE response body: errors after the headers went out are events, never a cut connection."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from bubo.api._sse import EventStreamBody
from bubo.api.openai.stream import ChatStream, StreamIdentity
from bubo.domain.output import OutputEvent
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
