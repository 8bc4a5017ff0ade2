"""Dialect-neutral requests: what every API dialect's translation produces."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import attrs

from .media import DEFAULT_MEDIA_MARKER, ImageInput
from .messages import ChatPrompt
from .modes import ReasoningFormat
from .sampling import DraftOverrides, SamplingOverrides

__all__ = [
    "ChatDefaults",
    "ChatRequest",
    "CompletionRequest",
    "GenerationOptions",
    "LoraScale",
    "OutputFormat",
    "PromptPiece",
    "RawGrammar",
    "ReasoningControl",
    "ToolChoice",
]

PromptPiece = int | str
"""A raw prompt is text, token ids, or a mix of both (llama-server's ``prompt``)."""


@attrs.frozen(kw_only=True)
class ChatDefaults:
    """How chat requests are rendered and parsed when they do not say (llama-server's flags).

    Declared here, with its defaults, once: ``config.RequestDefaults`` takes them for its
    ``--prefill-assistant`` and ``--reasoning-format``, and the loader builds the served
    model's from the settings (``service.Runtime.chat``).

    ``prefill_assistant``: a final assistant message is continued (else closed
    as a whole turn).  ``thinking``: ``enable_thinking`` for templates that read
    it (None: the template's default).  ``reasoning_format``: ``deepseek`` (and
    ``auto``) splits thinking into ``reasoning_content``; ``none`` leaves it in the content;
    ``deepseek-legacy`` does both (the content keeps the ``<think>`` tags).
    """

    prefill_assistant: bool = True
    thinking: bool | None = None
    reasoning_format: ReasoningFormat = "auto"


@attrs.frozen
class LoraScale:
    """One LoRA adapter (by its id in the order loaded) and the scale a request applies it with."""

    id: int
    scale: float


@attrs.frozen(kw_only=True)
class GenerationOptions:
    """Limits and sampling a request asks for; ``None`` keeps the server default.

    ``n_probs``: ``None`` for no log-probabilities, ``0`` for the sampled
    token's only, ``k`` for the top ``k`` alternatives too.
    """

    max_tokens: int | None = None
    sampling: SamplingOverrides = attrs.field(factory=SamplingOverrides)
    stop: tuple[str, ...] = ()
    n_probs: int | None = None
    ignore_eos: bool = False
    time_limit_ms: int = 0
    slot: int | None = None  # the session slot to run in (llama-server's id_slot); None: the engine picks
    # llama-server's n_keep, cache_prompt and n_indent (GenerationRequest says what they do)
    n_keep: int | None = None  # None: the server's --keep
    cache_prompt: bool = True
    n_indent: int = 0
    post_sampling_probs: bool = False
    speculative: DraftOverrides = attrs.field(factory=DraftOverrides)
    # llama-server's per-request ``lora``: these adapters at these scales, every other one at 0;
    # None: the server's scales (``POST /lora-adapters``)
    lora: tuple[LoraScale, ...] | None = None


@attrs.frozen(kw_only=True)
class ToolChoice:
    """Whether and which tool the model must call.

    ``none``: no tools are offered.  ``auto``: the model decides.
    ``required``: it must call one of the tools.  ``named``: it must call
    ``name``.  ``param`` is the wire path to name in errors.
    """

    mode: Literal["none", "auto", "required", "named"] = "auto"
    name: str | None = None
    param: str = "tool_choice"


@attrs.frozen(kw_only=True)
class ReasoningControl:
    """What the request says about thinking.

    ``enabled`` ``None`` keeps the template's default (on, where it thinks);
    ``effort`` reaches the template as ``reasoning_effort``; ``budget_tokens``
    ends the thinking after that many tokens.
    """

    enabled: bool | None = None
    effort: str | None = None
    budget_tokens: int | None = None

    @classmethod
    def from_effort(cls, effort: str | None) -> ReasoningControl:
        """``off`` (or ``none``) turns thinking off; any other level turns it on at that level."""
        if effort is None:
            return cls()
        if effort in ("off", "none"):
            return cls(enabled=False)
        return cls(enabled=True, effort=effort)


@attrs.frozen(kw_only=True)
class OutputFormat:
    """The answer must be one JSON value matching ``schema``; ``param`` names the wire field."""

    schema: Mapping[str, Any]
    param: str = "response_format"


@attrs.frozen(kw_only=True)
class RawGrammar:
    """A GBNF grammar the request gives itself (llama-server's ``grammar``); ``param`` names the field."""

    rules: str
    param: str = "grammar"


@attrs.frozen(kw_only=True)
class ChatRequest:
    """A conversation to continue."""

    prompt: ChatPrompt
    options: GenerationOptions = attrs.field(factory=GenerationOptions)
    tool_choice: ToolChoice = attrs.field(factory=ToolChoice)
    parallel_tool_calls: bool = True
    reasoning: ReasoningControl = attrs.field(factory=ReasoningControl)
    output_format: OutputFormat | None = None
    grammar: RawGrammar | None = None  # at most one of output_format and grammar
    # content a text model cannot read, replaced by a placeholder: how many items of each kind
    omitted: Mapping[str, int] = attrs.field(factory=dict)


@attrs.frozen(kw_only=True)
class CompletionRequest:
    """Raw text (or token ids) to continue, no chat template."""

    prompt: tuple[PromptPiece, ...]
    options: GenerationOptions = attrs.field(factory=GenerationOptions)
    output_format: OutputFormat | None = None
    grammar: RawGrammar | None = None  # at most one of output_format and grammar
    # images read where the prompt's text holds ``media_marker`` (llama-server's ``multimodal_data``)
    images: tuple[ImageInput, ...] = ()
    media_marker: str = DEFAULT_MEDIA_MARKER
