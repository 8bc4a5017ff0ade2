"""Responses streaming: the full event sequence, with sequence numbers.

``response.created``, ``response.in_progress``; per output item
``response.output_item.added``, its content (``response.content_part.added``,
``response.output_text.delta``/``.done``, ``response.reasoning_text.delta``/
``.done``, ``response.function_call_arguments.delta``/``.done``,
``response.content_part.done``) and ``response.output_item.done``; then
``response.completed`` (or ``response.incomplete``) with the whole response.
An error after the headers is an ``error`` event and ``response.failed``;
while nothing else is sent, ``response.in_progress`` is repeated as a keep-alive.

llama-server's telemetry rides on the events as it sends it: with
``return_progress`` each prompt chunk evaluated is a ``response.in_progress``
carrying ``prompt_progress``; with ``timings_per_token`` every delta event
carries the ``timings`` so far; the last event carries the generation's
``timings`` always.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import attrs

from bubo.api._json import dumps, unstructure
from bubo.api._progress import LiveTimings, progress
from bubo.api._sse import sse_frame
from bubo.api._usage import timings
from bubo.domain.ids import new_id
from bubo.domain.messages import Message, ToolCall
from bubo.domain.output import (
    Done,
    OutputEvent,
    PromptProgress,
    ReasoningDelta,
    TextDelta,
    ToolCallArgumentsDelta,
    ToolCallStart,
)
from bubo.errors import BuboError

from . import translate, wire
from ._custom_input import CustomInput
from .tools import OfferedTools

__all__ = ["ResponseStream"]

OnFinished = Callable[[wire.Response, Message], None]


def failure(error: BuboError) -> dict[str, Any]:
    """``response.error`` for *error*, Bubo's code as its ``type``.

    The ``code`` is OpenAI's: ``server_error``, which clients retry, or ``invalid_prompt``, which they do not.
    """
    code = "server_error" if error.status >= 500 else "invalid_prompt"
    return {"code": code, "message": error.message, "param": error.param, "type": error.code}


class _OpenItem:
    """The output item being streamed."""

    def __init__(self, kind: str, item_id: str, output_index: int) -> None:
        self.kind = kind  # "reasoning", "message" or "function_call"
        self.id = item_id
        self.output_index = output_index
        self.text: list[str] = []
        self.call: ToolCall | None = None
        self.custom_input: CustomInput | None = None  # a custom tool's input, decoded as it streams


class ResponseStream:
    """Encodes output events as Responses stream events."""

    def __init__(
        self,
        body: wire.ResponsesRequest,
        *,
        response_id: str,
        created_at: int,
        model: str,
        on_finished: OnFinished,
        tools: OfferedTools | None = None,
    ) -> None:
        self._body = body
        self._tools = tools or OfferedTools()
        self._response_id = response_id
        self._created_at = created_at
        self._model = model
        self._on_finished = on_finished
        self._sequence = 0
        self._items: list[wire.OutputItem] = []
        self._open: _OpenItem | None = None
        self._return_progress = bool(body.return_progress)
        self._live = LiveTimings() if body.timings_per_token else None

    def _event(self, name: str, data: dict[str, Any]) -> bytes:
        frame = sse_frame(dumps({"type": name, "sequence_number": self._sequence, **data}), event=name)
        self._sequence += 1
        return frame

    def _response(self, done: Done | None) -> wire.Response:
        return translate.response(
            self._body,
            response_id=self._response_id,
            created_at=self._created_at,
            model=self._model,
            output=list(self._items),
            done=done,
        )

    def opening(self) -> Iterable[bytes]:
        """``response.created`` and ``response.in_progress``."""
        in_progress = {"response": unstructure(self._response(None))}
        yield self._event("response.created", in_progress)
        yield self._event("response.in_progress", in_progress)

    def _add(self, kind: str, item: wire.OutputItem, part: dict[str, Any] | None) -> Iterator[bytes]:
        yield from self._close()
        self._open = _OpenItem(kind, item.id, len(self._items))
        yield self._event(
            "response.output_item.added", {"output_index": self._open.output_index, "item": unstructure(item)}
        )
        if part is not None:
            yield self._event("response.content_part.added", {**self._where(), "part": part})

    def _where(self) -> dict[str, Any]:
        assert self._open is not None
        return {"item_id": self._open.id, "output_index": self._open.output_index, "content_index": 0}

    def _close(self, done: Done | None = None) -> Iterator[bytes]:
        """End the open item; *done* when the generation ended with it (a cut item is incomplete)."""
        current = self._open
        if current is None:
            return
        self._open = None
        where = {"item_id": current.id, "output_index": current.output_index, "content_index": 0}
        text = "".join(current.text)
        status = "completed" if done is None else translate.closing_status(done, current.kind)
        item: wire.OutputItem
        if current.kind == "reasoning":
            item = translate.reasoning_item(current.id, text, status)
            yield self._event("response.reasoning_text.done", {**where, "text": text})
            yield self._event(
                "response.content_part.done", {**where, "part": {"type": "reasoning_text", "text": text}}
            )
        elif current.kind == "message":
            item = translate.message_item(current.id, text, status)
            yield self._event("response.output_text.done", {**where, "text": text, "logprobs": []})
            part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
            yield self._event("response.content_part.done", {**where, "part": part})
        else:
            assert current.call is not None
            call = ToolCall(id=current.call.id, name=current.call.name, arguments=text)
            item = translate.function_call_item(current.id, call, self._tools)
            at = {"item_id": current.id, "output_index": current.output_index}
            if isinstance(item, wire.CustomToolCallOut):
                yield self._event("response.custom_tool_call_input.done", {**at, "input": item.input})
            else:
                yield self._event(
                    "response.function_call_arguments.done", {**at, "arguments": text, "name": call.name}
                )
        self._items.append(item)
        yield self._event(
            "response.output_item.done", {"output_index": current.output_index, "item": unstructure(item)}
        )

    def _delta(self, name: str, data: dict[str, Any]) -> bytes:
        """A delta event, with the ``timings`` so far under ``timings_per_token``."""
        if self._live is not None:
            data = {**data, "timings": unstructure(self._live.now())}
        return self._event(name, data)

    def _progress(self, event: PromptProgress) -> bytes:
        """``response.in_progress`` with ``prompt_progress`` (and the timings so far)."""
        data: dict[str, Any] = {
            "response": unstructure(self._response(None)),
            "prompt_progress": unstructure(progress(event)),
        }
        if self._live is not None:
            data["timings"] = unstructure(self._live.now())
        return self._event("response.in_progress", data)

    def encode(self, event: OutputEvent) -> Iterable[bytes]:
        """Frames for one output event."""
        if self._live is not None:
            self._live.saw(event)
        if isinstance(event, PromptProgress):
            if self._return_progress:
                yield self._progress(event)
            return
        yield from self._output(event)

    def _output(self, event: OutputEvent) -> Iterator[bytes]:
        """Frames for one event of the answer."""
        match event:
            case ReasoningDelta(text=text) if text:
                if self._open is None or self._open.kind != "reasoning":
                    item_id = new_id("rs_")
                    part: dict[str, Any] = {"type": "reasoning_text", "text": ""}
                    yield from self._add(
                        "reasoning", translate.reasoning_item(item_id, "", "in_progress"), part
                    )
                assert self._open is not None
                self._open.text.append(text)
                yield self._delta("response.reasoning_text.delta", {**self._where(), "delta": text})
            case TextDelta(text=text) if text:
                if self._open is None or self._open.kind != "message":
                    item_id = new_id("msg_")
                    part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
                    yield from self._add("message", translate.message_item(item_id, "", "in_progress"), part)
                assert self._open is not None
                self._open.text.append(text)
                yield self._delta(
                    "response.output_text.delta", {**self._where(), "delta": text, "logprobs": []}
                )
            case ToolCallStart(id=call_id, name=name):
                custom = name in self._tools.custom
                item_id = new_id("ctc_" if custom else "fc_")
                call = ToolCall(id=call_id, name=name, arguments="")
                item = translate.function_call_item(item_id, call, self._tools, "in_progress")
                yield from self._add("function_call", item, None)
                assert self._open is not None
                self._open.call = call
                self._open.custom_input = CustomInput() if custom else None
            case ToolCallArgumentsDelta(fragment=fragment) if (
                self._open is not None and self._open.kind == "function_call"
            ):
                self._open.text.append(fragment)
                at = {"item_id": self._open.id, "output_index": self._open.output_index}
                if self._open.custom_input is None:
                    yield self._delta("response.function_call_arguments.delta", {**at, "delta": fragment})
                elif delta := self._open.custom_input.feed(fragment):
                    yield self._delta("response.custom_tool_call_input.delta", {**at, "delta": delta})
            case Done():
                yield from self._finish(event)

    def _finish(self, done: Done) -> Iterator[bytes]:
        yield from self._close(done)
        self._items = translate.answered(self._items, done)
        response = self._response(done)
        name = "response.completed" if response.status == "completed" else "response.incomplete"
        yield self._event(
            name, {"response": unstructure(response), "timings": unstructure(timings(done.stats))}
        )
        self._on_finished(response, translate.assistant_message(self._items))

    def keepalive(self) -> Iterable[bytes]:
        """``response.in_progress`` again, with the output so far."""
        yield self._event("response.in_progress", {"response": unstructure(self._response(None))})

    def error(self, error: BuboError) -> Iterable[bytes]:
        """An ``error`` event, then ``response.failed`` with the error's code; the stream ends there.

        Codex skips a bare ``error`` event and reads ``response.failed``'s code to
        decide whether to retry (see :func:`failure`).
        """
        yield self._event("error", {"code": error.code, "message": error.message, "param": error.param})
        failed = attrs.evolve(self._response(None), status="failed", error=failure(error))
        yield self._event("response.failed", {"response": unstructure(failed)})
