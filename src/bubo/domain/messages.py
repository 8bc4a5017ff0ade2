"""Chat messages and tools, independent of any wire dialect."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import attrs

from .media import ImageInput

__all__ = ["ChatPrompt", "InputGrammar", "Message", "Role", "ToolCall", "ToolSpec"]

Role = Literal["system", "user", "assistant", "tool"]


@attrs.frozen(kw_only=True)
class ToolCall:
    """A function call the assistant made; ``arguments`` is JSON text."""

    id: str
    name: str
    arguments: str


@attrs.frozen(kw_only=True)
class Message:
    """One conversation turn, its text parts already joined.

    ``reasoning`` carries an earlier turn's thinking back to the template;
    ``tool_call_id`` and ``name`` belong to ``tool`` results.
    """

    role: Role
    content: str | None
    reasoning: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None
    # An assistant message sent as text parts, each part: a continued final message goes on from
    # them joined as they are (llama-server's prefill), where ``content`` joins them by lines.
    text_parts: tuple[str, ...] = ()


@attrs.frozen(kw_only=True)
class InputGrammar:
    """The grammar a freeform tool's one string argument, ``argument``, follows (Responses custom tools)."""

    argument: str
    syntax: Literal["lark", "regex"]
    definition: str


@attrs.frozen(kw_only=True)
class ToolSpec:
    """A function the model may call; ``parameters`` is its JSON schema, sent in the field ``param``.

    ``input_grammar``: the tool is freeform, its one string argument written in that grammar.
    """

    name: str
    description: str | None = None
    parameters: Mapping[str, Any] = attrs.field(factory=dict)
    strict: bool | None = None
    input_grammar: InputGrammar | None = None
    param: str = attrs.field(default="tools", eq=False)  # e.g. "tools[2].function.parameters", for errors


@attrs.frozen(kw_only=True)
class ChatPrompt:
    """Everything the chat template renders.

    ``template_kwargs`` are extra variables for the template
    (``chat_template_kwargs`` in the OpenAI dialect).  ``add_generation_prompt``
    and ``continue_final_message`` are what the request said (None: it did not
    say); the template decides from them and the messages, one rule for every
    dialect (a final assistant message is continued unless the request says otherwise).

    A model that takes images reads each of ``images`` where its translation
    wrote ``media_marker`` (:func:`bubo.domain.media.new_media_marker`) in a
    message's text; the prompt is split there once rendered.
    """

    messages: tuple[Message, ...]
    tools: tuple[ToolSpec, ...] = ()
    template_kwargs: Mapping[str, Any] = attrs.field(factory=dict)
    add_generation_prompt: bool | None = None
    continue_final_message: bool | None = None
    # the images the messages' text refers to, in order: each stands where ``media_marker`` is written
    images: tuple[ImageInput, ...] = ()
    media_marker: str = ""
