r"""Lark grammars (what Codex's freeform tools send) read into :mod:`._language` definitions.

Lark's own notation (https://lark-parser.readthedocs.io/en/stable/grammar.html):
rules (``name: …``, with ``?``/``!`` modifiers and ``.priority``) and terminals
(``NAME: …``), alternatives ``|`` (also on the next line), ``-> alias``,
groups ``( … )``, optional ``[ … ]``, ``? * +``, ``~ n`` and ``~ m..n``,
strings ``"…"`` (``i``: any case), ranges ``"a".."z"``, regular expressions
``/…/flags`` (:mod:`._regex`), ``%import common.NAME`` (``-> ALIAS``,
``common (A, B)``) from Lark's own ``common.lark``, and ``%ignore``: the
terminals it names may come before any token of a rule and at the end.
Templates, ``%declare``, ``%override``, ``%extend`` and imports from other
files are refused, as are names used but never defined.

The grammar's language is what :data:`START` derives, characters as the
terminals spell them (Lark's lexer may refuse some of those strings; a
constraint from this grammar allows them).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping

import attrs

from ._language import (
    MAX_GROUP_DEPTH,
    Alt,
    Expr,
    Ref,
    Refused,
    Repeat,
    Seq,
    Text,
    chars,
    either_case,
    references,
)
from ._regex import MAX_BOUND, parse_regex

__all__ = ["START", "LarkGrammar", "parse_lark"]

START = "start"
IGNORED = "%ignore"
"""The name of the definition that ``%ignore`` makes: one of the ignored terminals."""

_TOKENS = re.compile(
    r"""
    (?P<comment>//[^\n]*)
  | (?P<newline>\r?\n)
  | (?P<space>[ \t\f\r]+)
  | (?P<string>"(?:\\.|[^"\\\n])*"i?)
  | (?P<regexp>/(?!/)(?:\\.|[^/\\\n])+/[imslux]*)
  | (?P<directive>%[a-z]+)
  | (?P<name>_?[A-Za-z][A-Za-z0-9_]*)
  | (?P<number>[0-9]+)
  | (?P<op>\.\.|->|[:|()\[\]?!*+~.,{}])
    """,
    re.VERBOSE,
)
_STRING_ESCAPES = {
    "n": "\n", "t": "\t", "r": "\r", "f": "\f", "v": "\v", "b": "\b", "a": "\a", "0": "\0",
    "\\": "\\", '"': '"', "'": "'",
}  # fmt: skip
_HEX_LENGTHS = {"x": 2, "u": 4, "U": 8}

_COMMON = r"""
DIGIT: "0".."9"
HEXDIGIT: "a".."f" | "A".."F" | DIGIT
INT: DIGIT+
SIGNED_INT: ["+" | "-"] INT
DECIMAL: INT "." INT? | "." INT
_EXP: ("e" | "E") SIGNED_INT
FLOAT: INT _EXP | DECIMAL _EXP?
SIGNED_FLOAT: ["+" | "-"] FLOAT
NUMBER: FLOAT | INT
SIGNED_NUMBER: ["+" | "-"] NUMBER
ESCAPED_STRING: "\"" (/[^"\\]/ | /\\[\s\S]/)* "\""
LCASE_LETTER: "a".."z"
UCASE_LETTER: "A".."Z"
LETTER: UCASE_LETTER | LCASE_LETTER
WORD: LETTER+
CNAME: ("_" | LETTER) ("_" | LETTER | DIGIT)*
WS_INLINE: (" " | /\t/)+
WS: /[ \t\f\r\n]/+
CR: /\r/
LF: /\n/
NEWLINE: (CR? LF)+
SH_COMMENT: /#[^\n]*/
CPP_COMMENT: /\/\/[^\n]*/
C_COMMENT: "/*" /[\s\S]/* "*/"
SQL_COMMENT: /--[^\n]*/
"""
"""Lark's ``common.lark``, written in the notation read here (a comment's end is not enforced)."""


@attrs.frozen
class LarkGrammar:
    """The definitions, by name (rules lower-case, terminals upper-case, :data:`IGNORED`)."""

    definitions: Mapping[str, Expr]
    ignores: bool  # whether %ignore terminals may come before each token


@attrs.frozen
class _Token:
    kind: str
    text: str
    line: int


def parse_lark(text: str) -> LarkGrammar:
    """The definitions of the Lark grammar *text*, with the ``common`` terminals it imports.

    Raises:
        Refused: what it uses that is not read here, a syntax error, or a name never defined.

    """
    statements = list(_statements(_tokens(text)))
    ignores = any(s[0].kind == "directive" and s[0].text == IGNORED for s in statements)
    definitions: dict[str, Expr] = {}
    ignored: list[Expr] = []
    imports: dict[str, str] = {}  # local name -> common name
    for statement in statements:
        _statement(statement, definitions, ignored, imports, ignores=ignores)
    if imports:
        definitions.update(_imported(imports))
    if ignored:
        definitions[IGNORED] = ignored[0] if len(ignored) == 1 else Alt(tuple(ignored))
    for name, expr in definitions.items():
        for used in references(expr):
            if used not in definitions:
                raise Refused(f"uses {used} in {name}, which it never defines")
    if START not in definitions:
        raise Refused(f"has no {START} rule")
    return LarkGrammar(definitions=definitions, ignores=ignores)


_COMMON_SPACE = "common::{}"
"""What an imported terminal's own references are named (no name in a grammar has ``::``)."""


def _imported(imports: Mapping[str, str]) -> dict[str, Expr]:
    """The common terminals imported (local name -> common name), and the ones they use."""
    common = _common()
    out: dict[str, Expr] = {}
    for local, name in imports.items():
        if name not in common:
            raise Refused(f"imports {name}, which Lark's common.lark does not define")
        out[local] = _map_refs(common[name], _COMMON_SPACE.format)
        for needed in _closure(common, name):
            out[_COMMON_SPACE.format(needed)] = _map_refs(common[needed], _COMMON_SPACE.format)
    return out


def _common() -> dict[str, Expr]:
    common: dict[str, Expr] = {}
    for statement in _statements(_tokens(_COMMON)):
        _statement(statement, common, [], {}, ignores=False)
    return common


def _closure(common: Mapping[str, Expr], name: str) -> set[str]:
    seen: set[str] = set()
    todo = list(references(common[name]))
    while todo:
        used = todo.pop()
        if used not in seen:
            seen.add(used)
            todo.extend(references(common[used]))
    return seen


# ---- tokens and statements ---------------------------------------------------------------------------


def _tokens(text: str) -> Iterator[_Token]:
    pos, line = 0, 1
    while pos < len(text):
        match = _TOKENS.match(text, pos)
        if match is None:
            raise Refused(f"has {text[pos : pos + 20]!r} on line {line}, which is not Lark's notation")
        kind = match.lastgroup or ""
        if kind == "newline":
            yield _Token("newline", "\n", line)
            line += 1
        elif kind not in ("space", "comment"):
            yield _Token(kind, match.group(), line)
        pos = match.end()


def _statements(tokens: Iterator[_Token]) -> Iterator[list[_Token]]:
    """Definitions and directives: a newline ends one unless the next line starts with ``|``."""
    current: list[_Token] = []
    pending_newline = False
    for token in tokens:
        if token.kind == "newline":
            pending_newline = True
            continue
        if pending_newline and current and not (token.kind == "op" and token.text == "|"):
            yield current
            current = []
        pending_newline = False
        current.append(token)
    if current:
        yield current


def _statement(
    tokens: list[_Token],
    definitions: dict[str, Expr],
    ignored: list[Expr],
    imports: dict[str, str],
    *,
    ignores: bool,
) -> None:
    head = tokens[0]
    if head.kind == "directive":
        _directive(head, tokens[1:], ignored, imports)
        return
    if head.text in ("?", "!") and len(tokens) > 1:  # rule modifiers: they shape the tree only
        tokens = tokens[1:]
        head = tokens[0]
    if head.kind != "name":
        raise Refused(f"starts line {head.line} with {head.text!r}, not a name or a directive")
    name = head.text
    rest = tokens[1:]
    if rest and rest[0].text == "{":
        raise Refused(f"defines the template {name} (line {head.line}): templates are not read here")
    if rest and rest[0].text == ".":  # a priority: it orders the lexer's choices, not the language
        rest = rest[2:] if len(rest) > 1 and rest[1].kind == "number" else rest[1:]
    if not rest or rest[0].text != ":":
        raise Refused(f"has no ':' after {name} on line {head.line}")
    if name in definitions:
        raise Refused(f"defines {name} twice")
    reader = _Reader(rest[1:], ignores=ignores and not _is_terminal(name))
    expr = reader.expansions()
    reader.end()
    definitions[name] = expr


def _directive(head: _Token, args: list[_Token], ignored: list[Expr], imports: dict[str, str]) -> None:
    if head.text == "%ignore":
        reader = _Reader(args, ignores=False)
        ignored.append(reader.expansions())
        reader.end()
        return
    if head.text != "%import":
        raise Refused(f"uses {head.text} (line {head.line}), which is not read here")
    words = [t.text for t in args]
    if not words or not words[0].startswith("common"):
        raise Refused(f"imports from {''.join(words)} (line {head.line}): only Lark's common terminals are")
    spec = "".join(words)
    if match := re.fullmatch(r"common\.([A-Za-z_][A-Za-z0-9_]*)(?:->([A-Za-z_][A-Za-z0-9_]*))?", spec):
        imports[match.group(2) or match.group(1)] = match.group(1)
        return
    if match := re.fullmatch(r"common\(([A-Za-z0-9_,]+)\)", spec):
        imports.update({name: name for name in match.group(1).split(",") if name})
        return
    raise Refused(f"has an %import on line {head.line} that is not read here")


# ---- expansions ------------------------------------------------------------------------------------


@attrs.define
class _Reader:
    tokens: list[_Token]
    ignores: bool  # a rule's tokens (strings, regular expressions, terminals) may follow ignored text
    pos: int = 0
    depth: int = 0

    def peek(self) -> _Token | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def refuse(self, what: str) -> Refused:
        token = self.peek()
        where = f"at {token.text!r} on line {token.line}" if token is not None else "at the end of a line"
        return Refused(f"has {what} {where}")

    def end(self) -> None:
        if self.peek() is not None:
            raise self.refuse("something unexpected")

    def expansions(self) -> Expr:
        options = [self._alias()]
        while (token := self.peek()) is not None and token.text == "|":
            self.pos += 1
            options.append(self._alias())
        return options[0] if len(options) == 1 else Alt(tuple(options))

    def _alias(self) -> Expr:
        items: list[Expr] = []
        while (token := self.peek()) is not None and token.text not in ("|", ")", "]", "->"):
            items.append(self._expr())
        if (token := self.peek()) is not None and token.text == "->":
            self.pos += 2  # the alias names the tree node only
        return items[0] if len(items) == 1 else Seq(tuple(items))

    def _expr(self) -> Expr:
        atom = self._atom()
        token = self.peek()
        if token is None or token.text not in ("?", "*", "+", "~"):
            return atom
        self.pos += 1
        if token.text == "~":
            least = self._number()
            most = least
            if (dots := self.peek()) is not None and dots.text == "..":
                self.pos += 1
                most = self._number()
            if most < least or most > MAX_BOUND:
                raise self.refuse(f"a repetition ~ {least}..{most} out of order or above {MAX_BOUND}")
            return Repeat(atom, least, most)
        low, high = {"?": (0, 1), "*": (0, None), "+": (1, None)}[token.text]
        return Repeat(atom, low, high)

    def _number(self) -> int:
        token = self.peek()
        if token is None or token.kind != "number" or len(token.text) > len(str(MAX_BOUND)) + 1:
            raise self.refuse("no count (or too large a one) after ~")
        self.pos += 1
        return int(token.text)

    def _atom(self) -> Expr:
        token = self.peek()
        if token is None:
            raise self.refuse("an expression missing")
        self.pos += 1
        if token.text in ("(", "["):
            self.depth += 1
            if self.depth > MAX_GROUP_DEPTH:
                raise self.refuse(f"groups nested more than {MAX_GROUP_DEPTH} deep")
            inner = self.expansions()
            close = ")" if token.text == "(" else "]"
            if (end := self.peek()) is None or end.text != close:
                raise self.refuse(f"an unclosed {token.text}")
            self.pos += 1
            self.depth -= 1
            return inner if close == ")" else Repeat(inner, 0, 1)
        if token.kind == "string":
            return self._token(self._string(token))
        if token.kind == "regexp":
            return self._token(_regexp(token))
        if token.kind == "name":
            return self._token(Ref(token.text)) if _is_terminal(token.text) else Ref(token.text)
        raise Refused(f"has {token.text!r} where an expression should be, on line {token.line}")

    def _string(self, token: _Token) -> Expr:
        value, fold = _unquoted(token)
        if (dots := self.peek()) is not None and dots.text == "..":
            self.pos += 1
            end = self.peek()
            if end is None or end.kind != "string":
                raise self.refuse("a range without its end")
            self.pos += 1
            high, _ = _unquoted(end)
            if len(value) != 1 or len(high) != 1 or ord(high) < ord(value):
                raise Refused(
                    f"has a range {token.text}..{end.text} that is not one character to a later one"
                )
            return chars([(ord(value), ord(high))])
        if not fold:
            return Text(value)
        letters = {
            c: either_case(chars([(ord(c), ord(c))])) for c in set(value) if c.isascii() and c.isalpha()
        }
        return Seq(tuple(letters.get(c) or Text(c) for c in value))

    def _token(self, expr: Expr) -> Expr:
        """A token of a rule, after any ignored text when the grammar has %ignore."""
        return Seq((Repeat(Ref(IGNORED), 0, None), expr)) if self.ignores else expr


def _is_terminal(name: str) -> bool:
    bare = name.lstrip("_")
    return bool(bare) and bare[0].isupper()


def _unquoted(token: _Token) -> tuple[str, bool]:
    """A string literal's characters (Python's escapes), and whether it matches any case."""
    fold = token.text.endswith("i")
    body = token.text[1 : -2 if fold else -1]
    out: list[str] = []
    pos = 0
    while pos < len(body):
        char = body[pos]
        pos += 1
        if char != "\\":
            out.append(char)
            continue
        code = body[pos]
        pos += 1
        if code in _HEX_LENGTHS:
            digits = body[pos : pos + _HEX_LENGTHS[code]]
            if len(digits) != _HEX_LENGTHS[code] or any(d not in "0123456789abcdefABCDEF" for d in digits):
                raise Refused(f"has a bad \\{code} escape in {token.text} on line {token.line}")
            pos += len(digits)
            if int(digits, 16) > 0x10FFFF:
                raise Refused(f"names a character beyond U+10FFFF on line {token.line}")
            out.append(chr(int(digits, 16)))
        else:
            out.append(_STRING_ESCAPES.get(code, "\\" + code))
    return "".join(out), fold


def _regexp(token: _Token) -> Expr:
    end = token.text.rindex("/")
    flags = set(token.text[end + 1 :])
    if "x" in flags:
        raise Refused(f"uses the x flag on line {token.line}, which is not read here")
    body = token.text[1:end].replace("\\/", "/")
    return parse_regex(body, dotall="s" in flags, ignore_case="i" in flags)


# ---- references ------------------------------------------------------------------------------------


def _map_refs(expr: Expr, rename: Callable[[str], str]) -> Expr:
    if isinstance(expr, Ref):
        return Ref(rename(expr.name))
    if isinstance(expr, Seq):
        return Seq(tuple(_map_refs(item, rename) for item in expr.items))
    if isinstance(expr, Alt):
        return Alt(tuple(_map_refs(option, rename) for option in expr.options))
    if isinstance(expr, Repeat):
        return Repeat(_map_refs(expr.item, rename), expr.low, expr.high)
    return expr
