r"""Regular expressions (Python's ``re`` syntax, which Lark terminals use) as :mod:`._language` expressions.

What a grammar can state: literal characters, ``.``, classes ``[…]``/``[^…]``
with ranges and the class escapes, groups ``(…)``, ``(?:…)``, ``(?P<name>…)``,
``|``, and the quantifiers ``* + ? {m} {m,} {m,n}`` (lazy or possessive: a
whole-string match admits the same strings).  Refused, with the reason:
anchors and ``\b``, look-arounds, back-references, inline flags, conditionals.

``\s``/``\S`` are Python's whitespace exactly; ``\d`` and ``\w`` are the ASCII
digits and word characters plus every non-ASCII character, and ``\D``/``\W``
everything but the ASCII ones, so a constraint never forbids what the
expression allows (it may allow a little more).  One linear pass; groups nest
at most :data:`MAX_GROUP_DEPTH` deep, and a bound is at most :data:`MAX_BOUND`.
"""

from __future__ import annotations

import attrs

from ._language import (
    ANY,
    MAX_GROUP_DEPTH,
    Alt,
    Chars,
    Expr,
    Refused,
    Repeat,
    Seq,
    Text,
    chars,
    complement,
    either_case,
    union,
)

__all__ = ["MAX_BOUND", "parse_regex"]

MAX_BOUND = 100
"""The largest ``{m,n}`` bound: llama.cpp's grammar writes a repetition out as that many rules."""

_SPACE = chars(
    [(0x09, 0x0D), (0x1C, 0x20), (0x85, 0x85), (0xA0, 0xA0), (0x1680, 0x1680), (0x2000, 0x200A),
     (0x2028, 0x2029), (0x202F, 0x202F), (0x205F, 0x205F), (0x3000, 0x3000)]
)  # fmt: skip
"""What ``str.isspace`` (and so Python's ``\\s``) holds."""
_NON_ASCII = chars([(0x80, 0x10FFFF)])
_ASCII_DIGIT = chars([(0x30, 0x39)])
_ASCII_WORD = chars([(0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)])
_CLASS_ESCAPES = {
    "d": union(_ASCII_DIGIT, _NON_ASCII),
    "D": complement(_ASCII_DIGIT),
    "w": union(_ASCII_WORD, _NON_ASCII),
    "W": complement(_ASCII_WORD),
    "s": _SPACE,
    "S": complement(_SPACE),
}
_CHARACTER_ESCAPES = {"n": "\n", "r": "\r", "t": "\t", "f": "\f", "v": "\v", "a": "\a", "0": "\0"}
_HEX_LENGTHS = {"x": 2, "u": 4, "U": 8}
_NEWLINE = chars([(0x0A, 0x0A)])


@attrs.define
class _Reader:
    text: str
    dotall: bool
    ignore_case: bool
    pos: int = 0
    depth: int = 0

    def refuse(self, reason: str) -> Refused:
        return Refused(f"{reason} (at offset {self.pos} of the regular expression {self.text[:80]!r})")

    def peek(self) -> str | None:
        return self.text[self.pos] if self.pos < len(self.text) else None

    def take(self) -> str:
        if self.pos >= len(self.text):
            raise self.refuse("ends too early")
        char = self.text[self.pos]
        self.pos += 1
        return char


def parse_regex(pattern: str, *, dotall: bool = False, ignore_case: bool = False) -> Expr:
    """*pattern* as an expression matching the strings it matches whole.

    Raises:
        Refused: what it uses that a grammar cannot state, or a syntax error.

    """
    reader = _Reader(pattern, dotall=dotall, ignore_case=ignore_case)
    expr = _alternatives(reader)
    if reader.pos != len(pattern):
        raise reader.refuse("has an unopened )")
    return expr


def _alternatives(reader: _Reader) -> Expr:
    options = [_sequence(reader)]
    while reader.peek() == "|":
        reader.pos += 1
        options.append(_sequence(reader))
    return options[0] if len(options) == 1 else Alt(tuple(options))


def _sequence(reader: _Reader) -> Expr:
    items: list[Expr] = []
    while (char := reader.peek()) is not None and char not in "|)":
        atom = _atom(reader)
        items.append(_quantified(reader, atom))
    if len(items) == 1:
        return items[0]
    return Seq(tuple(_joined_text(items)))


def _joined_text(items: list[Expr]) -> list[Expr]:
    """Neighbouring single characters as one text."""
    out: list[Expr] = []
    for item in items:
        if isinstance(item, Text) and out and isinstance(out[-1], Text):
            out[-1] = Text(out[-1].value + item.value)
        else:
            out.append(item)
    return out


def _atom(reader: _Reader) -> Expr:
    start = reader.pos
    char = reader.take()
    if char == "(":
        return _group(reader)
    if char == "[":
        return _class(reader)
    if char == ".":
        return ANY if reader.dotall else complement(_NEWLINE)
    if char in "^$":
        raise reader.refuse(f"uses the anchor {char}")
    if char in "*+?{":
        if char == "{" and not _is_bound(reader.text, start):
            return _literal(reader, "{")
        reader.pos = start
        raise reader.refuse(f"has a quantifier {char} with nothing before it")
    if char == "\\":
        return _escape(reader, in_class=False)
    return _literal(reader, char)


def _literal(reader: _Reader, char: str) -> Expr:
    if reader.ignore_case and char.isascii() and char.isalpha():
        return either_case(chars([(ord(char), ord(char))]))
    return Text(char)


