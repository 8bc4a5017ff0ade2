"""Ollama's ``options`` object, its ``keep_alive`` and its ``think``: wire values to the domain's.

Ollama reads ``options`` key by key (``api.Options.FromMap``): a key it does not
know is ignored with a warning; a known key of the wrong type is an error; a
``null`` value is skipped.  Bubo does the same (the ignored keys are logged at
debug level).  The load-time options (``num_ctx``, ``num_thread``, ``num_gpu``,
…) are checked and then ignored: Bubo's model is loaded once, with its flags,
and a request never reloads it.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Any

import attrs

from bubo.api._converter import INT64_MAX, INT64_MIN
from bubo.api._numbers import check_token_limit
from bubo.api._stops import stop_strings
from bubo.domain.requests import GenerationOptions, ReasoningControl
from bubo.domain.samplers import KNOBS, KnobOutOfRange
from bubo.domain.sampling import SamplingOverrides
from bubo.errors import InvalidRequest

from .duration import MAX_DURATION_CHARS, duration_seconds

__all__ = ["FOREVER_S", "generation_options", "keep_alive_seconds", "reasoning", "thinks"]

logger = logging.getLogger(__name__)

FOREVER_S = math.inf
"""``keep_alive`` below zero: keep the model loaded for good."""

# the sampler options Bubo applies: the table's knobs that Ollama has, by Ollama's key
_SAMPLERS = {knob.ollama: knob for knob in KNOBS if knob.ollama is not None}
# known to Ollama (or to its Python client), read only when the model loads or no longer used: ignored
_IGNORED = {
    "num_ctx": int, "num_batch": int, "num_gpu": int, "main_gpu": int, "num_thread": int,
    "draft_num_predict": int, "use_mmap": bool, "numa": bool, "low_vram": bool, "f16_kv": bool,
    "logits_all": bool, "vocab_only": bool, "use_mlock": bool, "embedding_only": bool,
    "tfs_z": float, "penalize_newline": bool,
}  # fmt: skip
_KIND_NAMES = {int: "an integer", float: "a number", bool: "a boolean", list: "an array of strings"}


def _typed(key: str, value: Any, kind: type) -> Any:
    """*value* if it has the JSON type Ollama takes for *key* (an integral number for an integer).

    Raises:
        InvalidRequest: ``param`` ``options.<key>``.

    """
    ok: bool
    if isinstance(value, bool) and kind is not bool:
        ok = False
    elif kind is bool:
        ok = isinstance(value, bool)
    elif kind is int:
        ok = isinstance(value, int) or (isinstance(value, float) and value.is_integer())
        value = int(value) if ok else value
        if ok and not INT64_MIN <= value <= INT64_MAX:
            raise InvalidRequest(f"option {key!r} must fit in 64 bits", param=f"options.{key}")
    elif kind is float:
        ok = isinstance(value, int | float)
    else:
        ok = isinstance(value, list) and all(isinstance(item, str) for item in value)
    if not ok:
        raise InvalidRequest(f"option {key!r} must be {_KIND_NAMES[kind]}", param=f"options.{key}")
    return value


def generation_options(options: Mapping[str, Any] | None, *, n_probs: int | None = None) -> GenerationOptions:
    """The limits and samplers an ``options`` object sets (see the module docstring).

    Raises:
        InvalidRequest: a known option of the wrong type or out of range; ``param`` ``options.<key>``.

    """
    given = {key: value for key, value in (options or {}).items() if value is not None}
    sampling = _sampling(given)
    max_tokens = _num_predict(given.pop("num_predict", None))
    stop = stop_strings(_typed("stop", given.pop("stop"), list), "options.stop") if "stop" in given else ()
    n_keep = _typed("num_keep", given.pop("num_keep"), int) if "num_keep" in given else None
    if n_keep is not None and n_keep < -1:
        raise InvalidRequest("option 'num_keep' must be -1 (all) or more", param="options.num_keep")
    for key, kind in _IGNORED.items():
        if key in given:
            _typed(key, given.pop(key), kind)
            logger.debug("option %r is read when the model loads; ignored for this request", key)
    if given:
        logger.debug("ignoring unknown options: %s", ", ".join(sorted(given)))
    return GenerationOptions(
        max_tokens=max_tokens, sampling=sampling, stop=stop, n_keep=n_keep, n_probs=n_probs
    )


def _sampling(given: dict[str, Any]) -> SamplingOverrides:
    """The sampler options, taken out of *given*, checked (types and ranges)."""
    values: dict[str, Any] = {}
    for key, knob in _SAMPLERS.items():
        if key in given:
            values[knob.name] = knob.kind(_typed(key, given.pop(key), knob.kind))
    if "seed" in given:
        seed = _typed("seed", given.pop("seed"), int)
        values["seed"] = seed if seed >= 0 else None  # Ollama's -1: a fresh seed each time
    try:
        return SamplingOverrides(**values)
    except KnobOutOfRange as error:
        key = next(key for key, knob in _SAMPLERS.items() if knob.name == error.knob)
        raise InvalidRequest(str(error), param=f"options.{key}") from None


def _num_predict(value: Any) -> int | None:
    """``num_predict``: -1 (no limit) and -2 (until the context is full) are both "until the end"."""
    if value is None:
        return None
    limit: int = _typed("num_predict", value, int)
    if limit in (-1, -2):
        return -1
    if limit < 0:
        raise InvalidRequest(
            f"option 'num_predict' must be -1, -2 or a number of tokens, got {limit}",
            param="options.num_predict",
        )
    return check_token_limit(limit, "options.num_predict")


def keep_alive_seconds(value: Any) -> float | None:
    """``keep_alive`` in seconds: a number of seconds or a Go duration (``"5m"``, ``"1h30m"``, ``"0"``).

    Negative means for good (:data:`FOREVER_S`); ``None`` when not sent.  A
    duration is read in one pass, and text longer than
    :data:`~.duration.MAX_DURATION_CHARS` is refused unread (:mod:`.duration`).

    Raises:
        InvalidRequest: any other value; ``param`` ``keep_alive``.

    """
    if value is None:
        return None
    seconds: float | None = None
    if isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str):
        seconds = duration_seconds(value)
    if seconds is None:
        short = isinstance(value, str) and len(value) <= MAX_DURATION_CHARS
        shown = repr(value) if short else _json_kind(value)
        raise InvalidRequest(
            f'keep_alive must be a number of seconds or a duration such as "5m" (at most '
            f"{MAX_DURATION_CHARS} characters), got {shown}",
            param="keep_alive",
        )
    return FOREVER_S if seconds < 0 else seconds


def _json_kind(value: Any) -> str:
    """What *value* is, in JSON's words (never the value itself: it may be megabytes long)."""
    if isinstance(value, str):
        return f"a text of {len(value)} characters"
    kinds = {bool: "a boolean", list: "an array", dict: "an object"}
    return next((name for kind, name in kinds.items() if isinstance(value, kind)), "null")


def reasoning(think: bool | str | None) -> ReasoningControl:
    """``think``: a switch, or a level (``low``, ``medium``, ``high``, ``max``) that also turns it on."""
    if think is None:
        return ReasoningControl()
    if isinstance(think, bool):
        return ReasoningControl(enabled=think)
    return attrs.evolve(ReasoningControl.from_effort(think), enabled=True)


def thinks(think: bool | str | None) -> bool:
    """Whether *think* asks for thinking."""
    return think is not None and think is not False
