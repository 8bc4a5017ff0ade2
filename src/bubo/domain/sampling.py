"""Sampling parameters: the server's defaults merged with a request's overrides.

This is the one place sampling defaults live (``config.Settings.sampling`` holds a
:class:`SamplingParams`); a request only says what it changes.
"""

from __future__ import annotations

import math

import attrs

__all__ = ["GenerationDefaults", "LogitBias", "SamplingOverrides", "SamplingParams"]

# (token id or text, bias); a text is expanded to its tokens by the service,
# a bias of -inf bans the token.
LogitBias = tuple[tuple[int | str, float], ...]


@attrs.frozen(kw_only=True)
class SamplingParams:
    """A complete set of sampler settings (llama.cpp's names and meanings).

    ``temperature <= 0`` selects greedy decoding.  ``seed`` ``None`` draws a
    fresh seed per request.  ``logit_bias`` holds token ids only.
    """

    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    logit_bias: tuple[tuple[int, float], ...] = ()

    @property
    def greedy(self) -> bool:
        """Whether the most likely token is always taken."""
        return self.temperature <= 0.0

    def with_overrides(self, overrides: SamplingOverrides) -> SamplingParams:
        """These settings with every field the request set replaced."""
        changes = {
            field.name: value
            for field in attrs.fields(SamplingOverrides)
            if field.name != "logit_bias" and (value := getattr(overrides, field.name)) is not None
        }
        return attrs.evolve(self, **changes)


@attrs.frozen(kw_only=True)
class SamplingOverrides:
    """What one request asks to change; ``None`` means "keep the server default"."""

    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    repeat_penalty: float | None = None
    repeat_last_n: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    seed: int | None = None
    logit_bias: LogitBias = ()


@attrs.frozen(kw_only=True)
class GenerationDefaults:
    """What a request gets when it does not say: the server's ``-n`` and sampler flags."""

    n_predict: int = -1  # negative: until end of generation or of the context
    sampling: SamplingParams = attrs.field(factory=SamplingParams)


BANNED = -math.inf
"""The bias that forbids a token (llama-server's ``false``)."""
