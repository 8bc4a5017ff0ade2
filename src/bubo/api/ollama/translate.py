"""Ollama wire ↔ domain: chat and generate requests down, answers up.

Ollama's semantics kept here: ``stream`` defaults to true; tool-call
``arguments`` are JSON objects both ways; ``done_reason`` is ``stop`` or
``length`` (never ``tool_calls``); durations are integer nanoseconds; every
chunk's ``message.content`` is a string, empty when there is no text.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import re
from collections.abc import Sequence
from typing import Any

import attrs

from bubo.api._images import ImageCollector
from bubo.api._nesting import check_value_depth
from bubo.api._numbers import INT32_MAX
from bubo.api._omitted import Omissions
from bubo.domain.generation import GenerationStats, TokenLogprob
from bubo.domain.ids import new_tool_call_id
from bubo.domain.media import DEFAULT_MEDIA_MARKER
from bubo.domain.messages import ChatPrompt, Message, Role, ToolCall, ToolSpec
from bubo.domain.output import Done
from bubo.domain.requests import ChatRequest, CompletionRequest, OutputFormat
from bubo.errors import InvalidRequest, UnsupportedContent

from . import wire
from .options import generation_options, reasoning

__all__ = [
    "Clock",
    "chat_request",
    "check_context",
    "created_at",
    "done_reason",
    "generate_chat_request",
    "logprobs",
    "output_format",
    "raw_request",
    "rfc3339",
    "streams",
    "tool_call_out",
]

logger = logging.getLogger(__name__)

_ROLES: tuple[Role, ...] = ("system", "user", "assistant", "tool")
_NS_PER_MS = 1_000_000
_NS_PER_S = 1_000_000_000
_MAX_TOP_LOGPROBS = 20


def streams(stream: bool | None) -> bool:
    """Ollama streams unless ``stream`` is ``false``."""
    return stream is not False


def rfc3339(seconds: float) -> str:
    """A Unix time as RFC 3339 in UTC with microseconds (``2024-06-04T14:38:31.837530Z``)."""
    moment = dt.datetime.fromtimestamp(seconds, tz=dt.UTC)
    return moment.isoformat(timespec="microseconds").replace("+00:00", "Z")


def created_at() -> str:
    """Now, as every chunk's ``created_at``."""
    return rfc3339(dt.datetime.now(tz=dt.UTC).timestamp())


@attrs.frozen(kw_only=True)
class Clock:
    """When a request arrived and when its generation got a slot (trio's clock, seconds)."""

    received: float
    loaded: float

    def metrics(self, stats: GenerationStats, now: float) -> dict[str, int]:
        """The final chunk's counts and integer-nanosecond durations."""
        return {
            "total_duration": round((now - self.received) * _NS_PER_S),
            "load_duration": round((self.loaded - self.received) * _NS_PER_S),
            "prompt_eval_count": stats.prompt_tokens,
            "prompt_eval_duration": round(stats.prompt_ms * _NS_PER_MS),
            "eval_count": stats.completion_tokens,
            "eval_duration": round(stats.predicted_ms * _NS_PER_MS),
        }

    def embed_metrics(self, n_tokens: int, now: float) -> dict[str, int]:
        """``/api/embed``'s durations and the number of tokens embedded."""
        return {
            "total_duration": round((now - self.received) * _NS_PER_S),
            "load_duration": round((self.loaded - self.received) * _NS_PER_S),
            "prompt_eval_count": n_tokens,
        }


def done_reason(done: Done) -> str:
    """``length`` when a limit cut the answer, else ``stop`` (tool calls end with ``stop`` too)."""
    return "length" if done.cause.truncated else "stop"


def output_format(value: Any) -> OutputFormat | None:
    """``format``: ``"json"`` (a JSON object), a JSON schema, or nothing (``""``, ``null``).

    Raises:
        InvalidRequest: anything else; ``param`` ``format``.

    """
    if value is None or value == "":
        return None
    if value == "json":
        return OutputFormat(schema={"type": "object"}, param="format")
    if isinstance(value, dict):
        return OutputFormat(schema=value, param="format")
    raise InvalidRequest('format must be "json" or a JSON schema object', param="format")


def _n_probs(want: bool | None, top: int | None) -> int | None:
    if top is not None and not 0 <= top <= _MAX_TOP_LOGPROBS:
        raise InvalidRequest(f"top_logprobs must be between 0 and {_MAX_TOP_LOGPROBS}", param="top_logprobs")
    return (top or 0) if want else None


def _no_images(images: list[str] | None, param: str) -> None:
    if images:
        raise UnsupportedContent("image", param=param)


