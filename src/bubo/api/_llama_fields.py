"""The request fields llama-server takes on every generating route, declared once.

llama-server accepts its sampler settings, constraints, ``ignore_eos``, ``lora`` and the
flat ``speculative.*`` keys (``api/_numbers.draft_overrides``) on
``/completion`` and on the OpenAI routes alike; each dialect's request class
inherits them from :class:`LlamaServerFields` (``api/_numbers.sampling_overrides``
is the one mapping from these names to the domain's).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import attrs

from bubo.domain.requests import LoraScale
from bubo.domain.samplers import KNOBS, Knob, with_knob_fields

from ._converter import wire_name

__all__ = ["LlamaServerFields", "LoraEntry", "llama_server_fields", "lora_scales"]


@attrs.frozen(kw_only=True)
class LoraEntry:
    """One adapter of llama-server's ``lora`` list (and of ``POST /lora-adapters``' body)."""

    id: int
    scale: float = 0.0  # llama-server's default for an entry without one


def lora_scales(entries: list[LoraEntry] | None) -> tuple[LoraScale, ...] | None:
    """The domain's form of a ``lora`` list (its ids are checked against the loaded adapters later)."""
    return None if entries is None else tuple(LoraScale(entry.id, entry.scale) for entry in entries)


@attrs.frozen(kw_only=True)
class _LlamaServerFields:
    """llama.cpp's samplers beyond OpenAI's, the answer's grammar or schema, ``ignore_eos``, drafts, LoRA.

    The numeric samplers are a field per knob of ``domain.samplers.KNOBS`` that OpenAI's bodies
    do not have of their own (:func:`llama_server_fields` adds them, each optional).  mypy sees
    this class without them: they are read by the table's names (``api._numbers.sampling_overrides``).
    """

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


def llama_server_fields(knobs: Iterable[Knob]) -> type[_LlamaServerFields]:
    """The shared request fields, with one per knob of *knobs* that OpenAI's bodies lack.

    Each is typed, with no range: the range is checked as the domain's overrides are made
    (``api._numbers.sampling_overrides``), so its refusal names the field as every dialect's does.
    """
    fields = {
        knob.name: attrs.field(type=knob.optional_type, default=None) for knob in knobs if not knob.openai
    }
    return with_knob_fields(_LlamaServerFields, fields)


if TYPE_CHECKING:
    LlamaServerFields = _LlamaServerFields
else:
    LlamaServerFields = llama_server_fields(KNOBS)
