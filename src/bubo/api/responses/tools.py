"""Responses tools: what the model is offered, and what its calls are returned as.

Function tools as they are; a ``namespace`` tool's functions under their own
names (Codex's sub-agent tools), each described with the namespace's
description too, their calls returned with the ``namespace``; a ``custom``
(freeform) tool as a function taking one string, ``input``, its calls returned
as ``custom_tool_call`` items.  Other types are skipped with a warning.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import cattrs

from bubo.api._converter import structure
from bubo.domain.messages import ToolSpec

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
    namespaces: Mapping[str, str] = attrs.field(factory=dict)  # a namespaced function -> its namespace
    custom: frozenset[str] = frozenset()  # the custom tools' names


def offered_tools(converter: cattrs.Converter, tools: Sequence[dict[str, Any]]) -> OfferedTools:
    """Function tools, the functions of namespace tools, custom tools; other types are skipped."""
    specs: list[ToolSpec] = []
    namespaces: dict[str, str] = {}
    custom: set[str] = set()
    for index, raw in enumerate(tools):
        path = f"$.tools[{index}]"
        match raw.get("type"):
            case "function":
                specs.append(
                    _function(structure(converter, raw, wire.FunctionTool, path=path), f"tools[{index}]")
                )
            case "namespace":
                namespace = structure(converter, raw, wire.NamespaceTool, path=path)
                for inner, spec in enumerate(_namespace_functions(converter, namespace, f"tools[{index}]")):
                    specs.append(spec)
                    namespaces.setdefault(spec.name, namespace.name)
                    logger.debug(
                        "offering %s from namespace %s (tools[%d].tools[%d])",
                        spec.name,
                        namespace.name,
                        index,
                        inner,
                    )
            case "custom":
                tool = structure(converter, raw, wire.CustomTool, path=path)
                specs.append(_custom(tool, f"tools[{index}]"))
                custom.add(tool.name)
            case other:
                logger.warning(
                    "skipping tool %s of type %r: Bubo serves function, namespace and custom tools",
                    index,
                    other,
                )
    return OfferedTools(specs=tuple(specs), namespaces=namespaces, custom=frozenset(custom))


def _function(
    tool: wire.FunctionTool, param: str, *, namespace: wire.NamespaceTool | None = None
) -> ToolSpec:
    description = tool.description
    if namespace is not None and namespace.description:
        description = (
            f"{description}\n\n({namespace.name}: {namespace.description})"
            if description
            else namespace.description
        )
    return ToolSpec(
        name=tool.name,
        description=description,
        parameters=tool.parameters or _EMPTY_SCHEMA,
        strict=tool.strict,
        param=f"{param}.parameters",
    )


def _namespace_functions(
    converter: cattrs.Converter, namespace: wire.NamespaceTool, param: str
) -> list[ToolSpec]:
    """A namespace's function tools, each described with the namespace's description too."""
    specs = []
    for index, raw in enumerate(namespace.tools or ()):
        if raw.get("type") != "function":
            logger.warning(
                "skipping %s.tools[%d] of type %r: only function tools are served",
                param,
                index,
                raw.get("type"),
            )
            continue
        tool = structure(converter, raw, wire.FunctionTool, path=f"$.{param}.tools[{index}]")
        specs.append(_function(tool, f"{param}.tools[{index}]", namespace=namespace))
    return specs


def _custom(tool: wire.CustomTool, param: str) -> ToolSpec:
    """A freeform tool as a function of one string (its grammar, if any, is described, not enforced)."""
    return ToolSpec(
        name=tool.name,
        description=tool.description,
        parameters={
            "type": "object",
            "properties": {
                CUSTOM_INPUT: {"type": "string", "description": f"the whole input of {tool.name}"}
            },
            "required": [CUSTOM_INPUT],
        },
        param=f"{param}.format",
    )


def custom_input(arguments: str) -> str:
    """A custom tool call's input text, from the arguments the model wrote (``{"input": "…"}``)."""
    try:
        value = json.loads(arguments)
    except ValueError:
        return arguments
    text = value.get(CUSTOM_INPUT) if isinstance(value, dict) else None
    return text if isinstance(text, str) else arguments
