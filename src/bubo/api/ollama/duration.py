"""Go durations (``time.ParseDuration``), read in one pass: the strings Ollama takes as ``keep_alive``.

Go's grammar: an optional sign, then ``0`` alone, or one or more decimal
numbers (``1``, ``1.5``, ``.5``, ``1.``) each followed by a unit (``ns``,
``us``, ``µs``, ``μs``, ``ms``, ``s``, ``m``, ``h``): ``"300ms"``, ``"-1.5h"``,
``"2h45m"``.  A unit is every character up to the next digit or ``.``, so
``"1s x"`` has the unknown unit ``"s x"``.  As in Go, a total beyond the
largest ``time.Duration`` (2⁶³-1 ns, about 292 years) is no duration.

The scanner reads each character once.  The regular expression it replaces
(a repeated group of optional parts) backtracked exponentially: ``"11s" * 28 +
" x"`` held the event loop for minutes.  Text longer than
:data:`MAX_DURATION_CHARS` is refused before it is read.
"""

from __future__ import annotations

__all__ = ["MAX_DURATION_CHARS", "duration_seconds"]

MAX_DURATION_CHARS = 64
"""The longest duration text read.  Go's longest useful one, ``"2562047h47m16.854775807s"``, has 24."""

_NS_PER_S = 1_000_000_000
_MAX_NS = 2**63 - 1  # Go's largest Duration; its most negative one is one more nanosecond
_UNIT_NS = {"ns": 1, "us": 1_000, "µs": 1_000, "μs": 1_000, "ms": 1_000_000, "s": _NS_PER_S,
            "m": 60 * _NS_PER_S, "h": 3600 * _NS_PER_S}  # fmt: skip
_DIGITS = frozenset("0123456789")


def duration_seconds(text: str) -> float | None:
    """*text* as a Go duration, in seconds (negative when it is); None when it is none."""
    if len(text) > MAX_DURATION_CHARS:
        return None
    nanoseconds = _nanoseconds(text)
    return None if nanoseconds is None else nanoseconds / _NS_PER_S


def _nanoseconds(text: str) -> int | None:
    """Go's ``ParseDuration`` of *text* in whole nanoseconds, in one pass; None where Go fails."""
    negative = text[:1] == "-"
    body = text[1:] if text[:1] in ("-", "+") else text
    if body == "0":
        return 0
    if not body:
        return None
    limit = _MAX_NS + 1 if negative else _MAX_NS
    total, pos = 0, 0
    while pos < len(body):
        whole_end = _digits_end(body, pos)
        whole, fraction = body[pos:whole_end], ""
        pos = whole_end
        if pos < len(body) and body[pos] == ".":
            fraction_end = _digits_end(body, pos + 1)
            fraction, pos = body[pos + 1 : fraction_end], fraction_end
        if not whole and not fraction:
            return None  # no number before the unit (".s", "s", "1s.s")
        unit_end = pos
        while unit_end < len(body) and body[unit_end] != "." and body[unit_end] not in _DIGITS:
            unit_end += 1
        unit = _UNIT_NS.get(body[pos:unit_end])
        if unit is None:
            return None  # a missing or unknown unit
        pos = unit_end
        total += int(whole or "0") * unit
        if fraction:
            total += int(fraction) * unit // 10 ** len(fraction)
        if total > limit:
            return None
    return -total if negative else total


def _digits_end(text: str, pos: int) -> int:
    """Where the run of ASCII digits at *pos* ends."""
    while pos < len(text) and text[pos] in _DIGITS:
        pos += 1
    return pos
