r"""Whether streamed text is a JSON value being written, a whole one (and where it ends), or none.

Python's :mod:`json` reads whole texts only: asking it again after every
token whether a body is complete reads the body once per token, quadratic in
its length (a 20,000-character body took seconds of CPU).  This reader keeps
its state between pieces and reads each character once.  It takes what
:func:`json.loads` takes (strict strings, ``NaN``, ``Infinity``, ``-Infinity``)
and tells a value cut inside a literal, a number or an escape (``tr``, ``1e``,
``"\\u00``) from one that is wrong.
"""

from __future__ import annotations

import enum
import re

__all__ = ["JsonPrefix", "Progress"]

_SPACE = frozenset(" \t\n\r")
_DIGITS = frozenset("0123456789")
_HEX = frozenset("0123456789abcdefABCDEF")
_ESCAPES = frozenset('"\\/bfnrt')
_LITERALS = {"t": "rue", "f": "alse", "n": "ull", "N": "aN", "I": "nfinity"}
_PLAIN = re.compile(r'[^"\\\x00-\x1f]*')  # string characters that need no decision: skipped in one match


class Progress(enum.Enum):
    """What the text read so far is."""

    PARTIAL = "partial"  # the start of a JSON value
    COMPLETE = "complete"  # one whole value (``end`` says where it ends)
    INVALID = "invalid"  # no JSON value starts like this


class _At(enum.Enum):
    VALUE = "value"
    ARRAY_FIRST = "array_first"  # after "[": a value or "]"
    OBJECT_FIRST = "object_first"  # after "{": a key or "}"
    KEY = "key"  # after "," in an object
    COLON = "colon"
    AFTER = "after"  # after a value: ",", "]" or "}"
    STRING = "string"
    ESCAPE = "escape"
    UNICODE = "unicode"  # the hex digits of \uXXXX
    LITERAL = "literal"
    MINUS = "minus"  # "-": a digit or "Infinity"
    ZERO = "zero"  # "0", "-0"
    INTEGER = "integer"
    POINT = "point"  # "1.": a digit
    FRACTION = "fraction"
    EXPONENT = "exponent"  # "1e": a sign or a digit
    EXPONENT_SIGN = "exponent_sign"
    EXPONENT_DIGITS = "exponent_digits"


_NUMBER_ENDS = frozenset({_At.ZERO, _At.INTEGER, _At.FRACTION, _At.EXPONENT_DIGITS})
_NUMBER = _NUMBER_ENDS | {_At.MINUS, _At.POINT, _At.EXPONENT, _At.EXPONENT_SIGN}


