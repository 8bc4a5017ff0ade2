"""Numbers from the wire: the ranges every dialect shares, and token ids written as object keys.

The rule: accept what llama-server accepts (Bubo stands in for it), except a
value that cannot reach llama.cpp intact, which takes token counts and ``top_k``
as 32-bit integers and every sampler setting as a 32-bit float, or that means
nothing (a probability outside 0..1, ``repeat_last_n`` below -1, which
llama-server refuses too).  The OpenAI and Anthropic ranges are narrower, so
their clients never meet these bounds.  Non-finite numbers never get this far
(see ``_values.py``); integers beyond 64 bits neither (``_converter.py``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import attrs

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
    "check_sampling",
    "check_token_limit",
    "sampler_order",
    "sampling_overrides",
    "token_id",
]

INT32_MAX = 2**31 - 1
FLOAT32_MAX = 3.4028234663852886e38

# what llama-server's strtol takes as a whole key: optional white space and sign, then ASCII digits
_TOKEN_ID = re.compile(r"[ \t\n\v\f\r]*[+-]?([0-9]+)")
_MAX_TOKEN_ID_DIGITS = 18  # longer is no vocabulary's id (and int() refuses over 4,300 digits)

# (field, lowest, whether the lowest itself is accepted, highest); the same wire name in every dialect
_RANGES = (
    ("temperature", -FLOAT32_MAX, True, FLOAT32_MAX),
    ("top_k", -INT32_MAX - 1, True, INT32_MAX),
    ("top_p", 0.0, True, 1.0),
    ("min_p", 0.0, True, 1.0),
    ("repeat_penalty", 0.0, False, FLOAT32_MAX),  # llama.h: "must be > 0.0" (it divides by it)
    ("repeat_last_n", -1, True, INT32_MAX),
    ("presence_penalty", -FLOAT32_MAX, True, FLOAT32_MAX),
    ("frequency_penalty", -FLOAT32_MAX, True, FLOAT32_MAX),
    ("dynatemp_range", -FLOAT32_MAX, True, FLOAT32_MAX),
    ("dynatemp_exponent", -FLOAT32_MAX, True, FLOAT32_MAX),
    ("typical_p", 0.0, True, 1.0),
    ("xtc_probability", 0.0, True, 1.0),
    ("xtc_threshold", 0.0, True, 1.0),
    ("top_n_sigma", -FLOAT32_MAX, True, FLOAT32_MAX),
    ("mirostat", 0, True, 2),  # 0 off, 1 Mirostat, 2 Mirostat 2.0
    ("mirostat_tau", -FLOAT32_MAX, True, FLOAT32_MAX),
    ("mirostat_eta", -FLOAT32_MAX, True, FLOAT32_MAX),
    ("dry_multiplier", -FLOAT32_MAX, True, FLOAT32_MAX),
    ("dry_base", -FLOAT32_MAX, True, FLOAT32_MAX),  # below 1 turns DRY off, as in llama.cpp
    ("dry_allowed_length", 0, True, INT32_MAX),
    ("dry_penalty_last_n", -1, True, INT32_MAX),
)

MAX_SAMPLERS = 16
"""The most stages ``samplers`` may name: llama-server's default has nine; each runs on the decode thread
for every token (up to 0.9 ms a stage over a 49k vocabulary: sixteen delay every stream by up to 15 ms)."""

MAX_DRY_SEQUENCE_BREAKERS = 16
"""The most ``dry_sequence_breakers`` a request may send (llama-server's default has four): llama.cpp matches
each against the whole vocabulary, up to 0.5 s a breaker of a worker thread's time."""

MAX_DRY_BREAKER_CHARS = 40
"""llama.cpp reads at most this many characters of a sequence breaker (it truncates longer ones)."""


def _shown(value: float) -> str:
    return f"{value:.8g}" if isinstance(value, float) else str(value)


def check_sampling(overrides: SamplingOverrides) -> SamplingOverrides:
    """*overrides* if every field it sets is in range.

    Raises:
        InvalidRequest: ``param`` the first field out of range.

    """
    for name, lowest, inclusive, highest in _RANGES:
        value = getattr(overrides, name)
        if value is None:
            continue
        if not (lowest <= value if inclusive else lowest < value) or value > highest:
            floor = "at least" if inclusive else "greater than"
            raise InvalidRequest(
                f"{name} must be {floor} {_shown(lowest)} and at most {_shown(highest)}, got {_shown(value)}",
                param=name,
            )
    return overrides


def sampling_overrides(body: object, logit_bias: LogitBias) -> SamplingOverrides:
    """The sampler settings a request body sets, checked; the one mapping from wire to domain.

    Every dialect that has these fields names them as the domain does
    (``temperature``, ``top_k``, … ``seed``); only the logit bias has a form of
    its own per dialect, so the caller reads it.

    Raises:
        InvalidRequest: ``param`` the first field out of range.

    """
    fields = {
        field.name: getattr(body, field.name)
        for field in attrs.fields(SamplingOverrides)
        if field.name not in ("logit_bias", "samplers", "dry_sequence_breakers")
    }
    samplers: list[str] | str | None = getattr(body, "samplers")  # noqa: B009 - the bodies share no type
    breakers: list[str] | None = getattr(body, "dry_sequence_breakers")  # noqa: B009
    return check_sampling(
        SamplingOverrides(
            **fields,
            logit_bias=logit_bias,
            samplers=None if samplers is None else sampler_order(samplers, "samplers"),
            dry_sequence_breakers=None if breakers is None else _breakers(breakers),
        )
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
