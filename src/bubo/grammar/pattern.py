r"""The regular expressions a schema ``pattern`` may use: what llama.cpp's converter translates faithfully.

llama-cpp-python's port of llama.cpp's JSON-schema-to-grammar conversion
(``SchemaConverter._visit_pattern``) copies a pattern into GBNF almost token
for token and checks little: an unclosed ``(`` is silently closed (``^(($``
becomes a grammar for the empty string), a lone ``]`` or ``}`` sends it into
an endless loop, a quantifier with nothing before it raises ``IndexError``,
``^``/``$`` inside the pattern become literal characters, and most escapes
(``\d``, ``\.``, ``\w``) reach llama.cpp's GBNF parser, which knows only its
own.  So a pattern is read here first, in one linear pass, and anything
outside this subset is refused with the reason:

- anchored: ``^`` first and ``$`` last, and nowhere else;
- literal characters, ``.``, groups ``( … )`` (no ``(?``) nested at most
  :data:`MAX_GROUP_DEPTH` deep, ``|`` inside a group (at the top level the
  converter would split the JSON string's own rule, quotes and all);
- classes ``[…]`` / ``[^…]`` of characters and ranges (low to high), with the
  escapes GBNF knows: ``\\ \" \- \[ \] \n \r \t \xHH \uHHHH``;
- quantifiers ``*``, ``+``, ``?``, ``{n}``, ``{m,}``, ``{m,n}`` (m ≤ n), each
  optionally lazy (``*?``: an anchored pattern matches the same strings);
- escapes outside classes: the metacharacters ``\( \) \[ \] \{ \} \| \* \+ \?``
  and ``\\ \" \- \n \r \t``.  A quantifier right after an escape that ends a
  run of literal text is refused: the converter would repeat the whole run.

Repetition is expanded, not looped: ``x{0,n}`` becomes *n* nested optional
groups, so a bound (multiplied by the bounds of the groups around it) is at
most *max_repeat*, the schema limit on repetitions.  Repeating what can match
the empty string (``(a?)+``, ``(a*){0,100}``) is refused: llama.cpp's sampler
tracks every way to split the text, and ``^(a?){0,100}$`` took 13.7 s a token.
"""

from __future__ import annotations

import attrs

from ._language import MAX_GROUP_DEPTH
from ._language import Refused as PatternRefused

__all__ = ["MAX_GROUP_DEPTH", "PatternRefused", "check_pattern"]

LLAMA_GROUP_RULES = 2000
"""llama.cpp's ``MAX_REPETITION_THRESHOLD``: the rules a repeated group may hold (times its bound)."""

_METACHARACTERS = frozenset("()[]{}|*+?")  # escaped, the converter writes them as literals
_SAME_IN_GBNF = frozenset('\\"-nrt')  # escapes GBNF's string syntax reads as the regex does
_CLASS_ESCAPES = {"\\": "\\", '"': '"', "-": "-", "[": "[", "]": "]", "n": "\n", "r": "\r", "t": "\t"}
_HEX_DIGITS = {"x": 2, "u": 4}  # \xHH, \uHHHH: GBNF reads them inside classes
_HINTS = {
    "d": "[0-9]",
    "w": "[A-Za-z0-9_]",
    "s": "[ \\t\\n\\r]",
    ".": "[.]",
    "x": "the character itself",
    "u": "the character itself",
}
_QUANTIFIERS = frozenset("*+?{")
_ENDS_A_RUN = frozenset("*+?{}()[]|")  # a literal character before one of these starts its own run


@attrs.define
class _Group:
    """An open group: its largest repetition weight, the GBNF rules inside it, whether it can match ""."""

    weight: int = 1
    rules: int = 0  # the rules llama.cpp's parser will generate for what is inside
    empty_branch: bool = False  # an alternative already closed by | can match ""
    empty_so_far: bool = True  # the current alternative, so far, can match ""


@attrs.define
class _Scan:
    """One pass over a pattern's body (between ``^`` and ``$``)."""

    text: str
    max_repeat: int
    pos: int = 0
    groups: list[_Group] = attrs.Factory(list)
    weight: int = 0  # the repetition weight of the atom just read (0: none, nothing to repeat)
    rules: int = 0  # the GBNF rules the atom just read (with its quantifier) makes llama.cpp generate
    empty: bool = False  # the atom just read (with its quantifier) can match the empty string
    quantified: bool = False  # the atom just read has its quantifier already
    run: int = 0  # characters in the converter's current run of literal text
    escape_ends_run: bool = False  # the atom just read is an escape (or a quote) after other literal text

    def refuse(self, reason: str) -> PatternRefused:
        return PatternRefused(f"{reason} (at offset {self.pos + 1})")