_IMAGE_SLOT = "[img]"


def _with_images(text: str, images: list[str] | None, param: str, collector: ImageCollector) -> str:
    """*text* with its *images* placed as Ollama places them (a text model: a 400 naming *param*).

    Each image takes the next ``[img]`` the text holds; those left over go
    before the text, in order (Ollama writes ``[img-0][img-1]…`` in front).
    """
    if not images:
        return text
    if not collector.takes_images:
        raise UnsupportedContent("image", param=param)
    slots = text.split(_IMAGE_SLOT, len(images))
    n_slotted = len(slots) - 1
    # collected in the order the text holds them: the ones in front, then the slotted ones
    before = [collector.base64(images[n], f"{param}[{n}]") for n in range(n_slotted, len(images))]
    slotted = [collector.base64(images[n], f"{param}[{n}]") for n in range(n_slotted)]
    pieces = [*before, slots[0]]
    for marker, piece in zip(slotted, slots[1:], strict=True):
        pieces += [marker, piece]
    return "".join(pieces)


_RAW_IMAGE_TAG = re.compile(r"\[img-(0|[1-9][0-9]*)\]")


def _raw_with_images(prompt: str, images: list[str], collector: ImageCollector) -> str:
    """A raw prompt whose ``[img-N]`` tags place ``images[N]``, as Ollama reads them.

    The first ``[img-N]`` of each image is its place; a tag naming no image stays text.

    Raises:
        InvalidRequest: an image the prompt has no tag for (``param`` ``images[N]``).

    """
    places: dict[int, re.Match[str]] = {}
    for match in _RAW_IMAGE_TAG.finditer(prompt):
        number = int(match.group(1))
        if number < len(images):
            places.setdefault(number, match)
    missing = next((n for n in range(len(images)) if n not in places), None)
    if missing is not None:
        raise InvalidRequest(
            f"a raw prompt places each image with its tag: [img-{missing}] is not in the prompt",
            param=f"images[{missing}]",
        )
    pieces: list[str] = []
    end = 0
    for number, match in sorted(places.items(), key=lambda item: item[1].start()):
        pieces += [prompt[end : match.start()], collector.base64(images[number], f"images[{number}]")]
        end = match.end()
    pieces.append(prompt[end:])
    return "".join(pieces)


def _arguments(arguments: dict[str, Any] | None, param: str) -> str:
    check_value_depth(arguments or {}, param)
    return json.dumps(arguments or {}, ensure_ascii=False)


def _message(message: wire.Message, index: int, pending: list[ToolCall], images: ImageCollector) -> Message:
    """One message; *pending*: the assistant's calls not yet answered (a ``tool`` reply takes one)."""
    param = f"messages[{index}]"
    role = message.role.lower()
    if role not in _ROLES:
        raise InvalidRequest(
            f"role {message.role!r} is not one of system, user, assistant, tool", param=f"{param}.role"
        )
    if message.images:
        content = _with_images(message.content or "", message.images, f"{param}.images", images)
        message = attrs.evolve(message, content=content)
    if role == "assistant":
        calls = tuple(
            ToolCall(
                id=call.id or new_tool_call_id(),
                name=call.function.name,
                arguments=_arguments(call.function.arguments, f"{param}.tool_calls[{i}].function.arguments"),
            )
            for i, call in enumerate(message.tool_calls or ())
        )
        pending[:] = list(calls)
        return Message(
            role="assistant", content=message.content or None, reasoning=message.thinking, tool_calls=calls
        )
    if role == "tool":
        answered = next(
            (c for c in pending if c.id == message.tool_call_id or c.name == message.tool_name), None
        )
        if answered is not None:
            pending.remove(answered)
        call_id = message.tool_call_id or (answered.id if answered is not None else None)
        return Message(
            role="tool", content=message.content or "", tool_call_id=call_id, name=message.tool_name
        )
    return Message(role=role, content=message.content or "")


def _tools(tools: Sequence[wire.Tool]) -> tuple[ToolSpec, ...]:
    return tuple(
        ToolSpec(
            name=tool.function.name,
            description=tool.function.description,
            parameters=tool.function.parameters or {"type": "object", "properties": {}},
            param=f"tools[{index}].function.parameters",
        )
        for index, tool in enumerate(tools)
    )


