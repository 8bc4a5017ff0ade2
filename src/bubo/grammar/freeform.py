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

import attrs

from bubo.domain.messages import InputGrammar, ToolSpec

from ._language import Alt, Chars, Expr, Ref, Refused, Repeat, Seq, Text, chars, references, subtract
from ._lark import IGNORED, START, parse_lark
from ._regex import parse_regex

__all__ = [
    "MAX_DEFINITIONS",
    "MAX_DEFINITION_CHARS",
    "MAX_REPEAT_WEIGHT",
    "MAX_RULES_CHARS",
    "input_rules",
    "json_arguments",
]

logger = logging.getLogger(__name__)

MAX_DEFINITION_CHARS = 16 * 1024
"""The longest grammar read (Codex's are under 2,000 characters)."""
MAX_DEFINITIONS = 1_000
"""Rules and terminals, the imported ones included (as :data:`bubo.grammar.MAX_REQUEST_RULES`)."""
MAX_REPEAT_WEIGHT = 100
"""The largest product of nested bounds (``(a{1,10}){1,10}`` is 100), through rule references too:
llama.cpp's sampler keeps a stack for each way to split the text (SmolLM2, 1 thread, 6 tokens:
weight 100 took 0.37 s, 1,000 took 2.0 s, 10,000 took 8.0 s)."""
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
    """Refuse what llama.cpp cannot follow, or follows too slowly.

    Left recursion (llama.cpp's parser rejects it), repeating what can be empty
    (the sampler never ends), too many definitions, and nested bounded
    repetitions whose bounds multiply past :data:`MAX_REPEAT_WEIGHT` (the
    sampler tracks each way to split the text).  Linear in the grammar's size.
    """
    if len(definitions) > MAX_DEFINITIONS:
        raise Refused(f"has {len(definitions)} rules and terminals; at most {MAX_DEFINITIONS} are enforced")
    empty = _matching_empty(definitions)
    for name, expr in definitions.items():
        _check_repeats(name, expr, empty)
    _check_weights(definitions)
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


def _matching_empty(definitions: Mapping[str, Expr]) -> frozenset[int]:
    """The ids of the expressions (in *definitions*) that can match the empty string.

    One pass over every expression, then a worklist: a choice (or a reference,
    or a repetition) matches "" once one part does, a sequence once all do.
    """
    graph = _EmptyGraph()
    for name, expr in definitions.items():
        graph.roots.setdefault(id(expr), []).append(name)
    seen: set[int] = set()
    stack: list[Expr] = list(definitions.values())
    while stack:
        expr = stack.pop()
        if id(expr) not in seen:
            seen.add(id(expr))
            stack.extend(graph.add(expr))
    return graph.propagate()


@attrs.define
class _EmptyGraph:
    """The expressions as a graph of what matches "" when its parts do."""

    parents: dict[int, list[int]] = attrs.Factory(dict)  # id -> its parents' ids, once per occurrence
    missing: dict[int, int] = attrs.Factory(dict)  # a sequence's id -> its items not known to match ""
    refs: dict[str, list[int]] = attrs.Factory(dict)  # a definition's name -> the references to it
    roots: dict[int, list[str]] = attrs.Factory(dict)  # a definition's expression's id -> its names
    empty: set[int] = attrs.Factory(set)
    queue: list[int] = attrs.Factory(list)

    def found(self, node: int) -> None:
        if node not in self.empty:
            self.empty.add(node)
            self.queue.append(node)

    def add(self, expr: Expr) -> tuple[Expr, ...]:
        """Enter *expr*; its parts, to enter next."""
        parts: tuple[Expr, ...] = ()
        if isinstance(expr, Text) and not expr.value:
            self.found(id(expr))
        elif isinstance(expr, Ref):
            self.refs.setdefault(expr.name, []).append(id(expr))
        elif isinstance(expr, Seq):
            parts = expr.items
            self.missing[id(expr)] = len(parts)
            if not parts:
                self.found(id(expr))
        elif isinstance(expr, Alt):
            parts = expr.options
        elif isinstance(expr, Repeat):
            parts = (expr.item,)
            if expr.low == 0:
                self.found(id(expr))
        for part in parts:
            self.parents.setdefault(id(part), []).append(id(expr))
        return parts

    def propagate(self) -> frozenset[int]:
        while self.queue:
            node = self.queue.pop()
            for name in self.roots.get(node, ()):
                for ref in self.refs.get(name, ()):
                    self.found(ref)
            for parent in self.parents.get(node, ()):
                if parent in self.missing:
                    self.missing[parent] -= 1
                    if self.missing[parent] == 0:
                        self.found(parent)
                else:
                    self.found(parent)
        return frozenset(self.empty)


