"""Grammar specs to GBNF text, with llama.cpp's JSON-schema-to-grammar conversion.

The conversion is llama-cpp-python's port of llama.cpp's
``json_schema_to_grammar.py`` (``llama_cpp.llama_grammar.SchemaConverter``).
"""

from __future__ import annotations

from llama_cpp.llama_grammar import SchemaConverter

from bubo.domain.generation import GrammarSpec

__all__ = ["to_gbnf"]


def to_gbnf(spec: GrammarSpec) -> str:
    """The complete GBNF text for *spec*: its own rules plus one rule per schema."""
    if not spec.schemas:
        return spec.rules
    converter = SchemaConverter(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)
    aliases = []
    for name, schema in spec.schemas:
        resolved = converter.resolve_refs(dict(schema), name)
        rule = converter.visit(resolved, name)
        if rule != name:  # primitives are shared rules ("integer"), named after their type
            aliases.append(f"{name} ::= {rule}")
    return "\n".join([spec.rules, *aliases, converter.format_grammar()])
