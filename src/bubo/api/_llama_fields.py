"""The request fields llama-server takes on every generating route, declared once.

llama-server accepts its sampler settings, constraints, ``ignore_eos``, ``lora`` and the
flat ``speculative.*`` keys (``api/_numbers.draft_overrides``) on
``/completion`` and on the OpenAI routes alike; each dialect's request class
inherits them from :class:`LlamaServerFields` (``api/_numbers.sampling_overrides``
is the one mapping from these names to the domain's).
"""

from __future__ import annotations

from typing import Any

import attrs

from bubo.domain.requests import LoraScale

from ._converter import wire_name

__all__ = ["LlamaServerFields", "LoraEntry", "lora_scales"]


@attrs.frozen(kw_only=True)
class LoraEntry:
    """One adapter of llama-server's ``lora`` list (and of ``POST /lora-adapters``' body)."""

    id: int
    scale: float = 0.0  # llama-server's default for an entry without one


def lora_scales(entries: list[LoraEntry] | None) -> tuple[LoraScale, ...] | None:
    """The domain's form of a ``lora`` list (its ids are checked against the loaded adapters later)."""
    return None if entries is None else tuple(LoraScale(entry.id, entry.scale) for entry in entries)


@attrs.frozen(kw_only=True)
class LlamaServerFields:
    """llama.cpp's samplers beyond OpenAI's, the answer's grammar or schema, ``ignore_eos``, drafts, LoRA."""

    top_k: int | None = None
    min_p: float | None = None
    repeat_penalty: float | None = None
    repeat_last_n: int | None = None
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
    dry_sequence_breakers: list[str] | None = None
    samplers: list[str] | str | None = None  # stage names in order, or llama-server's letters ("edskypmxt")
    grammar: str | None = None  # GBNF for the whole answer
    json_schema: dict[str, Any] | None = None  # a JSON schema for the whole answer
    ignore_eos: bool | None = None
    # llama-server's flat keys "speculative.n_max", "speculative.n_min", "speculative.p_min"
    speculative_n_max: int | None = attrs.field(default=None, metadata=wire_name("speculative.n_max"))
    speculative_n_min: int | None = attrs.field(default=None, metadata=wire_name("speculative.n_min"))
    speculative_p_min: float | None = attrs.field(default=None, metadata=wire_name("speculative.p_min"))
    lora: list[LoraEntry] | None = None  # these adapters at these scales, the others at 0 (this request only)
