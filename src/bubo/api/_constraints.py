"""llama-server's ways to constrain the output, read the same in every dialect that has them.

``grammar`` (GBNF text), ``json_schema`` (a schema at the top level) and
``response_format`` (OpenAI's, with llama-server's ``schema`` beside ``type``)
each constrain the whole answer; a request may send one of them.  None of them
is ignored: a field Bubo accepted but did not enforce would be a silently
unconstrained answer.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bubo.domain.requests import OutputFormat, RawGrammar
from bubo.errors import InvalidRequest

__all__ = ["output_constraint"]


def output_constraint(
    *,
    grammar: str | None = None,
    json_schema: Mapping[str, Any] | None = None,
    response_format: OutputFormat | None = None,
) -> tuple[OutputFormat | None, RawGrammar | None]:
    """The one constraint a request sends, as a schema or a grammar (at most one is set).

    Raises:
        InvalidRequest: two of the fields are set, or ``grammar`` is empty.

    """
    given = [
        name
        for name, value in (
            ("response_format", response_format),
            ("json_schema", json_schema),
            ("grammar", grammar),
        )
        if value is not None
    ]
    if len(given) > 1:
        raise InvalidRequest(
            f"{given[0]} and {given[1]} both constrain the output; send one of them", param=given[1]
        )
    if grammar is not None:
        if not grammar.strip():
            raise InvalidRequest("grammar must not be empty", param="grammar")
        return None, RawGrammar(rules=grammar)
    if json_schema is not None:
        return OutputFormat(schema=json_schema, param="json_schema"), None
    return response_format, None