def chat_request(body: wire.ChatRequest, *, takes_images: bool = False) -> ChatRequest:
    """The domain request for ``/api/chat`` (its ``messages`` are non-empty: the route answers empty ones).

    *takes_images*: the model reads each message's ``images`` (base64), placed as
    Ollama places them; a text model refuses them.

    Raises:
        InvalidRequest: an unknown role, images (a text model) or bad base64, a bad option,
            ``format`` or ``top_logprobs``.

    """
    pending: list[ToolCall] = []
    images = ImageCollector(Omissions(), takes_images=takes_images)
    messages = tuple(_message(m, i, pending, images) for i, m in enumerate(body.messages or ()))
    return ChatRequest(
        prompt=ChatPrompt(
            messages=messages,
            tools=_tools(body.tools or ()),
            images=images.images,
            media_marker=images.marker,
        ),
        options=generation_options(body.options, n_probs=_n_probs(body.logprobs, body.top_logprobs)),
        reasoning=reasoning(body.think),
        output_format=output_format(body.format),
    )


def generate_chat_request(body: wire.GenerateRequest, *, takes_images: bool = False) -> ChatRequest:
    """``/api/generate`` with a template: ``system`` and ``prompt`` as a system and a user message.

    *takes_images*: the model reads ``images``, placed in the user message as ``/api/chat`` places them.

    Raises:
        InvalidRequest: images (a text model) or bad base64, a bad option, ``format`` or ``top_logprobs``.

    """
    images = ImageCollector(Omissions(), takes_images=takes_images)
    turns = [Message(role="system", content=body.system)] if body.system else []
    turns.append(Message(role="user", content=_with_images(body.prompt or "", body.images, "images", images)))
    return ChatRequest(
        prompt=ChatPrompt(messages=tuple(turns), images=images.images, media_marker=images.marker),
        options=generation_options(body.options, n_probs=_n_probs(body.logprobs, body.top_logprobs)),
        reasoning=reasoning(body.think),
        output_format=output_format(body.format),
    )


def raw_request(
    body: wire.GenerateRequest, prompt: tuple[int | str, ...], *, takes_images: bool = False
) -> CompletionRequest:
    """``/api/generate`` without a template (``raw``, or a ``suffix``'s fill-in-the-middle prompt).

    With *takes_images* and ``images``, the prompt (one text) places each
    image where it writes ``[img-N]`` (Ollama's tags, N from 0).

    Raises:
        InvalidRequest: images (a text model, an image without its tag) or bad base64, a bad option,
            ``format`` or ``top_logprobs``.

    """
    images = ImageCollector(Omissions(), takes_images=takes_images)
    if body.images and takes_images:
        text = "".join(piece for piece in prompt if isinstance(piece, str))
        prompt = (_raw_with_images(text, body.images, images),)
    else:
        _no_images(body.images, "images")
    return CompletionRequest(
        prompt=prompt,
        options=generation_options(body.options, n_probs=_n_probs(body.logprobs, body.top_logprobs)),
        output_format=output_format(body.format),
        images=images.images,
        media_marker=images.marker or DEFAULT_MEDIA_MARKER,
    )


def check_context(context: Sequence[int], n_vocab: int) -> tuple[int, ...]:
    """``context`` (token ids from an earlier answer) if each is a token of the model.

    Raises:
        InvalidRequest: ``param`` ``context[i]``.

    """
    for index, token in enumerate(context):
        if not 0 <= token < min(n_vocab, INT32_MAX):
            raise InvalidRequest(
                f"context holds {token}, which is not a token of this model (0..{n_vocab - 1})",
                param=f"context[{index}]",
            )
    return tuple(context)


def _piece(piece: bytes) -> str:
    return piece.decode("utf-8", errors="replace")


def logprobs(entries: Sequence[TokenLogprob], with_top: bool) -> list[wire.Logprob]:
    """Ollama's ``logprobs`` for the given tokens (``top_logprobs`` when the request asked for some)."""
    return [
        wire.Logprob(
            token=_piece(entry.piece),
            logprob=entry.logprob,
            bytes=list(entry.piece),
            top_logprobs=[
                wire.TopLogprob(token=_piece(top.piece), logprob=top.logprob, bytes=list(top.piece))
                for top in entry.top
            ]
            if with_top
            else None,
        )
        for entry in entries
    ]


def tool_call_out(call: ToolCall, index: int) -> wire.ToolCallOut:
    """A call as Ollama writes it: its arguments parsed into an object (``{}`` when they are not one)."""
    try:
        arguments = json.loads(call.arguments) if call.arguments.strip() else {}
    except ValueError:
        logger.debug("tool call %s has arguments that are not JSON: %r", call.name, call.arguments[:200])
        arguments = {}
    return wire.ToolCallOut(
        id=call.id,
        function=wire.CallFunctionOut(
            index=index, name=call.name, arguments=arguments if isinstance(arguments, dict) else {}
        ),
    )