def _group(reader: _Reader) -> Expr:
    if reader.peek() == "?":
        reader.pos += 1
        kind = reader.take()
        if kind == "P" and reader.peek() == "<":
            end = reader.text.find(">", reader.pos)
            if end < 0:
                raise reader.refuse("has an unclosed group name")
            reader.pos = end + 1
        elif kind != ":":
            raise reader.refuse(f"uses (?{kind}: look-arounds, flags and back-references are not grammar")
    reader.depth += 1
    if reader.depth > MAX_GROUP_DEPTH:
        raise reader.refuse(f"nests groups more than {MAX_GROUP_DEPTH} deep")
    expr = _alternatives(reader)
    reader.depth -= 1
    if reader.peek() != ")":
        raise reader.refuse("has an unclosed (")
    reader.pos += 1
    return expr


def _class(reader: _Reader) -> Chars:
    negated = reader.peek() == "^"
    if negated:
        reader.pos += 1
    members: list[Chars] = []
    first = True
    while True:
        char = reader.take()
        if char == "]" and not first:
            break
        first = False
        low = _class_member(reader, char)
        if isinstance(low, Chars):
            members.append(low)
            continue
        if reader.peek() == "-" and reader.pos + 1 < len(reader.text) and reader.text[reader.pos + 1] != "]":
            reader.pos += 1
            high = _class_member(reader, reader.take())
            if isinstance(high, Chars) or ord(high) < ord(low):
                raise reader.refuse("has a range out of order")
            members.append(chars([(ord(low), ord(high))]))
        else:
            members.append(chars([(ord(low), ord(low))]))
    result = union(*members) if members else Chars(())
    if reader.ignore_case:
        result = either_case(result)
    return complement(result) if negated else result


def _class_member(reader: _Reader, char: str) -> str | Chars:
    r"""One character of a class, or a class escape (``\d``)."""
    if char == "[" and reader.peek() in (":", "=", "."):
        raise reader.refuse("uses a POSIX class")
    if char != "\\":
        return char
    escaped = _escape(reader, in_class=True)
    return escaped.value if isinstance(escaped, Text) else escaped


def _escape(reader: _Reader, *, in_class: bool) -> Text | Chars:
    char = reader.take()
    if char in _CLASS_ESCAPES:
        return _CLASS_ESCAPES[char]
    if char == "b" and in_class:
        return Text("\b")
    if char in _CHARACTER_ESCAPES:
        return Text(_CHARACTER_ESCAPES[char])
    if char in _HEX_LENGTHS:
        length = _HEX_LENGTHS[char]
        digits = reader.text[reader.pos : reader.pos + length]
        if len(digits) != length or any(d not in "0123456789abcdefABCDEF" for d in digits):
            raise reader.refuse(f"has a \\{char} escape without {length} hex digits")
        reader.pos += length
        code = int(digits, 16)
        if code > 0x10FFFF:
            raise reader.refuse("names a character beyond U+10FFFF")
        return Text(chr(code))
    if char.isalnum():
        raise reader.refuse(f"uses \\{char} (anchors and back-references are not grammar)")
    return Text(char)


def _is_bound(text: str, start: int) -> bool:
    """Whether ``{`` at *start* opens a ``{m}``/``{m,}``/``{m,n}``/``{,n}`` bound (else it is literal)."""
    pos = start + 1
    digits = 0
    while pos < len(text) and text[pos] in "0123456789":
        pos += 1
        digits += 1
    if pos < len(text) and text[pos] == ",":
        pos += 1
        while pos < len(text) and text[pos] in "0123456789":
            pos += 1
            digits += 1
    return digits > 0 and pos < len(text) and text[pos] == "}"


def _quantified(reader: _Reader, atom: Expr) -> Expr:
    char = reader.peek()
    if char is None or char not in "*+?{":
        return atom
    if char == "{" and not _is_bound(reader.text, reader.pos):
        return atom
    reader.pos += 1
    if char == "*":
        low, high = 0, None
    elif char == "+":
        low, high = 1, None
    elif char == "?":
        low, high = 0, 1
    else:
        end = reader.text.index("}", reader.pos)
        first, comma, second = reader.text[reader.pos : end].partition(",")
        reader.pos = end + 1
        low = _bound(reader, first) if first else 0
        high = (_bound(reader, second) if second else None) if comma else low
        if high is not None and high < low:
            raise reader.refuse("has a bound {m,n} with n below m")
        if low > MAX_BOUND or (high or 0) > MAX_BOUND:
            raise reader.refuse(f"has a bound above {MAX_BOUND}")
    if reader.peek() in ("?", "+"):
        reader.pos += 1  # lazy or possessive: the same strings match the whole input
    if ((after := reader.peek()) is not None and after in "*+?") or _bound_follows(reader):
        raise reader.refuse("has two quantifiers in a row")
    return Repeat(atom, low, high)


def _bound(reader: _Reader, digits: str) -> int:
    """A bound's number, refused unread when it has more digits than :data:`MAX_BOUND`.

    ``int`` of thousands of digits takes quadratic time, and raises over 4,300 (a 500, not a refusal).
    """
    if len(digits.lstrip("0")) > len(str(MAX_BOUND)):
        raise reader.refuse(f"has a bound above {MAX_BOUND}")
    return int(digits)


def _bound_follows(reader: _Reader) -> bool:
    return reader.peek() == "{" and _is_bound(reader.text, reader.pos)
