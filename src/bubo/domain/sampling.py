"""Sampling parameters: the server's defaults merged with a request's overrides.

This is the one place sampling defaults live (``config.Settings.generation`` is a
:class:`GenerationDefaults`, whose ``sampling`` holds a :class:`SamplingParams`);
a request only says what it changes.  The numeric knobs' defaults and ranges
come from the sampler table, ``domain.samplers.KNOBS``; their fields are
declared here, typed, and checked against the table by
``tests/domain/test_sampler_declarations.py``.
"""

from __future__ import annotations

import math

import attrs

from .samplers import override, setting

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

    A field per knob of ``domain.samplers.KNOBS``, its default and range (the validator) the
    row's, then the settings that are not single numbers.  ``temperature <= 0`` selects greedy
    decoding (unless ``dynatemp_range`` widens it).  ``seed`` ``None`` draws a fresh seed per
    request.  ``logit_bias`` holds token ids only.  ``samplers`` orders the stages of the chain;
    ``mirostat`` 1 or 2 replaces all of them with temperature and Mirostat, as in llama.cpp.
    """

    temperature: float = setting("temperature")
    top_k: int = setting("top_k")
    top_p: float = setting("top_p")
    min_p: float = setting("min_p")
    repeat_penalty: float = setting("repeat_penalty")
    repeat_last_n: int = setting("repeat_last_n")
    presence_penalty: float = setting("presence_penalty")
    frequency_penalty: float = setting("frequency_penalty")
    dynatemp_range: float = setting("dynatemp_range")
    dynatemp_exponent: float = setting("dynatemp_exponent")
    typical_p: float = setting("typical_p")
    top_n_sigma: float = setting("top_n_sigma")
    xtc_probability: float = setting("xtc_probability")
    xtc_threshold: float = setting("xtc_threshold")
    mirostat: int = setting("mirostat")
    mirostat_eta: float = setting("mirostat_eta")
    mirostat_tau: float = setting("mirostat_tau")
    dry_multiplier: float = setting("dry_multiplier")
    dry_base: float = setting("dry_base")
    dry_allowed_length: int = setting("dry_allowed_length")
    dry_penalty_last_n: int = setting("dry_penalty_last_n")
    seed: int | None = None
    logit_bias: tuple[tuple[int, float], ...] = ()
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
    """What one request asks to change; ``None`` means "keep the server default".

    A field per knob of ``domain.samplers.KNOBS``, its range the validator (a value out of range
    raises :class:`~bubo.domain.samplers.KnobOutOfRange` as the overrides are made), then the
    settings that are not single numbers.
    """

    temperature: float | None = override("temperature")
    top_k: int | None = override("top_k")
    top_p: float | None = override("top_p")
    min_p: float | None = override("min_p")
    repeat_penalty: float | None = override("repeat_penalty")
    repeat_last_n: int | None = override("repeat_last_n")
    presence_penalty: float | None = override("presence_penalty")
    frequency_penalty: float | None = override("frequency_penalty")
    dynatemp_range: float | None = override("dynatemp_range")
    dynatemp_exponent: float | None = override("dynatemp_exponent")
    typical_p: float | None = override("typical_p")
    top_n_sigma: float | None = override("top_n_sigma")
    xtc_probability: float | None = override("xtc_probability")
    xtc_threshold: float | None = override("xtc_threshold")
    mirostat: int | None = override("mirostat")
    mirostat_eta: float | None = override("mirostat_eta")
    mirostat_tau: float | None = override("mirostat_tau")
    dry_multiplier: float | None = override("dry_multiplier")
    dry_base: float | None = override("dry_base")
    dry_allowed_length: int | None = override("dry_allowed_length")
    dry_penalty_last_n: int | None = override("dry_penalty_last_n")
    seed: int | None = None
    logit_bias: LogitBias = ()
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
