"""Responses tools: what the model is offered, and what its calls are returned as.

Function tools as they are; a ``namespace`` tool's function and custom tools
under their own names (Codex's sub-agent tools), each described with the
namespace's description too, their calls returned with the ``namespace``; a
``custom`` (freeform) tool as a function taking one string, ``input``, its
calls returned as ``custom_tool_call`` items; its Lark or regex grammar
constrains a forced call's input (:mod:`bubo.grammar.freeform`).  Tools come
from ``tools`` and from ``additional_tools`` input items (what Codex sends for
the model families it knows).  Other types are skipped with a warning.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import cattrs

from bubo.api._converter import structure
from bubo.domain.messages import InputGrammar, ToolSpec

from . import wire

__all__ = ["CUSTOM_INPUT", "OfferedTools", "custom_input", "offered_tools"]

logger = logging.getLogger(__name__)

_EMPTY_SCHEMA = {"type": "object", "properties": {}}

CUSTOM_INPUT = "input"
"""The one argument a custom (freeform) tool is offered with: its input text."""


@attrs.frozen(kw_only=True)
class OfferedTools:
    """The request's tools as the model sees them, and what its calls of them are returned as.

    A namespace tool's functions are offered under their own names (their
    calls carry the ``namespace``); a custom tool is offered as a function
    taking one string, ``input``, and its calls are ``custom_tool_call`` items.
    """

    specs: tuple[ToolSpec, ...] = ()
    namespaces: Mapping[str, str] = attrs.field(factory=dict)  # a namespaced tool -> its namespace
    custom: frozenset[str] = frozenset()  # the custom tools' names


def offered_tools(converter: cattrs.Converter, groups: Sequence[tuple[str, Sequence[Any]]]) -> OfferedTools:
    """The tools of every group (``(param, tools)``: the body's, an ``additional_tools`` item's), in order.

    Function tools, custom tools, and namespace tools' function and custom tools;
    other types are skipped with a warning.  A later tool of a name offered
    already is skipped too (the model could not tell them apart).
    """
    offered = _Offered(converter)
    for param, tools in groups:
        for index, raw in enumerate(tools):
            offered.add(raw, f"{param}[{index}]", namespace=None)
    return OfferedTools(
        specs=tuple(offered.specs), namespaces=offered.namespaces, custom=frozenset(offered.custom)
    )


class _Offered:
    """The tools gathered so far."""

    def __init__(self, converter: cattrs.Converter) -> None:
        self._converter = converter
        self.specs: list[ToolSpec] = []
        self.namespaces: dict[str, str] = {}
        self.custom: set[str] = set()

    def add(self, raw: Any, param: str, *, namespace: wire.NamespaceTool | None) -> None:
        kind = raw.get("type") if isinstance(raw, dict) else None
        path = f"$.{param}"
        if kind == "namespace" and namespace is None:
            inner = structure(self._converter, raw, wire.NamespaceTool, path=path)
            for index, tool in enumerate(inner.tools or ()):
                self.add(tool, f"{param}.tools[{index}]", namespace=inner)
            return
        if kind == "function":
            spec = _function(structure(self._converter, raw, wire.FunctionTool, path=path), param, namespace)
        elif kind == "custom":
            spec = _custom(structure(self._converter, raw, wire.CustomTool, path=path), param, namespace)
        else:
            logger.warning(
                "skipping %s of type %r: Bubo serves function, namespace and custom tools", param, kind
            )
            return
        if any(offered.name == spec.name for offered in self.specs):
            logger.warning("skipping %s: a tool named %r is offered already", param, spec.name)
            return
        self.specs.append(spec)
        if kind == "custom":
            self.custom.add(spec.name)
        if namespace is not None:
            self.namespaces[spec.name] = namespace.name


def _described(description: str | None, namespace: wire.NamespaceTool | None) -> str | None:
    """A tool's description, with its namespace's after it."""
    if namespace is None or not namespace.description:
        return description
    suffix = f"({namespace.name}: {namespace.description})"
    return f"{description}\n\n{suffix}" if description else suffix


def _function(tool: wire.FunctionTool, param: str, namespace: wire.NamespaceTool | None) -> ToolSpec:
    return ToolSpec(
        name=tool.name,
        description=_described(tool.description, namespace),
        parameters=tool.parameters or _EMPTY_SCHEMA,
        strict=tool.strict,
        param=f"{param}.parameters",
    )


def _custom(tool: wire.CustomTool, param: str, namespace: wire.NamespaceTool | None) -> ToolSpec:
    """A freeform tool as a function of one string, its grammar (Lark or regex) kept for forced calls."""
    return ToolSpec(
        name=tool.name,
        description=_described(tool.description, namespace),
        parameters={
            "type": "object",
            "properties": {
                CUSTOM_INPUT: {"type": "string", "description": f"the whole input of {tool.name}"}
            },
            "required": [CUSTOM_INPUT],
        },
        input_grammar=_input_grammar(tool.format, param),
        param=f"{param}.format",
    )


def _input_grammar(format_: Mapping[str, Any] | None, param: str) -> InputGrammar | None:
    """``{"type": "grammar", "syntax": "lark" | "regex", "definition"}``; else none (``text``, or unknown)."""
    if format_ is None or format_.get("type") in (None, "text"):
        return None
    syntax, definition = format_.get("syntax"), format_.get("definition")
    if format_.get("type") != "grammar" or syntax not in ("lark", "regex") or not isinstance(definition, str):
        logger.debug("%s.format is not a lark or regex grammar; the input is not constrained", param)
        return None
    return InputGrammar(argument=CUSTOM_INPUT, syntax=syntax, definition=definition)


def custom_input(arguments: str) -> str:
    """A custom tool call's input text, from the arguments the model wrote (``{"input": "…"}``)."""
    try:
        value = json.loads(arguments)
    except ValueError:
        return arguments
    text = value.get(CUSTOM_INPUT) if isinstance(value, dict) else None
    return text if isinstance(text, str) else arguments
