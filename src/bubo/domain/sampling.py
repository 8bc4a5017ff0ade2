"""Sampling parameters: the server's defaults merged with a request's overrides.

This is the one place sampling defaults live (``config.Settings.generation`` is a
:class:`GenerationDefaults`, whose ``sampling`` holds a :class:`SamplingParams`);
a request only says what it changes.
"""

from __future__ import annotations

import math

import attrs

__all__ = [
    "DEFAULT_DRY_SEQUENCE_BREAKERS",
    "DEFAULT_SAMPLERS",
    "SAMPLER_ALIASES",
    "SAMPLER_LETTERS",
    "SAMPLER_NAMES",
    "DraftLimits",
    "DraftOverrides",
    "GenerationDefaults",
    "LogitBias",
    "SamplingOverrides",
    "SamplingParams",
]

# (token id or text, bias); a text is expanded to its tokens by the service,
# a bias of -inf bans the token.
LogitBias = tuple[tuple[int | str, float], ...]

SAMPLER_NAMES = ("penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature")
"""The stages a sampler chain may have, by llama.cpp's names (``samplers`` lists some of them, in order)."""

DEFAULT_SAMPLERS = SAMPLER_NAMES
"""llama-server's default order (``--samplers``)."""

SAMPLER_ALIASES = {
    "top-k": "top_k",
    "top-p": "top_p",
    "nucleus": "top_p",
    "top-n-sigma": "top_n_sigma",
    "typical-p": "typ_p",
    "typical": "typ_p",
    "typical_p": "typ_p",
    "typ-p": "typ_p",
    "typ": "typ_p",
    "min-p": "min_p",
    "temp": "temperature",
}
"""llama.cpp's other spellings of the stages."""

SAMPLER_LETTERS = {
    "e": "penalties",
    "d": "dry",
    "s": "top_n_sigma",
    "k": "top_k",
    "y": "typ_p",
    "p": "top_p",
    "m": "min_p",
    "x": "xtc",
    "t": "temperature",
}
"""llama.cpp's one-letter form of the stages (``--sampler-seq``; ``samplers`` as a string)."""

DEFAULT_DRY_SEQUENCE_BREAKERS = ("\n", ":", '"', "*")


@attrs.frozen(kw_only=True)
class SamplingParams:
    """A complete set of sampler settings (llama.cpp's names and meanings).

    ``temperature <= 0`` selects greedy decoding (unless ``dynatemp_range`` widens
    it).  ``seed`` ``None`` draws a fresh seed per request.  ``logit_bias`` holds
    token ids only.  ``samplers`` orders the stages of the chain; ``mirostat`` 1
    or 2 replaces all of them with temperature and Mirostat, as in llama.cpp.
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
    # llama.cpp's other samplers, each neutral by default
    dynatemp_range: float = 0.0
    dynatemp_exponent: float = 1.0
    typical_p: float = 1.0
    xtc_probability: float = 0.0
    xtc_threshold: float = 0.1
    top_n_sigma: float = -1.0
    mirostat: int = 0
    mirostat_tau: float = 5.0
    mirostat_eta: float = 0.1
    dry_multiplier: float = 0.0
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    dry_penalty_last_n: int = -1  # -1: the whole context, 0: off
    dry_sequence_breakers: tuple[str, ...] = DEFAULT_DRY_SEQUENCE_BREAKERS
    samplers: tuple[str, ...] = DEFAULT_SAMPLERS

    @property
    def greedy(self) -> bool:
        """Whether the most likely token is always taken."""
        return self.temperature <= 0.0 and self.dynatemp_range <= 0.0

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
    dynatemp_range: float | None = None
    dynatemp_exponent: float | None = None
    typical_p: float | None = None
    xtc_probability: float | None = None
    xtc_threshold: float | None = None
    top_n_sigma: float | None = None
    mirostat: int | None = None
    mirostat_tau: float | None = None
    mirostat_eta: float | None = None
    dry_multiplier: float | None = None
    dry_base: float | None = None
    dry_allowed_length: int | None = None
    dry_penalty_last_n: int | None = None
    dry_sequence_breakers: tuple[str, ...] | None = None
    samplers: tuple[str, ...] | None = None


@attrs.frozen(kw_only=True)
class DraftOverrides:
    """A request's ``speculative.n_max``, ``.n_min`` and ``.p_min``; None keeps the default."""

    n_max: int | None = None
    n_min: int | None = None
    p_min: float | None = None


@attrs.frozen(kw_only=True)
class DraftLimits:
    """How a generation may draft (llama-server's ``speculative.*``).

    ``n_max``: the most tokens verified in one step (0: no drafting); ``n_min``: a
    shorter draft is not verified; ``p_min``: a draft model stops drafting at the
    first token it gives less than this probability.
    """

    n_max: int = 16
    n_min: int = 0
    p_min: float = 0.75

    def with_overrides(self, overrides: DraftOverrides) -> DraftLimits:
        """These (the server's) limits with a request's *overrides*, clamped as llama-server clamps them.

        ``n_max`` is at most the server's (``--draft-max`` sizes what a step may hold); ``n_min`` at
        most ``n_max``; neither below 0.
        """
        n_max = max(0, min(self.n_max, self.n_max if overrides.n_max is None else overrides.n_max))
        n_min = max(0, min(n_max, self.n_min if overrides.n_min is None else overrides.n_min))
        p_min = self.p_min if overrides.p_min is None else overrides.p_min
        return DraftLimits(n_max=n_max, n_min=n_min, p_min=p_min)


@attrs.frozen(kw_only=True)
class GenerationDefaults:
    """What a request gets when it does not say: the server's ``-n``, sampler and draft flags."""

    n_predict: int = -1  # negative: until end of generation or of the context
    n_keep: int = 0  # prompt tokens a context shift keeps (--keep); -1: the whole prompt
    sampling: SamplingParams = attrs.field(factory=SamplingParams)
    speculative: DraftLimits = attrs.field(factory=DraftLimits)


BANNED = -math.inf
"""The bias that forbids a token (llama-server's ``false``)."""
