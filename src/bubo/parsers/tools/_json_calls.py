"""Reading JSON tool calls as they are written: ``{"name": …, "arguments": {…}}``, or an array of them.

A call starts as soon as its head is known (``{"name": "get_weather",
"arguments":``) and its arguments are passed on as they come, without the
whitespace outside strings (so the reassembled arguments are compact JSON).
While the head is written the scanner holds it back, and it can tell early
that the text is no call (its first key is neither ``name``, ``arguments`` nor
``parameters``; or the name is no offered tool, where only offered tools
count), or that it is a call of another shape (``arguments`` first, another
key after the name, arguments written as a JSON string), which the format's
whole-body parser reads once the JSON is complete.

Each character is read once: the head's tokens are kept as they complete, and
the shape is judged again only when one does.  A head still undecided after
:data:`MAX_HEAD_CHARS` characters is given up on: the first call's body is
then read whole (as a call of another shape), and after a call in an array
the calls end there.
"""

from __future__ import annotations

import enum
import json

from bubo.domain.output import OutputEvent
from bubo.parsers.base import ParserConfig

from ._calls import Emitter

__all__ = ["MAX_HEAD_CHARS", "JsonCallScanner", "Verdict"]

MAX_HEAD_CHARS = 1024
"""The most characters a call head (``{"name": "…", "arguments":``, with an array's ``[`` or ``,``) may
take before it is given up on.  A real head takes under 100 (tool names are at most 64 characters)."""

_CALL_KEYS = ("name", "arguments", "parameters")
_ARGUMENT_KEYS = ("arguments", "parameters")
_PUNCTUATION = frozenset("[]{}:,")
_ESCAPES = frozenset('"\\/bfnrtu')
_HEX = frozenset("0123456789abcdefABCDEF")
# the head of a call object, token by token ("key" and "string" stand for any JSON string)
_HEAD = ("{", "key", ":", "string", ",", "key", ":")


class Verdict(enum.Enum):
    """What the scanner knows of its text."""

    UNDECIDED = "undecided"  # the head is still being written
    NOT_A_CALL = "not_a_call"  # no call has this head: ``held`` is text (``rest`` follows it, unread)
    WHOLE = "whole"  # a call of another shape, maybe: ``held`` + ``rest`` to read whole
    STREAMING = "streaming"  # calls are being read
    DONE = "done"  # the calls ended; ``rest`` holds the text after them


class _Phase(enum.Enum):
    HEAD = "head"  # the first call's head
    ARGS = "args"  # the arguments of a started call
    STRING_ARGS = "string_args"  # arguments written as a JSON string: decoded once complete
    TAIL = "tail"  # the rest of the call object
    NEXT = "next"  # in an array, after a call: "," and the next head, or "]"


class _HeadTokens:
    """The JSON punctuation and string tokens of a head, read a character at a time.

    A head holds nothing else: any other character (a digit, a letter outside
    a string, a control character or a bad escape inside one) makes it no head.
    """

    def __init__(self) -> None:
        self.tokens: list[str] = []
        self.valid = True
        self._string: list[str] | None = None  # the string token being read
        self._escaped = False
        self._hex_left = 0  # hex digits still to come in a \uXXXX escape

    def feed(self, char: str) -> bool:
        """Read *char*; whether the tokens changed (one completed, or the text is no head)."""
        string = self._string
        if string is None:
            if char in _PUNCTUATION:
                self.tokens.append(char)
                return True
            if char == '"':
                self._string = [char]
                return False
            self.valid = char.isspace()
            return not self.valid
        string.append(char)
        if self._hex_left:
            self._hex_left -= 1
            self.valid = char in _HEX
        elif self._escaped:
            self._escaped = False
            self.valid = char in _ESCAPES
            self._hex_left = 4 if char == "u" else 0
        elif char == "\\":
            self._escaped = True
        elif char == '"':
            self.tokens.append("".join(string))
            self._string = None
            return True
        elif char < " ":
            self.valid = False  # JSON strings hold no raw control characters
        return not self.valid