class JsonPrefix:
    """Reads one JSON value a piece at a time (:meth:`feed`), each character once."""

    def __init__(self) -> None:
        self.progress = Progress.PARTIAL
        self.end: int | None = None  # once COMPLETE: the value's length, in characters fed
        self._read = 0  # characters fed before the current piece
        self._at = _At.VALUE
        self._open: list[str] = []  # the arrays ("[") and objects ("{") around the current point
        self._key = False  # the string being read is an object's key
        self._left = ""  # what the literal being read still needs
        self._hex_left = 0  # the hex digits of a \uXXXX escape still to come

    def feed(self, text: str) -> Progress:
        """Read *text*, the next piece; what the text fed so far is (once decided, it stays)."""
        pos = 0
        while pos < len(text) and self.progress is Progress.PARTIAL:
            if self._at is _At.STRING:
                pos = _PLAIN.match(text, pos).end()  # type: ignore[union-attr] # matches empty at worst
                if pos == len(text):
                    break
            self._step(text[pos], pos)
            pos += 1
        self._read += len(text)
        return self.progress

    def _step(self, char: str, pos: int) -> None:
        at = self._at
        if at in _NUMBER:
            if self._number(char):
                return
            if at not in _NUMBER_ENDS:
                self.progress = Progress.INVALID
                return
            self._value_done(pos, included=False)
            at = self._at
            if self.progress is not Progress.PARTIAL:
                return
        if at is _At.STRING:
            self._string(char, pos)
        elif at is _At.ESCAPE:
            self._escape(char)
        elif at is _At.UNICODE:
            self._unicode(char)
        elif at is _At.LITERAL:
            self._literal(char, pos)
        elif char in _SPACE:
            return
        else:
            self._structure(at, char, pos)

    def _structure(self, at: _At, char: str, pos: int) -> None:
        """A character outside strings, literals and numbers (white space already skipped)."""
        if (at is _At.ARRAY_FIRST and char == "]") or (at is _At.OBJECT_FIRST and char == "}"):
            self._open.pop()
            self._value_done(pos, included=True)
        elif at in (_At.VALUE, _At.ARRAY_FIRST):
            self._value_start(char)
        elif at in (_At.OBJECT_FIRST, _At.KEY) and char == '"':
            self._at, self._key = _At.STRING, True
        elif at is _At.COLON and char == ":":
            self._at = _At.VALUE
        elif at is _At.AFTER and char == ",":
            self._at = _At.KEY if self._open[-1] == "{" else _At.VALUE
        elif at is _At.AFTER and char == {"{": "}", "[": "]"}[self._open[-1]]:
            self._open.pop()
            self._value_done(pos, included=True)
        else:
            self.progress = Progress.INVALID

    def _value_start(self, char: str) -> None:
        if char in "{[":
            self._open.append(char)
            self._at = _At.OBJECT_FIRST if char == "{" else _At.ARRAY_FIRST
        elif char == '"':
            self._at, self._key = _At.STRING, False
        elif char in _LITERALS:
            self._at, self._left = _At.LITERAL, _LITERALS[char]
        elif char == "-":
            self._at = _At.MINUS
        elif char in _DIGITS:
            self._at = _At.ZERO if char == "0" else _At.INTEGER
        else:
            self.progress = Progress.INVALID

    def _value_done(self, pos: int, *, included: bool) -> None:
        """A value ended at *pos* of the current piece (*included*: the character there is its last)."""
        if self._open:
            self._at = _At.AFTER
            return
        self.progress = Progress.COMPLETE
        self.end = self._read + pos + (1 if included else 0)

    def _string(self, char: str, pos: int) -> None:
        if char == "\\":
            self._at = _At.ESCAPE
        elif char == '"':
            if self._key:
                self._at = _At.COLON
            else:
                self._value_done(pos, included=True)
        else:  # a control character (everything else was skipped whole)
            self.progress = Progress.INVALID

    def _escape(self, char: str) -> None:
        if char == "u":
            self._at, self._hex_left = _At.UNICODE, 4
        elif char in _ESCAPES:
            self._at = _At.STRING
        else:
            self.progress = Progress.INVALID

    def _unicode(self, char: str) -> None:
        if char not in _HEX:
            self.progress = Progress.INVALID
            return
        self._hex_left -= 1
        if not self._hex_left:
            self._at = _At.STRING

    def _literal(self, char: str, pos: int) -> None:
        if char != self._left[0]:
            self.progress = Progress.INVALID
            return
        self._left = self._left[1:]
        if not self._left:
            self._value_done(pos, included=True)

    def _number(self, char: str) -> bool:
        """Whether *char* goes on the number being read (the state moves on)."""
        at = self._at
        digit = char in _DIGITS
        step: _At | None = None
        if at is _At.MINUS:
            if char == "I":
                self._at, self._left = _At.LITERAL, "nfinity"
                return True
            step = (_At.ZERO if char == "0" else _At.INTEGER) if digit else None
        elif at in (_At.ZERO, _At.INTEGER, _At.FRACTION):
            if digit and at is not _At.ZERO:
                step = at
            elif char == "." and at is not _At.FRACTION:
                step = _At.POINT
            elif char in "eE":
                step = _At.EXPONENT
        elif at is _At.POINT:
            step = _At.FRACTION if digit else None
        elif at is _At.EXPONENT and char in "+-":
            step = _At.EXPONENT_SIGN
        else:  # EXPONENT, EXPONENT_SIGN, EXPONENT_DIGITS
            step = _At.EXPONENT_DIGITS if digit else None
        if step is None:
            return False
        self._at = step
        return True
