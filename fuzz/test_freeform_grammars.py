"""Lark grammars of freeform tools, garbled and well-formed, through the GBNF translation and llama.cpp.

Invariants: translating never raises (a grammar it cannot enforce gives
None), every GBNF it writes, JSON-escaped or raw, is a grammar llama.cpp's
own parser accepts (so a forced custom tool call never fails on its grammar),
and a hostile grammar is bounded: what is written stays within
``MAX_RULES_CHARS``, nested bounds multiply to at most ``MAX_REPEAT_WEIGHT``
(through rule references too), and the largest grammars of each costly shape
are read in one pass (the work counted, not timed).
"""

from __future__ import annotations

import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bubo.domain.generation import GrammarSpec
from bubo.domain.messages import InputGrammar
from bubo.engine import GrammarRejected
from bubo.engine.llama import LlamaEngine
from bubo.grammar.freeform import (
    MAX_DEFINITION_CHARS,
    MAX_DEFINITIONS,
    MAX_REPEAT_WEIGHT,
    MAX_RULES_CHARS,
    input_rules,
)

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


CALLS_PER_CHARACTER = 40
"""Python calls per character of grammar, both writings together: the shapes below take 6 to 18;
a pass per rule (a fixed point over 1,000 chained rules, 6.6 s) would take hundreds."""

# nested bounded repetitions, some through rules: the weight is the product of the bounds on a path
_bound = st.integers(min_value=1, max_value=12)
nested_bounds = st.lists(st.tuples(_bound, st.booleans()), min_size=1, max_size=5)


def _nested(levels: list[tuple[int, bool]]) -> tuple[str, int]:
    """A grammar repeating "a" inside each bound (a level with True is a rule of its own), and its weight."""
    rules, body, weight = [], '"a"', 1
    for index, (bound, own_rule) in enumerate(levels):
        body = f"({body}) ~ 1..{bound}"
        weight *= bound
        if own_rule:
            rules.append(f"r{index}: {body}")
            body = f"r{index}"
    return "\n".join([f"start: {body}", *rules]), weight


@given(nested_bounds)
def test_nested_bounds_are_refused_past_the_weight(levels: list[tuple[int, bool]]) -> None:
    """A grammar whose bounds multiply past MAX_REPEAT_WEIGHT is not enforced; one within it is."""
    definition, weight = _nested(levels)
    grammar = InputGrammar(argument="input", syntax="lark", definition=definition)
    rules = input_rules(grammar, "in", json_string=True)
    assert (rules is not None) == (weight <= MAX_REPEAT_WEIGHT), definition


def _hostile() -> dict[str, str]:
    """The largest grammar of each costly shape that is still read (within MAX_DEFINITION_CHARS)."""
    last = MAX_DEFINITIONS - 2
    chained = "".join(f"a{i}: a{i + 1}\n" for i in range(last))
    tailed = "".join(f'a{i}: a{i + 1} "x"\n' for i in range(last))
    tokens = " ".join(['"a"'] * (MAX_DEFINITION_CHARS // 4 - 10))
    escaped = " ".join(f"/[\\x00-\\x{i % 31 + 1:02x}]/" for i in range(MAX_DEFINITION_CHARS // 16))
    bounded = "".join(f'r{i}: ("a" ~ 10) ~ 10\n' for i in range(300))
    return {
        # "" propagates up a chain written top-down: a fixed point would take a pass per rule
        "empty through a chain": f'start: a0 "x"\n{chained}a{last}: "a"?\n',
        "left recursion at the end of a chain": f"start: a0\n{tailed}a{last}: a0\n",
        "too many rules": "start: a0\n" + "".join(f'a{i}: "x"\n' for i in range(MAX_DEFINITIONS + 1)),
        "a long case-insensitive string": 'start: "' + "a" * (MAX_DEFINITION_CHARS - 20) + '"i',
        "ignored text before every token": f'start: {tokens}\n%ignore " "',
        "classes that need JSON escapes": f"start: {escaped}",
        "groups as deep as allowed": "start: " + "(" * 32 + '"a"' + ")" * 32,
        "a regex as deep as allowed": "start: /" + "(" * 32 + "a" + ")" * 32 + "/",
        "bounds multiplied through rules": "start: " + " ".join(f"r{i}" for i in range(300)) + f"\n{bounded}",
    }


@pytest.mark.parametrize("shape", list(_hostile()))
def test_a_hostile_grammar_is_bounded(shape: str) -> None:
    """Refused or written within MAX_RULES_CHARS, in a number of Python calls linear in its length."""
    definition = _hostile()[shape]
    assert len(definition) <= MAX_DEFINITION_CHARS
    calls = 0

    def count(_frame: object, event: str, _arg: object) -> None:
        nonlocal calls
        calls += event == "call"

    for json_string in (False, True):
        grammar = InputGrammar(argument="input", syntax="lark", definition=definition)
        sys.setprofile(count)
        try:
            rules = input_rules(grammar, "in", json_string=json_string)
        finally:
            sys.setprofile(None)
        assert rules is None or len(rules) <= MAX_RULES_CHARS
    assert calls <= CALLS_PER_CHARACTER * len(definition), calls