def check_pattern(pattern: str, *, max_repeat: int) -> None:
    """Check *pattern* is in the subset the grammar conversion translates faithfully.

    Raises:
        PatternRefused: why not, with the offset in the pattern.

    """
    if len(pattern) < 2 or not pattern.startswith("^") or not pattern.endswith("$"):
        raise PatternRefused(
            "must start with ^ and end with $ (constrained decoding matches the whole string)"
        )
    scan = _Scan(pattern[1:-1], max_repeat)
    while scan.pos < len(scan.text):
        char = scan.text[scan.pos]
        if char in _QUANTIFIERS:
            _quantifier(scan, char)
        else:
            _settle(scan)
            _atom(scan, char)
    if scan.groups:
        raise scan.refuse("has an unclosed (")


def _settle(scan: _Scan) -> None:
    """Count the atom just read in the group around it: its weight, whether it can match ""."""
    if scan.groups and scan.weight:
        group = scan.groups[-1]
        group.weight = max(group.weight, scan.weight)
        group.rules += scan.rules
        group.empty_so_far = group.empty_so_far and scan.empty


def _atom(scan: _Scan, char: str) -> None:
    """Read one atom, or ``|``, ``(``, ``)``, at ``scan.pos``."""
    scan.quantified = False
    scan.escape_ends_run = False
    scan.weight = 1
    scan.rules = 0
    scan.empty = False
    if char in '\\"':  # the converter appends an escape or a quote to the run whatever follows
        scan.escape_ends_run = scan.run > 0
        if char == "\\":
            _escape(scan)
        else:
            scan.pos += 1
        scan.run += 1
        return
    if char not in "()[]{}|^$.":
        following = scan.text[scan.pos + 1 : scan.pos + 2]
        scan.run = 1 if scan.run == 0 or (following and following in _ENDS_A_RUN) else scan.run + 1
        scan.pos += 1
        return
    scan.run = 0
    if char == "[":
        _char_class(scan)
    elif char in "]}":
        raise scan.refuse(f"has a lone {char} (escape it as \\{char})")
    elif char in "^$":
        raise scan.refuse(f"has {char} inside it; ^ and $ are supported only at the very start and end")
    else:
        _structure(scan, char)
        scan.pos += 1


def _structure(scan: _Scan, char: str) -> None:
    """``(``, ``)``, ``|`` or ``.``: open or close a group, start an alternative, or any character."""
    if char == "(":
        if scan.text.startswith("?", scan.pos + 1):
            raise scan.refuse(
                "uses a (?…) group (lookaround, non-capturing or named); only ( … ) is supported"
            )
        if len(scan.groups) >= MAX_GROUP_DEPTH:
            raise scan.refuse(f"nests groups more than {MAX_GROUP_DEPTH} deep")
        scan.groups.append(_Group())
        scan.weight = 0
        scan.rules = 0
    elif char == ")":
        if not scan.groups:
            raise scan.refuse("has a ) with no ( before it")
        group = scan.groups.pop()
        scan.weight = group.weight
        scan.rules = 1 + group.rules  # the group is a rule of its own
        scan.empty = group.empty_branch or group.empty_so_far
    elif char == "|":
        if not scan.groups:  # the converter would split the whole JSON string rule, quotes and all
            raise scan.refuse("has | outside a group; write the alternatives in one, e.g. ^(a|b)$")
        group = scan.groups[-1]
        group.empty_branch = group.empty_branch or group.empty_so_far
        group.empty_so_far = True
        scan.weight = 0
        scan.rules = 0


def _escape(scan: _Scan) -> None:
    if scan.pos + 1 >= len(scan.text):
        raise scan.refuse("ends with a lone \\ (the $ after it is escaped)")
    char = scan.text[scan.pos + 1]
    if char not in _METACHARACTERS and char not in _SAME_IN_GBNF:
        hint = _HINTS.get(char)
        suffix = f"; write {hint} instead" if hint else ""
        raise scan.refuse(f"uses the escape \\{char}, which the grammar conversion does not support{suffix}")
    scan.pos += 2


def _char_class(scan: _Scan) -> None:
    """Read ``[…]`` from its ``[`` past its ``]``, as GBNF will: ranges must run from low to high."""
    text = scan.text
    start = scan.pos
    scan.pos += 2 if text.startswith("^", start + 1) else 1
    count = 0
    while scan.pos < len(text) and text[scan.pos] != "]":
        low = _class_char(scan)
        count += 1
        if text.startswith("-", scan.pos) and scan.pos + 1 < len(text) and text[scan.pos + 1] != "]":
            scan.pos += 1
            high = _class_char(scan)
            if ord(high) < ord(low):
                raise scan.refuse(f"has the range {low}-{high}, which runs backwards")
    if scan.pos >= len(text):
        scan.pos = start
        raise scan.refuse("has a [ with no ] after it")
    if count == 0:
        raise scan.refuse("has an empty character class")
    scan.pos += 1