def _check_repeats(name: str, expr: Expr, empty: frozenset[int]) -> None:
    stack = [expr]
    while stack:
        item = stack.pop()
        if isinstance(item, Repeat):
            if (item.high is None or item.high > 1) and id(item.item) in empty:
                raise Refused(f"repeats what can be empty in {name}")
            if isinstance(item.item, Chars) and not item.item.ranges:
                raise Refused(f"has a class that matches nothing in {name}")
            stack.append(item.item)
        elif isinstance(item, Seq):
            stack.extend(item.items)
        elif isinstance(item, Alt):
            stack.extend(item.options)


def _check_weights(definitions: Mapping[str, Expr]) -> None:
    """Refuse bounded repetitions inside each other (through references too) whose bounds multiply too far.

    A definition's weight is the largest product of the bounds around any of its
    parts, a reference counting the weight of what it names (a reference back
    into a definition being weighed counts 1: recursion goes through text).
    """
    inside = {name: _weights_inside(name, expr) for name, expr in definitions.items()}
    weights: dict[str, int] = {}
    for root in definitions:
        if root in weights:
            continue
        path = {root}
        stack = [(root, iter(inside[root][1]))]
        while stack:
            name, following = stack[-1]
            step = next(following, None)
            if step is None:
                stack.pop()
                path.discard(name)
                own, uses = inside[name]
                weights[name] = max([own, *(weight * weights.get(used, 1) for weight, used in uses)])
                if weights[name] > MAX_REPEAT_WEIGHT:
                    raise Refused(f"repeats {weights[name]} times in {name}, counting the rules it uses")
            elif step[1] not in path and step[1] not in weights:
                path.add(step[1])
                stack.append((step[1], iter(inside[step[1]][1])))


def _weights_inside(name: str, expr: Expr) -> tuple[int, list[tuple[int, str]]]:
    """The largest product of *expr*'s own nested bounds, and each reference with the product around it."""
    own = 1
    uses: list[tuple[int, str]] = []
    stack: list[tuple[Expr, int]] = [(expr, 1)]
    while stack:
        item, weight = stack.pop()
        if isinstance(item, Repeat):
            weight *= item.high if item.high is not None and item.high > 1 else 1
            if weight > MAX_REPEAT_WEIGHT:
                raise Refused(f"repeats {weight} times in {name}, counting the repetitions around it")
            own = max(own, weight)
            stack.append((item.item, weight))
        elif isinstance(item, Seq):
            stack.extend((part, weight) for part in item.items)
        elif isinstance(item, Alt):
            stack.extend((part, weight) for part in item.options)
        elif isinstance(item, Ref):
            uses.append((weight, item.name))
    return own, uses


def _leading(expr: Expr, empty: frozenset[int]) -> list[str]:
    """The definitions *expr* can start with."""
    if isinstance(expr, Ref):
        return [expr.name]
    if isinstance(expr, Seq):
        out: list[str] = []
        for item in expr.items:
            out.extend(_leading(item, empty))
            if id(item) not in empty:
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
        self._classes: dict[Chars, str] = {}  # each distinct set with JSON escapes gets one rule
        self._written: dict[Chars, str] = {}  # each distinct set, as it is written

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
        item = self._expr(expr.item)
        return _repeated(f"( {item} )" if isinstance(expr.item, Repeat) else item, expr.low, expr.high)

    def _chars(self, characters: Chars) -> str:
        written = self._written.get(characters)
        if written is None:
            if not self._json or subtract(characters, _JSON_SPECIAL) == characters:
                written = _class(characters)
            else:
                written = self._classes[characters] = f"{self._rule}-c{len(self._classes)}"
            self._written[characters] = written
        return written

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
