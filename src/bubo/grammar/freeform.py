"""A freeform tool's input grammar (Lark or a regular expression) as GBNF rules, where it can be enforced.

Responses custom tools (Codex's ``exec``, ``apply_patch``) send the grammar
their one string input follows.  A forced call of such a tool is constrained by
it: the tool-call formats put :func:`input_rules` where the input's text goes,
written as the characters of a JSON string (Hermes, bare JSON calls) or as they
are (Qwen3-Coder's XML parameters).  A grammar that cannot be enforced (one
that is refused by :mod:`._lark` or :mod:`._regex`, left-recursive, repeats what
can be empty, or is too large) leaves the input unconstrained, with a debug log.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping, Sequence
from typing import Any

from bubo.domain.messages import InputGrammar, ToolSpec

from ._language import Alt, Chars, Expr, Ref, Refused, Repeat, Seq, Text, chars, references, subtract
from ._lark import IGNORED, START, parse_lark
from ._regex import parse_regex

__all__ = ["MAX_DEFINITION_CHARS", "MAX_RULES_CHARS", "input_rules", "json_arguments"]

logger = logging.getLogger(__name__)

MAX_DEFINITION_CHARS = 64 * 1024
"""The longest grammar read (Codex's are under 2,000 characters)."""
MAX_RULES_CHARS = 256 * 1024
"""The most GBNF text one input's grammar may become."""

_JSON_SPECIAL = chars([(0x00, 0x1F), (0x22, 0x22), (0x5C, 0x5C)])
"""What a JSON string writes as an escape: control characters, the quote, the backslash."""
_NAME_CHARS = re.compile(r"[^a-z0-9]+")


def input_rules(grammar: InputGrammar, rule: str, *, json_string: bool) -> str | None:
    """GBNF rules defining *rule* as the input *grammar* admits, or None when it cannot be enforced.

    With *json_string*, *rule* is the text between a JSON string's quotes (each
    character escaped as ``json.dumps`` escapes it); else the input itself.
    The other rules' names start with *rule* and a dash.
    """
    try:
        definitions = _definitions(grammar)
        _check(definitions)
        text = _Writer(rule, definitions, json_string=json_string).rules()
    except Refused as refused:
        logger.debug("the %s grammar of tool input is not enforced: it %s", grammar.syntax, refused)
        return None
    if len(text) > MAX_RULES_CHARS:
        logger.debug("the %s grammar of tool input is not enforced: too large", grammar.syntax)
        return None
    return text


def json_arguments(tools: Sequence[ToolSpec]) -> tuple[str, tuple[tuple[str, dict[str, Any]], ...]]:
    """The arguments object of each tool's call as rule ``args-N``: GBNF rules, and JSON schemas.

    A freeform tool whose grammar can be enforced gets rules for
    ``{"input": "…"}`` with the input in its grammar; every other tool's
    arguments follow its JSON schema (the engine converts those).
    """
    rules: list[str] = []
    schemas: list[tuple[str, dict[str, Any]]] = []
    for index, tool in enumerate(tools):
        rule = f"args-{index}"
        grammar = tool.input_grammar
        inner = None if grammar is None else input_rules(grammar, f"{rule}-input", json_string=True)
        if grammar is None or inner is None:
            schemas.append((rule, dict(tool.parameters)))
            continue
        head = _literal("{" + json.dumps(grammar.argument) + ': "')
        rules.append(f"{rule} ::= {head} {rule}-input {_literal(chr(34) + '}')}\n{inner}")
    return "".join(rules), tuple(schemas)


def _definitions(grammar: InputGrammar) -> Mapping[str, Expr]:
    if len(grammar.definition) > MAX_DEFINITION_CHARS:
        raise Refused(f"is longer than {MAX_DEFINITION_CHARS} characters")
    if grammar.syntax == "lark":
        return parse_lark(grammar.definition).definitions
    pattern = grammar.definition
    pattern = pattern.removeprefix("^")
    if pattern.endswith("$") and not pattern.endswith("\\$"):
        pattern = pattern[:-1]
    return {START: parse_regex(pattern)}


# ---- what llama.cpp's grammar sampler cannot follow ----------------------------------------------


def _check(definitions: Mapping[str, Expr]) -> None:
    """Refuse left recursion (llama.cpp rejects it) and repeating what can be empty (it never ends)."""
    empty = _nullable(definitions)
    for name, expr in definitions.items():
        _check_repeats(name, expr, empty)
    leading = {name: set(_leading(expr, empty)) for name, expr in definitions.items()}
    state: dict[str, int] = {}  # 1: on the path, 2: done
    for root in definitions:
        if state.get(root):
            continue
        stack = [(root, iter(sorted(leading[root])))]
        state[root] = 1
        while stack:
            name, following = stack[-1]
            step = next(following, None)
            if step is None:
                state[name] = 2
                stack.pop()
            elif state.get(step) == 1:
                raise Refused(f"is left-recursive ({name} starts with {step})")
            elif not state.get(step):
                state[step] = 1
                stack.append((step, iter(sorted(leading[step]))))


def _nullable(definitions: Mapping[str, Expr]) -> set[str]:
    """The definitions that can match the empty string (a fixed point)."""
    empty: set[str] = set()
    changed = True
    while changed:
        changed = False
        for name, expr in definitions.items():
            if name not in empty and _can_be_empty(expr, empty):
                empty.add(name)
                changed = True
    return empty


def _can_be_empty(expr: Expr, empty: set[str]) -> bool:
    if isinstance(expr, Text):
        return not expr.value
    if isinstance(expr, Chars):
        return False
    if isinstance(expr, Ref):
        return expr.name in empty
    if isinstance(expr, Seq):
        return all(_can_be_empty(item, empty) for item in expr.items)
    if isinstance(expr, Alt):
        return any(_can_be_empty(option, empty) for option in expr.options)
    return expr.low == 0 or _can_be_empty(expr.item, empty)


def _check_repeats(name: str, expr: Expr, empty: set[str]) -> None:
    stack = [expr]
    while stack:
        item = stack.pop()
        if isinstance(item, Repeat):
            if (item.high is None or item.high > 1) and _can_be_empty(item.item, empty):
                raise Refused(f"repeats what can be empty in {name}")
            if isinstance(item.item, Chars) and not item.item.ranges:
                raise Refused(f"has a class that matches nothing in {name}")
            stack.append(item.item)
        elif isinstance(item, Seq):
            stack.extend(item.items)
        elif isinstance(item, Alt):
            stack.extend(item.options)


def _leading(expr: Expr, empty: set[str]) -> list[str]:
    """The definitions *expr* can start with."""
    if isinstance(expr, Ref):
        return [expr.name]
    if isinstance(expr, Seq):
        out: list[str] = []
        for item in expr.items:
            out.extend(_leading(item, empty))
            if not _can_be_empty(item, empty):
                break
        return out
    if isinstance(expr, Alt):
        return [name for option in expr.options for name in _leading(option, empty)]
    if isinstance(expr, Repeat):
        return _leading(expr.item, empty) if expr.high != 0 else []
    return []


# ---- GBNF ------------------------------------------------------------------------------------------


class _Writer:
    """Writes the definitions reachable from ``start`` as GBNF rules under one name."""

    def __init__(self, rule: str, definitions: Mapping[str, Expr], *, json_string: bool) -> None:
        self._rule = rule
        self._definitions = definitions
        self._json = json_string
        self._names = {
            name: f"{rule}-{index}-{_NAME_CHARS.sub('-', name.lower()).strip('-') or 'x'}"
            for index, name in enumerate(_reachable(definitions))
        }
        self._classes: dict[Chars, str] = {}  # each distinct set of characters gets one rule

    def rules(self) -> str:
        end = f" {self._names[IGNORED]}*" if IGNORED in self._names else ""
        lines = [f"{self._rule} ::= {self._names[START]}{end}"]
        for name, gbnf in self._names.items():
            lines.append(f"{gbnf} ::= {self._expr(self._definitions[name])}")
        lines.extend(
            f"{gbnf} ::= {self._class_body(characters)}" for characters, gbnf in self._classes.items()
        )
        return "\n".join(lines) + "\n"

    def _expr(self, expr: Expr) -> str:
        if isinstance(expr, Text):
            return _literal(json.dumps(expr.value, ensure_ascii=False)[1:-1] if self._json else expr.value)
        if isinstance(expr, Chars):
            return self._chars(expr)
        if isinstance(expr, Ref):
            return self._names[expr.name]
        if isinstance(expr, Seq):
            return "( " + " ".join(self._expr(item) for item in expr.items) + " )" if expr.items else '""'
        if isinstance(expr, Alt):
            return "( " + " | ".join(self._expr(option) for option in expr.options) + " )"
        return _repeated(self._expr(expr.item), expr.low, expr.high)

    def _chars(self, characters: Chars) -> str:
        if not self._json or subtract(characters, _JSON_SPECIAL) == characters:
            return _class(characters)
        if characters not in self._classes:
            self._classes[characters] = f"{self._rule}-c{len(self._classes)}"
        return self._classes[characters]

    def _class_body(self, characters: Chars) -> str:
        """One character of *characters* as a JSON string writes it: plain, or as its escape."""
        options = []
        plain = subtract(characters, _JSON_SPECIAL)
        if plain.ranges:
            options.append(_class(plain))
        for low, high in subtract(characters, plain).ranges:
            options.extend(_literal(json.dumps(chr(code))[1:-1]) for code in range(low, high + 1))
        return " | ".join(options)


def _repeated(item: str, low: int, high: int | None) -> str:
    suffix = {(0, None): "*", (1, None): "+", (0, 1): "?"}.get((low, high))
    if suffix is None:
        suffix = f"{{{low},}}" if high is None else f"{{{low}}}" if low == high else f"{{{low},{high}}}"
    return item + suffix


def _reachable(definitions: Mapping[str, Expr]) -> list[str]:
    """``start``, the ignored text, and what they use, in order of first use."""
    order = [START, *([IGNORED] if IGNORED in definitions else [])]
    seen = set(order)
    index = 0
    while index < len(order):
        for used in references(definitions[order[index]]):
            if used not in seen:
                seen.add(used)
                order.append(used)
        index += 1
    return order


def _char(code: int) -> str:
    if chr(code).isascii() and chr(code).isalnum():
        return chr(code)
    if code < 0x100:
        return f"\\x{code:02X}"
    if code < 0x10000:
        return f"\\u{code:04X}"
    return f"\\U{code:08X}"


def _class(characters: Chars) -> str:
    if not characters.ranges:
        raise Refused("has a class that matches nothing")
    body = "".join(_char(lo) if lo == hi else f"{_char(lo)}-{_char(hi)}" for lo, hi in characters.ranges)
    return f"[{body}]"


def _literal(text: str) -> str:
    return '"' + "".join(_char(ord(c)) if not c.isprintable() or c in '"\\' else c for c in text) + '"'
