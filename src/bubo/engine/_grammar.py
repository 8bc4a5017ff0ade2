"""Grammar specs to GBNF text, with llama.cpp's JSON-schema-to-grammar conversion.

The conversion is llama-cpp-python's port of llama.cpp's
``json_schema_to_grammar.py`` (``llama_cpp.llama_grammar.SchemaConverter``).
"""

from __future__ import annotations

from llama_cpp.llama_grammar import SchemaConverter

from bubo.domain.generation import GrammarSpec

from .base import GrammarRejected

__all__ = ["to_gbnf"]


def to_gbnf(spec: GrammarSpec) -> str:
    """The complete GBNF text for *spec*: its own rules plus one rule per schema.

    Raises:
        GrammarRejected: the converter refused a schema (an unanchored ``pattern``,
            a ``$ref`` that does not resolve, …); it reports with ``assert``.

    """
    if not spec.schemas:
        return spec.rules
    converter = SchemaConverter(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)
    aliases = []
    for name, schema in spec.schemas:
        try:
            resolved = converter.resolve_refs(dict(schema), name)
            rule = converter.visit(resolved, name)
        except (AssertionError, KeyError, TypeError, ValueError, RecursionError) as error:
            raise GrammarRejected(f"the JSON schema cannot be turned into a grammar: {error}") from None
        if rule != name:  # primitives are shared rules ("integer"), named after their type
            aliases.append(f"{name} ::= {rule}")
    return "\n".join([spec.rules, *aliases, converter.format_grammar()])
