"""Numbers from the wire: the ranges every dialect shares, and token ids written as object keys.

The sampler knobs' ranges are the table's (``domain.samplers.KNOBS``), shared
with ``bubo serve``'s flags.  The rule: accept what llama-server accepts (Bubo
stands in for it), except a value that cannot reach llama.cpp intact, which
takes token counts and ``top_k`` as 32-bit integers and every sampler setting
as a 32-bit float, or that means nothing (a probability outside 0..1,
``repeat_last_n`` below -1, which llama-server refuses too).  The OpenAI and Anthropic ranges are narrower, so
their clients never meet these bounds.  Non-finite numbers never get this far
(see ``_values.py``); integers beyond 64 bits neither (``_converter.py``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from bubo.domain.samplers import FLOAT32_MAX, INT32_MAX, KNOBS, KnobOutOfRange
from bubo.domain.sampling import (
    SAMPLER_ALIASES,
    SAMPLER_LETTERS,
    SAMPLER_NAMES,
    DraftOverrides,
    LogitBias,
    SamplingOverrides,
)
from bubo.errors import InvalidRequest

from ._llama_fields import LlamaServerFields

__all__ = [
    "FLOAT32_MAX",
    "INT32_MAX",
    "check_bias",
    "check_token_limit",
    "checked_sampling",
    "sampler_order",
    "sampling_overrides",
    "token_id",
]

# what llama-server's strtol takes as a whole key: optional white space and sign, then ASCII digits
_TOKEN_ID = re.compile(r"[ \t\n\v\f\r]*[+-]?([0-9]+)")
_MAX_TOKEN_ID_DIGITS = 18  # longer is no vocabulary's id (and int() refuses over 4,300 digits)

MAX_SAMPLERS = 16
"""The most stages ``samplers`` may name: llama-server's default has nine; each runs on the decode thread
for every token (up to 0.9 ms a stage over a 49k vocabulary: sixteen delay every stream by up to 15 ms)."""

MAX_DRY_SEQUENCE_BREAKERS = 16
"""The most ``dry_sequence_breakers`` a request may send (llama-server's default has four): llama.cpp matches
each against the whole vocabulary, up to 0.5 s a breaker of a worker thread's time."""

MAX_DRY_BREAKER_CHARS = 40
"""llama.cpp reads at most this many characters of a sequence breaker (it truncates longer ones)."""


def checked_sampling(**values: Any) -> SamplingOverrides:
    """The overrides *values* set, each knob checked against its range (``domain.samplers.KNOBS``).

    Raises:
        InvalidRequest: ``param`` the first knob out of range.

    """
    try:
        return SamplingOverrides(**values)
    except KnobOutOfRange as error:
        raise InvalidRequest(str(error), param=error.knob) from None


def sampling_overrides(body: object, logit_bias: LogitBias) -> SamplingOverrides:
    """The sampler settings a request body sets, checked; the one mapping from wire to domain.

    Every dialect that has these fields names them as the domain does (the
    table's knobs, then ``seed``); only the logit bias has a form of its own per
    dialect, so the caller reads it.

    Raises:
        InvalidRequest: ``param`` the first field out of range.

    """
    samplers: list[str] | str | None = getattr(body, "samplers")  # noqa: B009 - the bodies share no type
    breakers: list[str] | None = getattr(body, "dry_sequence_breakers")  # noqa: B009
    return checked_sampling(
        **{knob.name: getattr(body, knob.name) for knob in KNOBS},
        seed=getattr(body, "seed"),  # noqa: B009
        logit_bias=logit_bias,
        samplers=None if samplers is None else sampler_order(samplers, "samplers"),
        dry_sequence_breakers=None if breakers is None else _breakers(breakers),
    )


def draft_overrides(body: LlamaServerFields) -> DraftOverrides:
    """``speculative.n_max``, ``speculative.n_min`` and ``speculative.p_min`` as a request sets them.

    The counts are clamped as llama-server clamps them (``DraftLimits.with_overrides``); a
    probability must be one.

    Raises:
        InvalidRequest: ``speculative.p_min`` outside 0..1.

    """
    p_min = body.speculative_p_min
    if p_min is not None and not 0.0 <= p_min <= 1.0:
        raise InvalidRequest(
            f"speculative.p_min must be between 0 and 1, got {p_min}", param="speculative.p_min"
        )
    return DraftOverrides(n_max=body.speculative_n_max, n_min=body.speculative_n_min, p_min=p_min)


def sampler_order(samplers: Sequence[str] | str, param: str) -> tuple[str, ...]:
    """``samplers`` as llama.cpp's stage names: a list of names (or their aliases), or a string of letters.

    Raises:
        InvalidRequest: an unknown name or letter, or too many; ``param`` *param* (with the index).

    """
    if len(samplers) > MAX_SAMPLERS:
        raise InvalidRequest(
            f"{param} names {len(samplers)} stages; at most {MAX_SAMPLERS} are supported", param=param
        )
    if isinstance(samplers, str):
        unknown = next((letter for letter in samplers if letter not in SAMPLER_LETTERS), None)
        if unknown is not None:
            raise InvalidRequest(
                f"{param}: {unknown!r} is not a sampler letter; use {''.join(SAMPLER_LETTERS)}", param=param
            )
        return tuple(SAMPLER_LETTERS[letter] for letter in samplers)
    order = []
    for index, name in enumerate(samplers):
        stage = name if name in SAMPLER_NAMES else SAMPLER_ALIASES.get(name)
        if stage is None:
            raise InvalidRequest(
                f"{name!r} is not a sampler; use {', '.join(SAMPLER_NAMES)}", param=f"{param}[{index}]"
            )
        order.append(stage)
    return tuple(order)


def _breakers(breakers: Sequence[str]) -> tuple[str, ...]:
    """``dry_sequence_breakers``: 1 to :data:`MAX_DRY_SEQUENCE_BREAKERS` non-empty strings (as llama-server).

    Raises:
        InvalidRequest: ``param`` ``dry_sequence_breakers`` (with the index of a bad one).

    """
    param = "dry_sequence_breakers"
    if not breakers:
        raise InvalidRequest(f"{param} must be a non-empty array of strings", param=param)
    if len(breakers) > MAX_DRY_SEQUENCE_BREAKERS:
        raise InvalidRequest(
            f"{param} has {len(breakers)} strings; at most {MAX_DRY_SEQUENCE_BREAKERS} are supported",
            param=param,
        )
    for index, breaker in enumerate(breakers):
        if not breaker or "\0" in breaker:
            raise InvalidRequest(
                "a sequence breaker is a non-empty string without NUL", param=f"{param}[{index}]"
            )
    return tuple(breaker[:MAX_DRY_BREAKER_CHARS] for breaker in breakers)


def check_token_limit(value: int | None, param: str) -> int | None:
    """*value* if at most :data:`INT32_MAX`: llama.cpp counts tokens in 32 bits (llama-server refuses more).

    Raises:
        InvalidRequest: ``param`` *param*.

    """
    if value is not None and value > INT32_MAX:
        raise InvalidRequest(f"{param} must be at most {INT32_MAX}, got {value}", param=param)
    return value


def check_bias(value: float, param: str) -> float:
    """A logit bias that fits llama.cpp's 32-bit float.

    Raises:
        InvalidRequest: ``param`` *param*.

    """
    if not -FLOAT32_MAX <= value <= FLOAT32_MAX:
        raise InvalidRequest(
            f"a logit bias must be between {-FLOAT32_MAX:.8g} and {FLOAT32_MAX:.8g}, got {value:.8g}",
            param=param,
        )
    return value


def token_id(key: str, param: str) -> int | None:
    """A ``logit_bias`` key as a token id when llama-server reads it as one (``"42"``, ``"-5"``, ``" +7"``).

    Any other key (``"--5"``, ``"²"``, ``"hello"``) is ``None``: llama-server treats it as a text.

    Raises:
        InvalidRequest: digits too many to be any vocabulary's token id; ``param`` *param*.

    """
    match = _TOKEN_ID.fullmatch(key)
    if match is None:
        return None
    if len(match.group(1)) > _MAX_TOKEN_ID_DIGITS:
        raise InvalidRequest(f"logit_bias key {key[:24]}… is not a token id of this model", param=param)
    return int(key)