class JsonCallScanner:
    """One JSON call object (or, with *array*, an array of them), read a character at a time."""

    def __init__(self, config: ParserConfig, emitter: Emitter, *, known_only: bool, array: bool) -> None:
        self._config = config
        self._emitter = emitter
        self._known_only = known_only
        self._array = array
        self.verdict = Verdict.UNDECIDED
        self.held = ""  # the head read so far (while undecided, or once NOT_A_CALL or WHOLE)
        self.rest = ""  # the text after the point of the verdict (NOT_A_CALL, WHOLE, DONE), unread
        self._phase = _Phase.HEAD
        self._in_array = False
        self._index: int | None = None  # the call being read (None: dropped for max_calls)
        self._depth = 0  # JSON nesting inside the call object
        self._in_string = False
        self._escaped = False
        self._string_args: list[str] = []
        self._head = _HeadTokens()

    def feed(self, text: str) -> list[OutputEvent]:
        """Consume *text*; the events of calls started and arguments written."""
        events: list[OutputEvent] = []
        for position, char in enumerate(text):
            if self.verdict not in (Verdict.UNDECIDED, Verdict.STREAMING):
                self.rest += text[position:]
                break
            self._step(char, events)
        return events

    def finish(self) -> list[OutputEvent]:
        """The text ended: a call cut inside its arguments ends there (string arguments are decoded)."""
        events: list[OutputEvent] = []
        if self._phase is _Phase.STRING_ARGS:
            self._emit_string_arguments(events)
        return events

    def _step(self, char: str, events: list[OutputEvent]) -> None:
        match self._phase:
            case _Phase.HEAD | _Phase.NEXT:
                self.held += char  # at most MAX_HEAD_CHARS: then a verdict ends the head
                if self._head.feed(char):
                    self._decide(events)
                elif len(self.held) > MAX_HEAD_CHARS:
                    self._give_up()
            case _Phase.ARGS:
                self._argument(char, events)
            case _Phase.STRING_ARGS:
                self._string_args.append(char)
                if self._string_char(char):
                    self._emit_string_arguments(events)
                    self._phase, self._depth = _Phase.TAIL, 1
            case _Phase.TAIL:
                self._tail(char)

    # ---- heads -----------------------------------------------------------------------------------

    def _decide(self, events: list[OutputEvent]) -> None:
        """Judge the head again: a token just completed (so nothing follows it yet), or it is no head."""
        tokens = self._head.tokens if self._head.valid else None
        first = self._phase is _Phase.HEAD
        if tokens is not None:
            tokens = self._head_tokens(tokens) if first else self._next_tokens(tokens)
        if tokens is None:
            self._undecidable(first=first)
            return
        shape = self._shape(tokens)
        if shape == "no" or (shape == "other" and not first):
            self._undecidable(first=first)
        elif shape == "other":
            self.verdict = Verdict.WHOLE
        elif shape == "head":
            self._start(json.loads(tokens[3]), events)

    def _head_tokens(self, tokens: list[str]) -> list[str]:
        """The first call's head tokens (an array's ``[`` taken off)."""
        if self._array and tokens[:1] == ["["]:
            self._in_array = True
            return tokens[1:]
        return tokens

    def _next_tokens(self, tokens: list[str]) -> list[str] | None:
        """After a call in an array: the next head's tokens; ``[]`` at its end (DONE); None: no head."""
        if tokens[:1] == ["]"]:
            self.verdict, self.held = Verdict.DONE, ""
            return []
        if not tokens:
            return []
        return tokens[1:] if tokens[0] == "," else None

    def _shape(self, tokens: list[str]) -> str:
        """``head`` (a call head, maybe not complete yet), ``other`` (another call shape), ``no``."""
        for want, token in zip(_HEAD, tokens, strict=False):
            if not (token.startswith('"') if want in ("key", "string") else token == want):
                return "no"
        keys = [json.loads(tokens[i]) for i in (1, 5) if i < len(tokens)]
        if keys and keys[0] not in _CALL_KEYS:
            return "no"
        if keys and keys[0] in _ARGUMENT_KEYS:
            return "other"
        if len(tokens) > 3 and self._known_only and self._config.tool(json.loads(tokens[3])) is None:
            return "no"
        if len(keys) > 1 and keys[1] not in _ARGUMENT_KEYS:
            return "other"
        return "head" if len(tokens) >= len(_HEAD) else "undecided"

    def _give_up(self) -> None:
        """A head too long to be a call's: the first call's body is read whole; after one, the calls end."""
        if self._phase is _Phase.HEAD:
            self.verdict = Verdict.WHOLE
        else:
            self._undecidable(first=False)

    def _undecidable(self, *, first: bool) -> None:
        """No call head here: on the first call, no call at all; after one, the calls ended."""
        if first:
            self.verdict = Verdict.NOT_A_CALL
        else:
            self.verdict, self.rest, self.held = Verdict.DONE, self.held, ""

    def _start(self, name: str, events: list[OutputEvent]) -> None:
        self.verdict, self.held = Verdict.STREAMING, ""
        self._head = _HeadTokens()  # for the next head, in an array
        self._index = self._emitter.start(name, events)
        self._phase, self._depth = _Phase.ARGS, 0

    # ---- arguments -------------------------------------------------------------------------------

    def _argument(self, char: str, events: list[OutputEvent]) -> None:
        if self._depth == 0 and not self._in_string:
            if char.isspace():
                return
            if char == '"':
                self._phase, self._string_args, self._escaped = _Phase.STRING_ARGS, [char], False
                return
        was_in_string = self._in_string
        self._emit(self._compact(char), events)
        if was_in_string or self._in_string:
            return
        if char in "{[":
            self._depth += 1
        elif char in "}]":
            self._depth -= 1
        if self._depth <= 0:  # a closed object or array, or a scalar's last character
            self._phase, self._depth = _Phase.TAIL, 1

    def _compact(self, char: str) -> str:
        """*char* as it goes into compact JSON (nothing for whitespace outside strings)."""
        if self._in_string:
            if self._escaped:
                self._escaped = False
            elif char == "\\":
                self._escaped = True
            elif char == '"':
                self._in_string = False
            return char
        if char == '"':
            self._in_string = True
        return "" if char.isspace() else char

    def _string_char(self, char: str) -> bool:
        """Whether *char* closes the JSON string of the arguments."""
        if self._escaped:
            self._escaped = False
            return False
        if char == "\\":
            self._escaped = True
            return False
        return char == '"'

    def _emit_string_arguments(self, events: list[OutputEvent]) -> None:
        try:
            decoded = json.loads(json.loads("".join(self._string_args)))
        except ValueError:
            decoded = {}
        self._emit(json.dumps(decoded, ensure_ascii=False, separators=(",", ":")), events)

    def _emit(self, fragment: str, events: list[OutputEvent]) -> None:
        if fragment and self._index is not None:
            events.append(self._emitter.arguments(self._index, fragment))

    # ---- the rest of the call object -------------------------------------------------------------

    def _tail(self, char: str) -> None:
        if self._in_string:
            self._compact(char)
            return
        if char == '"':
            self._in_string = True
        elif char in "{[":
            self._depth += 1
        elif char in "}]":
            self._depth -= 1
        if self._depth > 0:
            return
        if self._in_array:
            self._phase, self.verdict = _Phase.NEXT, Verdict.STREAMING
        else:
            self.verdict = Verdict.DONE
