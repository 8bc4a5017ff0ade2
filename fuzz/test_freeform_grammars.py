"""Lark grammars of freeform tools, garbled and well-formed, through the GBNF translation and llama.cpp.

Invariants: translating never raises (a grammar it cannot enforce gives
None), and every GBNF it writes, JSON-escaped or raw, is a grammar llama.cpp's
own parser accepts (so a forced custom tool call never fails on its grammar).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bubo.config import default_model_path
from bubo.domain.generation import GrammarSpec
from bubo.domain.messages import InputGrammar
from bubo.engine import GrammarRejected
from bubo.engine.llama import LlamaEngine, LlamaOptions, load_llama_engine
from bubo.grammar.freeform import input_rules

from ._budget import run_fuzz

# Lark's notation in pieces: names, strings, regular expressions, operators, directives, line breaks
_PIECES = [
    "start", "item", "A", "_B", ":", " ", "\n", "\n    | ", "|", "(", ")", "[", "]", "?", "*", "+", "~ 2",
    "~ 1..3", "..", "->", "x", '"a"', '"b"i', '"\\n"', '"\\""', "/[a-z]+/", "/./s", "/[^\\n]*/", "/\\d/",
    "/(a|b)?/", "/\\s+/", '"a".."z"', "%import common.LF", "%import common (WS, INT)", "%ignore WS",
    "%declare C", "// note", "{x}", ".2", "!", "/^a$/", "/a{0,100}/", '/[\\x00-\\x1f"]/',
]  # fmt: skip
garbled = st.lists(st.sampled_from(_PIECES), max_size=30).map("".join)
garbled = garbled | garbled.map("start: ".__add__)

_atoms = st.sampled_from(
    ['"a"', '"\\""', '"\\\\"', '"\\t"', "/[a-z0-9]/", "/[\\s\\S]/", '/[^"]+/', "LF", "WS"]
)
_items = st.deferred(
    lambda: st.tuples(
        _atoms | st.lists(_items, min_size=1, max_size=3).map(lambda alts: "(" + " | ".join(alts) + ")"),
        st.sampled_from(["", "", "?", "*", "+", " ~ 2", " ~ 0..3"]),
    ).map("".join)
)
well_formed = st.lists(_items, min_size=1, max_size=5).map(
    lambda items: "start: " + " ".join(items) + "\n%import common (LF, WS)\n"
)


@pytest.fixture(name="engine", scope="module")
def _engine() -> Iterator[LlamaEngine]:
    path: Path = default_model_path()
    engine = load_llama_engine(LlamaOptions(model_path=path, n_ctx=256, n_threads=1))
    yield engine
    engine.close()


@pytest.mark.llama
async def test_every_grammar_written_is_one_llama_cpp_parses(engine: LlamaEngine) -> None:
    """None or GBNF llama.cpp accepts, in both writings, for garbled and well-formed Lark."""

    @given(garbled | well_formed, st.booleans())
    def example(definition: str, json_string: bool) -> None:
        rules = input_rules(
            InputGrammar(argument="input", syntax="lark", definition=definition),
            "in",
            json_string=json_string,
        )
        if rules is None:
            return
        try:
            engine.compile_grammar(GrammarSpec(rules="root ::= in\n" + rules))
        except GrammarRejected as error:  # pragma: no cover - a failure names the grammar
            pytest.fail(f"{definition!r} became GBNF llama.cpp rejects: {error.message}\n{rules}")

    await run_fuzz(example)
