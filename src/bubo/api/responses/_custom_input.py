r"""A custom tool's ``input`` string, decoded from its JSON arguments (``{"input": "…"}``) as they stream.

Each fragment is decoded once, as far as it can be: an escape (``\u00e9``)
or a surrogate pair (``\ud83d\ude00``) cut by a fragment's end waits for the
next one.  Decoding the whole input again for every fragment (as this once
did) is quadratic in its length, and a patch for Codex's ``apply_patch`` runs
to tens of thousands of characters.  Arguments of another shape (the opening
not found within :data:`MAX_OPENING_CHARS`) stream no input deltas; the
call's ``input`` is read whole once it is done.
"""

from __future__ import annotations

import enum
import json
import re

from .tools import CUSTOM_INPUT

__all__ = ["MAX_OPENING_CHARS", "CustomInput"]

MAX_OPENING_CHARS = 64
"""The most characters read for ``{"input": "`` (the parsers write it compact: 10 characters)."""

_OPENING = re.compile(r'\{\s*"' + CUSTOM_INPUT + r'"\s*:\s*"')
_HEX = frozenset("0123456789abcdefABCDEF")
_ESCAPE_LENGTH = 6  # \uXXXX


class _State(enum.Enum):
    OPENING = "opening"  # before the input string opens
    INPUT = "input"
    OVER = "over"  # the string closed, or the arguments have another shape


class CustomInput:
    """Feeds of the arguments' JSON text in, the input's text out."""

    def __init__(self) -> None:
        self._state = _State.OPENING
        self._opening = ""  # the arguments so far, until the input string opens
        self._cut = ""  # the input's JSON text not decoded yet: an escape or a pair cut by a fragment's end

    def feed(self, fragment: str) -> str:
        """The input text *fragment* (the next piece of the arguments) adds."""
        if self._state is _State.OPENING:
            self._opening += fragment
            opened = _OPENING.match(self._opening)
            if opened is None:
                if len(self._opening) > MAX_OPENING_CHARS:
                    self._state = _State.OVER
                return ""
            fragment, self._state = self._opening[opened.end() :], _State.INPUT
        if self._state is not _State.INPUT:
            return ""
        text = self._cut + fragment
        end, closed = _decodable(text)
        self._cut = "" if closed else text[end:]
        if closed:
            self._state = _State.OVER
        try:
            decoded: str = json.loads(f'"{text[:end]}"')
        except ValueError:  # not a JSON string after all: nothing more streams
            self._state = _State.OVER
            return ""
        return decoded


def _decodable(text: str) -> tuple[int, bool]:
    """How much of *text* (a JSON string's inside, from an escape's boundary) decodes now; whether it closed.

    Stops at an unescaped quote (closed), or before an escape cut short or a
    high surrogate whose low half may still come.
    """
    pos = 0
    while pos < len(text):
        char = text[pos]
        if char == '"':
            return pos, True
        if char != "\\":
            pos += 1
            continue
        if pos + 1 == len(text):
            return pos, False
        if text[pos + 1] != "u":
            pos += 2
            continue
        if pos + _ESCAPE_LENGTH > len(text):
            return pos, False
        after = pos + _ESCAPE_LENGTH
        pair = _is_high_surrogate(text[pos + 2 : after])
        if pair and _may_open_escape(text[after : after + _ESCAPE_LENGTH]):
            if after + _ESCAPE_LENGTH > len(text):
                return pos, False
            after += _ESCAPE_LENGTH  # the pair decodes together
        pos = after
    return pos, False


def _is_high_surrogate(digits: str) -> bool:
    return all(d in _HEX for d in digits) and 0xD800 <= int(digits, 16) <= 0xDBFF


def _may_open_escape(text: str) -> bool:
    r"""Whether *text* is, or begins, a ``\uXXXX`` escape."""
    return text[:1] in ("", "\\") and text[1:2] in ("", "u") and all(d in _HEX for d in text[2:])
