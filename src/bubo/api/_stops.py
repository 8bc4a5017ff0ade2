"""Stop strings from the wire: one bound for every dialect, named by the dialect's own field.

The engine matches all of a request's stop strings with one automaton, so a
token costs the same whatever their number (``engine/_stops.py``); the bound
keeps what building and holding that automaton costs in proportion to what
real clients send.  OpenAI takes at most 4 strings, Ollama's model files set
a handful, chat front ends (llama.cpp's page, SillyTavern) a few dozen at most,
and the longest in common use (chat templates' end markers, a new line and
``User:``) are well under 100 characters: 64 strings and 8,192 characters in all
leave every one of them room, while 100,000 strings are refused before
anything is queued.
"""

from __future__ import annotations

from collections.abc import Sequence

from bubo.errors import InvalidRequest

__all__ = ["MAX_STOP_CHARS", "MAX_STOP_STRINGS", "stop_strings"]

MAX_STOP_STRINGS = 64
"""The most stop strings one request may send."""

MAX_STOP_CHARS = 8192
"""The most characters one request's stop strings may hold, all of them together."""


def stop_strings(stop: str | Sequence[str] | None, param: str) -> tuple[str, ...]:
    """A request's stop strings (one string or a list of them) as a tuple, within the bounds.

    Raises:
        InvalidRequest: more than :data:`MAX_STOP_STRINGS` strings, or more than
            :data:`MAX_STOP_CHARS` characters in all; ``param`` is *param*, the dialect's field.

    """
    if stop is None:
        return ()
    stops = (stop,) if isinstance(stop, str) else tuple(stop)
    if len(stops) > MAX_STOP_STRINGS:
        raise InvalidRequest(
            f"{param} has {len(stops)} stop strings; at most {MAX_STOP_STRINGS} are accepted", param=param
        )
    total = sum(len(item) for item in stops)
    if total > MAX_STOP_CHARS:
        raise InvalidRequest(
            f"{param} holds {total} characters; at most {MAX_STOP_CHARS} are accepted in all stop strings",
            param=param,
        )
    return stops
