"""A freeform tool's Lark or regex grammar as GBNF: the strings it admits, JSON-escaped or raw, and what is refused."""

from __future__ import annotations

import builtins
import io
import json
import os
from pathlib import Path

import pytest

from bubo.domain.messages import InputGrammar, ToolSpec
from bubo.grammar.freeform import MAX_DEFINITION_CHARS, input_rules, json_arguments

from ._gbnf_language import language

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "agents"

APPLY_PATCH = r"""
start: begin_patch hunk+ end_patch
begin_patch: "*** Begin Patch" LF
end_patch: "*** End Patch" LF?

hunk: add_hunk | delete_hunk | update_hunk
add_hunk: "*** Add File: " filename LF add_line+
delete_hunk: "*** Delete File: " filename LF
update_hunk: "*** Update File: " filename LF change_move? change?

filename: /(.+)/
add_line: "+" /(.*)/ LF -> line

change_move: "*** Move to: " filename LF
change: (change_context | change_line)+ eof_line?
change_context: ("@@" | "@@ " /(.+)/) LF
change_line: ("+" | "-" | " ") /(.*)/ LF
eof_line: "*** End of File" LF

%import common.LF
"""
"""Codex's apply_patch tool grammar (codex-rs tool_apply_patch.lark)."""

PATCH = "*** Begin Patch\n*** Update File: calc.py\n@@ def add(a, b):\n-    return a - b\n+    return a + b\n*** End Patch\n"


def codex_exec_grammar() -> str:
    """The Lark grammar of Codex's exec tool, as Codex 0.169 sent it (tests/fixtures/agents/codex-1.json)."""
    body = json.loads((FIXTURES / "codex-1.json").read_text())["body"]
    stack = [tool for item in body["input"] if "tools" in item for tool in item["tools"]]
    while stack:
        tool = stack.pop()
        if tool.get("type") == "namespace":
            stack.extend(tool["tools"])
        elif tool.get("name") == "exec":
            definition: str = tool["format"]["definition"]
            return definition
    raise AssertionError("no exec tool in the fixture")


def admits(definition: str, text: str, *, syntax: str = "lark") -> tuple[bool, bool]:
    """Whether the raw rules admit *text*, and the JSON-string rules admit *text* as JSON writes it."""
    grammar = InputGrammar(argument="input", syntax=syntax, definition=definition)  # type: ignore[arg-type]
    raw = input_rules(grammar, "in", json_string=False)
    escaped = input_rules(grammar, "in", json_string=True)
    assert raw is not None
    assert escaped is not None
    in_json = json.dumps(text, ensure_ascii=False)[1:-1]
    return (
        language(raw, "in").fullmatch(text) is not None,
        language(escaped, "in").fullmatch(in_json) is not None,
    )


class TestCodexGrammars:
    def test_exec_takes_any_source_with_or_without_its_pragma(self) -> None:
        """exec: JavaScript source, optionally after a `// @exec:` line; never the empty string."""
        grammar = codex_exec_grammar()
        assert admits(grammar, 'await tools.exec_command({cmd: "cat calc.py"})\ntext("ok")') == (True, True)
        assert admits(grammar, '// @exec: {"yield_time_ms": 1000}\r\nexit()') == (True, True)
        assert admits(grammar, "") == (False, False)

    def test_apply_patch_takes_a_patch_and_nothing_else(self) -> None:
        """apply_patch: a whole patch admits; one without its end, or with a stray line, does not."""
        assert admits(APPLY_PATCH, PATCH) == (True, True)
        assert admits(APPLY_PATCH, "*** Begin Patch\n*** Add File: a.py\n+x = 1\n*** End Patch") == (
            True,
            True,
        )
        assert admits(APPLY_PATCH, PATCH.replace("*** End Patch\n", "")) == (False, False)
        assert admits(APPLY_PATCH, PATCH.replace("@@", "??")) == (False, False)


class TestJsonString:
    def test_quotes_backslashes_and_control_characters_are_written_escaped(self) -> None:
        """Inside a JSON string a quote, a backslash and a newline appear as escapes, never raw."""
        grammar = InputGrammar(argument="input", syntax="lark", definition=r'start: /[a"\\\n]+/')
        rules = input_rules(grammar, "in", json_string=True)
        assert rules is not None
        pattern = language(rules, "in")
        assert pattern.fullmatch(r"a\"\\\n")
        for raw in ('a"', "a\\", "a\n"):
            assert not pattern.fullmatch(raw)

    def test_a_freeform_tools_arguments_are_an_object_with_its_input(self) -> None:
        """json_arguments: {"input": "…"} for a freeform tool, the JSON schema for any other."""
        freeform = ToolSpec(
            name="shout",
            parameters={"type": "object", "properties": {"input": {"type": "string"}}},
            input_grammar=InputGrammar(argument="input", syntax="regex", definition="^[A-Z]+!$"),
        )
        plain = ToolSpec(name="add", parameters={"type": "object", "properties": {"a": {"type": "number"}}})
        rules, schemas = json_arguments([plain, freeform])
        assert schemas == (("args-0", dict(plain.parameters)),)
        pattern = language(rules, "args-1")
        assert pattern.fullmatch('{"input": "HEY!"}')
        assert not pattern.fullmatch('{"input": "hey"}')