def _class_char(scan: _Scan) -> str:
    """One character of a class (an escape read whole), advancing past it."""
    text = scan.text
    char = text[scan.pos]
    if char != "\\":
        scan.pos += 1
        return char
    escaped = text[scan.pos + 1 : scan.pos + 2]
    if escaped in _HEX_DIGITS:
        digits = _HEX_DIGITS[escaped]
        hexa = text[scan.pos + 2 : scan.pos + 2 + digits]
        if len(hexa) != digits or not all(c in "0123456789abcdefABCDEF" for c in hexa):
            raise scan.refuse(f"has \\{escaped} without {digits} hexadecimal digits")
        scan.pos += 2 + digits
        return chr(int(hexa, 16))
    if escaped not in _CLASS_ESCAPES:
        hint = _HINTS.get(escaped, "the character itself") if escaped else "\\\\"
        raise scan.refuse(
            f"uses the escape \\{escaped} inside [ ], which GBNF does not support; write {hint}"
        )
    scan.pos += 2
    return _CLASS_ESCAPES[escaped]


def _quantifier(scan: _Scan, char: str) -> None:
    """Read ``*``, ``+``, ``?`` or ``{…}`` after an atom, and a lazy ``?`` after it."""
    if scan.weight == 0:
        raise scan.refuse(f"has {char} with nothing before it to repeat")
    if scan.quantified:
        raise scan.refuse(f"has {char} right after another quantifier")
    if scan.escape_ends_run:
        raise scan.refuse(
            f"has {char} after an escape that ends a run of literal text, which the grammar conversion "
            "would repeat whole; put the escape in a group, e.g. (\\-)"
        )
    if char == "{":
        minimum, maximum, factor = _braces(scan)
    else:
        minimum, maximum, factor = int(char == "+"), 1 if char == "?" else None, 1
    if scan.empty and (maximum is None or maximum > 1):
        raise scan.refuse(
            f"has {char} on something that can match the empty string: the grammar would be ambiguous "
            "enough to stall sampling; repeat something that cannot be empty, e.g. (a+)? instead of (a?)+"
        )
    if char == "{":  # written out: the atom becomes a rule of its own, each optional copy two more
        scan.rules = 2 * (maximum - minimum) if maximum is not None else 2
    else:
        _check_rules(scan, scan.rules)
        scan.rules += 1
    scan.pos += 1
    if scan.text.startswith("?", scan.pos):  # lazy: a ? on what the quantifier made
        _check_rules(scan, scan.rules)
        scan.rules += 1
        scan.pos += 1
    scan.weight *= factor
    scan.empty = scan.empty or minimum == 0
    if scan.weight > scan.max_repeat:
        raise scan.refuse(
            f"repeats {scan.weight} times, counting the repeated groups around it; "
            f"at most {scan.max_repeat} is supported"
        )
    scan.quantified = True
    scan.run = 0


def _check_rules(scan: _Scan, rules: int) -> None:
    """llama.cpp refuses ``*``, ``+`` or ``?`` on a group holding more than 2,000 rules."""
    if rules > LLAMA_GROUP_RULES:
        raise scan.refuse(
            f"repeats a group that llama.cpp expands to {rules} grammar rules; it takes at most "
            f"{LLAMA_GROUP_RULES} (write fewer or smaller bounded repetitions inside)"
        )


def _braces(scan: _Scan) -> tuple[int, int | None, int]:
    """Read ``{n}``, ``{m,}`` or ``{m,n}`` up to its ``}``: minimum, maximum, size of its expansion."""
    text = scan.text
    close = text.find("}", scan.pos)
    body = text[scan.pos + 1 : close] if close != -1 else ""
    low, comma, high = body.partition(",")
    if not _is_number(low) or (high and not _is_number(high)):
        raise scan.refuse("has a { that is not a quantifier {n}, {m,} or {m,n} (escape a literal one as \\{)")
    minimum = int(low)
    maximum = int(high) if high else None if comma else minimum
    if maximum is not None and minimum > maximum:
        raise scan.refuse(f"has the quantifier {{{body}}}, whose minimum is above its maximum")
    bound = max(minimum, maximum or 0, 1)
    if bound > scan.max_repeat:
        raise scan.refuse(
            f"has the quantifier {{{body}}}; at most {scan.max_repeat} repetitions are supported"
        )
    scan.pos = close
    return minimum, maximum, bound


def _is_number(text: str) -> bool:
    return text.isascii() and text.isdigit() and len(text) <= 9
