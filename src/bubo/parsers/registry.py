"""Tool-call parsers by name, imported on first use.

``hermes`` (``<tool_call>`` JSON, plus leading bare/fenced JSON), ``qwen3_coder``
(``<tool_call>`` with XML parameters), ``json`` (bare/fenced JSON only).  The
server picks one from the chat template unless ``--tool-call-parser`` names it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence

from bubo.domain.generation import GrammarSpec
from bubo.domain.messages import ToolSpec

from .base import ParserConfig, StreamParser

__all__ = ["ToolFormat", "available_tool_parsers", "format_for_template", "make_tool_parser", "tool_format"]

# name -> (module, parser class)
_PARSERS: dict[str, tuple[str, str]] = {
    "hermes": ("bubo.parsers.tools.hermes", "HermesParser"),
    "qwen3_coder": ("bubo.parsers.tools.qwen3_coder", "Qwen3CoderParser"),
    "json": ("bubo.parsers.tools.json_objects", "JsonObjectsParser"),
}

GrammarBuilder = Callable[..., GrammarSpec]


class ToolFormat:
    """One registered format: its parser and its call grammar."""

    def __init__(self, name: str) -> None:
        module_name, class_name = _PARSERS[name]
        module = importlib.import_module(module_name)
        self.name = name
        self._parser: Callable[[ParserConfig], StreamParser] = getattr(module, class_name)
        self._grammar: GrammarBuilder = module.call_grammar

    def parser(self, config: ParserConfig) -> StreamParser:
        """A fresh parser for one request."""
        return self._parser(config)

    def grammar(self, tools: Sequence[ToolSpec], *, prefix: str, max_calls: int | None) -> GrammarSpec:
        """A grammar that admits only calls of *tools* in this format."""
        return self._grammar(tools, prefix=prefix, max_calls=max_calls)


def available_tool_parsers() -> tuple[str, ...]:
    """The registered names."""
    return tuple(_PARSERS)


def tool_format(name: str) -> ToolFormat:
    """The format called *name*.

    Raises:
        ValueError: no such format; the message lists the registered ones.

    """
    if name not in _PARSERS:
        known = ", ".join(_PARSERS)
        raise ValueError(f"tool-call parser {name!r} not found; available: {known}")
    return ToolFormat(name)


def format_for_template(source: str) -> str:
    """The format a chat template's own tool syntax implies (``hermes`` when it has none)."""
    if "<tool_call>" in source and "<function=" in source:
        return "qwen3_coder"
    return "hermes"


def make_tool_parser(name: str, config: ParserConfig) -> StreamParser:
    """A parser of format *name* for one request."""
    return tool_format(name).parser(config)
