"""The settings that take one of a few words, each a ``Literal`` type.

Declared once here, below every layer that reads them: the settings (``bubo.config``)
parse a flag's word with :func:`words` and cattrs checks the value when the tree is
built; the engine and the services take the same types, so mypy checks every use
(a typo in a comparison or a missing table entry is a type error, not a silent
fallback).  The order of the words is the order an error message lists them in.
"""

from __future__ import annotations

from typing import Literal, get_args

__all__ = [
    "CourierMode",
    "DraftMode",
    "FlashAttention",
    "KeepAlivePolicy",
    "KvCacheType",
    "LogLevel",
    "ModelNames",
    "Pooling",
    "ReasoningFormat",
    "ReasoningMode",
    "RepackMode",
    "words",
]

FlashAttention = Literal["auto", "on", "off"]
"""``--flash-attn``: llama.cpp decides (auto), or always, or never."""

KvCacheType = Literal["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"]
"""``-ctk``/``-ctv``: the KV cache's data types llama-server accepts."""

Pooling = Literal["none", "mean", "cls", "last", "rank"]
"""``--pooling``: how an embedding pools the token states."""

DraftMode = Literal["measured", "always"]
"""``--draft-policy``: draft only where it is measured to pay, or whenever a generation is alone."""

CourierMode = Literal["auto", "on", "off"]
"""``--courier``: a thread hands the decode thread's events to the event loop: where a CPU is free (auto),
always, or never (the decode thread posts them itself)."""

RepackMode = Literal["auto", "on", "off"]
"""``--repack``: llama.cpp's CPU weight repacking, probed (auto), forced on, or off."""

ReasoningMode = Literal["on", "off", "auto"]
"""``--reasoning``: ``enable_thinking`` for templates that read it; auto leaves the template's default."""

ReasoningFormat = Literal["auto", "none", "deepseek", "deepseek-legacy"]
"""``--reasoning-format``: where thinking goes (auto is deepseek: in ``reasoning_content``)."""

ModelNames = Literal["strict", "any"]
"""``--model-names``: only the served names are the model, or every name is."""

KeepAlivePolicy = Literal["obey", "extend", "ignore"]
"""``--ollama-keep-alive``: what an Ollama request's ``keep_alive`` may do to the model's idle timeout: set
it (Ollama's behaviour), only lengthen it beyond ``--sleep-idle-seconds``, or nothing."""

LogLevel = Literal["debug", "info", "warning", "error"]
"""``--log-level``."""


def words(mode: object) -> tuple[str, ...]:
    """The words a ``Literal`` mode type allows, in order."""
    return get_args(mode)
