"""Call bodies held whole while they are written, and where each ends, found reading each character once.

A body the scanner does not stream (a call of another shape, or text that is
no call) is held until it is complete and then read by the format's whole-body
parser.  Asking again after every token whether the body so far is complete
(``json.loads`` of it, a search for the closing marker from its start) reads
it once per token: quadratic in its length.  These keep their state between
pieces: :class:`~._json_prefix.JsonPrefix` for the JSON, :class:`MarkerSearch`
for a marker, and the text as a list of pieces joined once.
"""

from __future__ import annotations

import json

from ._json_prefix import JsonPrefix, Progress

__all__ = ["NOT_JSON", "LeadingBody", "MarkerSearch", "TaggedBody", "decode_whole"]

NOT_JSON = object()
"""A leading body that is no JSON value (or one too deep for Python's parser)."""
_FENCE = "```"


class MarkerSearch:
    """Finds *marker* in text given piece by piece: each piece is searched once, with the end of the last."""

    def __init__(self, marker: str) -> None:
        self.marker = marker
        self._tail = ""  # the end of the text searched, where a marker cut by a piece's end begins

    def find(self, piece: str, offset: int) -> int:
        """Where the marker starts (counted as *offset*, the piece's own start, counts), or -1 for not yet."""
        window = self._tail + piece
        index = window.find(self.marker)
        if index != -1:
            return offset - len(self._tail) + index
        keep = len(self.marker) - 1
        self._tail = window[len(window) - keep :] if keep else ""
        return -1


class _Pieces:
    """Text given piece by piece, joined once when it is read."""

    def __init__(self) -> None:
        self._pieces: list[str] = []
        self.length = 0

    def add(self, piece: str) -> int:
        """Keep *piece*; the offset it starts at."""
        offset = self.length
        self._pieces.append(piece)
        self.length += len(piece)
        return offset

    @property
    def text(self) -> str:
        """All the text so far."""
        joined = "".join(self._pieces)
        self._pieces = [joined]
        return joined


class TaggedBody:
    """A body between a format's markers, held until its closing marker.

    With *json_body*, a body that opens with ``{`` or ``[`` ends at the first
    closing marker after its JSON value (an argument may contain the marker);
    a body whose JSON turns out wrong, or any other body, at the first closing
    marker.
    """

    def __init__(self, end: str, *, json_body: bool) -> None:
        self._end = end
        self._pieces = _Pieces()
        self._undecided = json_body  # only white space so far: JSON or not is not known yet
        self._json: JsonPrefix | None = None
        self._json_start = 0
        self._search: MarkerSearch | None = None if json_body else MarkerSearch(end)

    @property
    def text(self) -> str:
        """The body so far."""
        return self._pieces.text

    def feed(self, piece: str) -> int:
        """Read *piece*; where the closing marker starts in the body, or -1 while the body goes on."""
        offset = self._pieces.add(piece)
        if self._undecided:
            stripped = piece.lstrip()
            if not stripped:
                return -1
            self._undecided = False
            if stripped[0] not in "{[":
                self._search = MarkerSearch(self._end)
                return self._search.find(self.text, 0)
            self._json = JsonPrefix()
            self._json_start = offset + len(piece) - len(stripped)
            piece, offset = stripped, self._json_start
        if self._search is not None:
            return self._search.find(piece, offset)
        assert self._json is not None
        progress = self._json.feed(piece)
        if progress is Progress.PARTIAL:
            return -1
        self._search = MarkerSearch(self._end)
        if progress is Progress.INVALID:  # not JSON after all: the first marker ends it
            return self._search.find(self.text, 0)
        assert self._json.end is not None
        after = self._json_start + self._json.end  # in this piece: the value ended while it was read
        return self._search.find(piece[after - offset :], after)


class LeadingBody:
    """A JSON value or ```` ``` ```` fenced block at the start of the output, held until it is complete."""

    def __init__(self) -> None:
        self._pieces = _Pieces()
        self._start: int | None = None  # where the value or fence starts (after white space)
        self._json: JsonPrefix | None = None
        self._fence_line: MarkerSearch | None = None  # the newline that ends the fence's first line
        self._fence_close: MarkerSearch | None = None
        self._body_start = 0  # the fenced JSON's first character
        self.outcome: tuple[object, int] | None = None  # (value or NOT_JSON, where it ends) once known

    @property
    def text(self) -> str:
        """The text so far."""
        return self._pieces.text

    def feed(self, piece: str) -> tuple[object, int] | None:
        """Read *piece*; ``(value, end)`` once known (:data:`NOT_JSON`: not JSON), None while incomplete."""
        offset = self._pieces.add(piece)
        if self._start is None:
            stripped = piece.lstrip()
            if not stripped:
                return None
            self._start = offset + len(piece) - len(stripped)
            piece, offset = stripped, self._start
            if stripped[0] != "`":
                self._json = JsonPrefix()
        if self._json is not None:
            self._read_json(piece)
        else:
            self._read_fence(piece, offset)
        return self.outcome

    def _read_json(self, piece: str) -> None:
        assert self._json is not None
        assert self._start is not None
        progress = self._json.feed(piece)
        if progress is Progress.INVALID:
            self.outcome = (NOT_JSON, self._pieces.length)
        elif progress is Progress.COMPLETE:
            assert self._json.end is not None
            end = self._start + self._json.end
            self.outcome = (decode_whole(self.text[self._start : end]), end)

    def _read_fence(self, piece: str, offset: int) -> None:
        assert self._start is not None
        if self._fence_close is None and self._fence_line is None:
            opening = self.text[self._start : self._start + len(_FENCE)]
            if not opening.startswith(_FENCE):
                if not _FENCE.startswith(opening):
                    self.outcome = (NOT_JSON, self._pieces.length)
                return
            self._fence_line = MarkerSearch("\n")
            piece = self.text[self._start + len(_FENCE) :]
            offset = self._start + len(_FENCE)
        if self._fence_line is not None:
            newline = self._fence_line.find(piece, offset)
            if newline == -1:
                return
            language = self.text[self._start + len(_FENCE) : newline].strip().lower()
            if language not in ("", "json"):
                self.outcome = (NOT_JSON, self._pieces.length)
                return
            self._fence_line, self._fence_close = None, MarkerSearch(_FENCE)
            self._body_start = newline + 1
            piece, offset = self.text[self._body_start :], self._body_start
        assert self._fence_close is not None
        close = self._fence_close.find(piece, offset)
        if close != -1:
            self.outcome = (decode_whole(self.text[self._body_start : close]), close + len(_FENCE))


def decode_whole(text: str) -> object:
    """*text* as one JSON value or a fenced block of one; :data:`NOT_JSON` when it is neither."""
    stripped = text.strip()
    if stripped.startswith(_FENCE):
        body = LeadingBody()
        outcome = body.feed(stripped)
        return NOT_JSON if outcome is None else outcome[0]
    try:
        return json.loads(stripped)
    except (ValueError, RecursionError):  # RecursionError: nested deeper than Python's parser goes
        return NOT_JSON