class TestLark:
    @pytest.mark.parametrize(
        ("definition", "yes", "no"),
        [
            ('start: "abc"i', ["aBc", "ABC"], ["abd"]),
            ('start: "a".."c"+', ["abcba"], ["abd", ""]),
            ('start: "x" ~ 2..3', ["xx", "xxx"], ["x", "xxxx"]),
            ('start: "a" ["b"] "c"', ["ac", "abc"], ["abbc"]),
            ('?start: item+ -> items\n!item: "a"\n    | "b"', ["abba"], ["c"]),
            ("start: A B\nA.2: /[0-9]+/\nB: /[a-z]*/i", ["12ab", "3XY", "7"], ["ab"]),
            ("start: NUMBER\n%import common.NUMBER", ["12", "1.5", "2e10"], ["e", "1.2.3"]),
            ('start: word ("," word)*\nword: CNAME\n%import common (CNAME)', ["a,b_1"], ["1a"]),
            ('start: "a" "b"\n%ignore " "', ["ab", " a b ", "a  b"], ["a b c"]),
            ("start: WORD\n%import common.WORD -> WORD // a comment\n", ["owl"], ["owl1"]),
            (r'start: "\x41\u00e9\n"', ["Aé\n"], ["A"]),
        ],
    )
    def test_notation(self, definition: str, yes: list[str], no: list[str]) -> None:
        """Lark's strings, ranges, repetitions, optionals, aliases, modifiers, priorities, imports, %ignore."""
        for text in yes:
            assert admits(definition, text) == (True, True), text
        for text in no:
            assert admits(definition, text) == (False, False), text

    def test_recursion_that_is_not_left_recursion_is_kept(self) -> None:
        """Nested parentheses: a rule that refers to itself after a token is enforced."""
        grammar = InputGrammar(argument="input", syntax="lark", definition='start: "(" start ")" | "x"')
        rules = input_rules(grammar, "in", json_string=True)
        assert rules is not None
        assert 'in-0-start ::= ( ( "(" in-0-start ")" ) | "x" )' in rules

    @pytest.mark.parametrize(
        "definition",
        [
            'start: start "a" | "a"',  # left recursion (llama.cpp refuses it)
            'start: item "b"\nitem: start | "a"',  # through another rule
            'start: ("a"?)*',  # repeating what can be empty never ends
            'start: "a" sep{x}\nsep{x}: x',  # templates
            "%declare A\nstart: A",
            "start: OTHER\n%import other.OTHER",
            "start: NOPE\n%import common.NOPE",
            "start: missing",
            'item: "a"',  # no start rule
            'start: "a" ~ 101',
            "start: /^a$/",
            "start: /a(?=b)/",
            r"start: /(a)\1/",
            "start: /a b/x",
            "start: /[]/",
            "start: /a{3,2}/",
            'start: "a" : "b"',
            'start: (((((((((((((((((((((((((((((((((("a"))))))))))))))))))))))))))))))))))',
            "start: /a{" + "9" * 5000 + "}/",  # int() of it would raise (over 4,300 digits): a 500
            "start: /a{1," + "9" * 5000 + "}/",
        ],
    )
    def test_what_cannot_be_enforced_leaves_the_input_unconstrained(self, definition: str) -> None:
        """Refused grammars give no rules (the input is a plain string), never an error."""
        assert (
            input_rules(
                InputGrammar(argument="input", syntax="lark", definition=definition), "in", json_string=True
            )
            is None
        )

    def test_no_import_reads_a_file(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """%import common is Lark's known terminals; any other import is refused; no file is ever opened."""
        opened: list[object] = []

        def no_file(path: object, *_args: object, **_kwargs: object) -> None:
            opened.append(path)
            raise AssertionError(f"a grammar opened {path!r}")

        imports = [
            "common.LF",
            ".common.LF",
            "other.LF",
            "lark.common.LF",
            "..etc.passwd.LF",
            "/etc/passwd.LF",
        ]
        grammars = [InputGrammar(argument="input", syntax="lark", definition=f"start: LF\n%import {name}") for name in imports]  # fmt: skip
        with monkeypatch.context() as patched:
            for module in (builtins, io, os):
                patched.setattr(module, "open", no_file)
            rules = [input_rules(grammar, "in", json_string=True) for grammar in grammars]
        assert opened == []
        assert rules[0] is not None
        assert rules[1:] == [None] * (len(imports) - 1)

    def test_a_grammar_too_long_is_not_read(self) -> None:
        """More than MAX_DEFINITION_CHARS characters is not read at all."""
        long = 'start: "' + "a" * MAX_DEFINITION_CHARS + '"'
        assert (
            input_rules(
                InputGrammar(argument="input", syntax="lark", definition=long), "in", json_string=False
            )
            is None
        )


class TestRegexSyntax:
    @pytest.mark.parametrize(
        ("pattern", "yes", "no"),
        [
            ("^[0-9]{3}$", ["123"], ["12", "1234"]),
            ("(?:ab|cd)+", ["abcd"], ["abc"]),
            (r"\d+\.\d{1,2}", ["3.14"], ["3.", "3.141"]),
            (r"[^\s]+\s\S", ["ab c"], ["ab  c"]),
            (r"\w+", ["owl_1", "éa"], ["a-b"]),
            (r"a{,2}b", ["b", "aab"], ["aaab"]),
            (r"x{y", ["x{y"], ["xy"]),
            (r".+", ["any thing"], ["two\nlines"]),
        ],
    )
    def test_regular_expressions(self, pattern: str, yes: list[str], no: list[str]) -> None:
        """A regex grammar matches whole inputs: classes, escapes, bounds, groups, literal braces, the dot."""
        for text in yes:
            assert admits(pattern, text, syntax="regex") == (True, True), text
        for text in no:
            assert admits(pattern, text, syntax="regex") == (False, False), text
