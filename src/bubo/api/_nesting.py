"""A bound on how deeply the JSON a request carries as text (tool-call arguments) may nest.

Arguments of earlier tool calls arrive as JSON text (OpenAI, Responses) or as an
object (Anthropic) and are parsed again to render the prompt.  Python parses and
prints JSON recursively, so ``"["`` repeated 100,000 times would end in a
``RecursionError``; the depth is counted first, without parsing, and anything
deeper than :data:`MAX_ARGUMENT_DEPTH` is a 400.
"""

from __future__ import annotations

import re
from typing import Any

from bubo.errors import InvalidRequest

__all__ = ["MAX_ARGUMENT_DEPTH", "check_arguments_depth", "check_value_depth"]

MAX_ARGUMENT_DEPTH = 64
"""Arrays and objects inside one another in one call's arguments (real calls nest a few levels)."""

# A string literal (skipped whole, so brackets inside strings do not count) or one bracket.  An
# unclosed string runs to the end of the text: the match never fails, so each character is read
# once (a string that had to close would be rescanned from every later quote: quadratic).
_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*(?:"|\\?\Z)|[\[\]{}]', re.DOTALL)


def _too_deep(param: str) -> InvalidRequest:
    return InvalidRequest(
        f"the tool-call arguments at {param} nest deeper than {MAX_ARGUMENT_DEPTH} arrays or objects",
        code="arguments_too_deep",
        param=param,
    )


def check_arguments_depth(text: str, param: str) -> str:
    """*text* (JSON or not) if its brackets nest at most :data:`MAX_ARGUMENT_DEPTH` deep.

    Raises:
        InvalidRequest: ``arguments_too_deep``, ``param`` *param*.

    """
    if text.count("[") + text.count("{") <= MAX_ARGUMENT_DEPTH:
        return text
    depth = 0
    for match in _TOKENS.finditer(text):
        bracket = match.group()
        if bracket in ("[", "{"):
            depth += 1
            if depth > MAX_ARGUMENT_DEPTH:
                raise _too_deep(param)
        elif bracket in ("]", "}"):
            depth -= 1
    return text


def check_value_depth(value: Any, param: str) -> Any:
    """*value* (parsed JSON) if its arrays and objects nest at most :data:`MAX_ARGUMENT_DEPTH` deep.

    Raises:
        InvalidRequest: ``arguments_too_deep``, ``param`` *param*.

    """
    level: list[Any] = [value]
    for _ in range(MAX_ARGUMENT_DEPTH):
        level = [
            child
            for item in level
            if isinstance(item, dict | list)
            for child in (item.values() if isinstance(item, dict) else item)
        ]
        if not level:
            return value
    if any(isinstance(item, dict | list) for item in level):
        raise _too_deep(param)
    return value
