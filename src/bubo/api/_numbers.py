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

import attrs

from bubo.domain.sampling import LogitBias, SamplingOverrides
from bubo.errors import InvalidRequest

__all__ = [
    "FLOAT32_MAX",
    "INT32_MAX",
    "check_bias",
    "check_sampling",
    "check_token_limit",
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
)


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
        if field.name != "logit_bias"
    }
    return check_sampling(SamplingOverrides(**fields, logit_bias=logit_bias))


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
