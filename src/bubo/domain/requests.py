"""Dialect-neutral requests: what every API dialect's translation produces."""

from __future__ import annotations

import attrs

from .messages import ChatPrompt
from .sampling import SamplingOverrides

__all__ = ["ChatRequest", "CompletionRequest", "GenerationOptions", "PromptPiece"]

PromptPiece = int | str
"""A raw prompt is text, token ids, or a mix of both (llama-server's ``prompt``)."""


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


@attrs.frozen(kw_only=True)
class ChatRequest:
    """A conversation to continue."""

    prompt: ChatPrompt
    options: GenerationOptions = attrs.field(factory=GenerationOptions)


@attrs.frozen(kw_only=True)
class CompletionRequest:
    """Raw text (or token ids) to continue, no chat template."""

    prompt: tuple[PromptPiece, ...]
    options: GenerationOptions = attrs.field(factory=GenerationOptions)
