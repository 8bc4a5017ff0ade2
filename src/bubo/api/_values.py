r"""Values JSON text can spell that no field can use: lone surrogates and infinite numbers.

``"\ud800"`` is a valid JSON escape but not Unicode: the string cannot be
encoded, so tokenizing, rendering or echoing it would fail deep inside a
request.  ``1e309`` is a valid JSON number but parses as infinity, which no
sampler, limit or schema can mean (JSON has no infinity).  Both are refused
once, right after the body is parsed, with the JSON path of the value.

The full walk only runs when the raw body could hold such a value (a
surrogate escape or encoded surrogate, or a number that overflowed while
parsing), so ordinary bodies pay one regular-expression scan.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from bubo.errors import InvalidRequest

__all__ = ["NonFiniteNumbers", "check_values"]

# "\ud800"-"\udfff" escapes, or a surrogate encoded as UTF-8 (json.loads decodes bytes with surrogatepass)
_MAY_HOLD_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]|\xed[\xa0-\xbf]")


class NonFiniteNumbers:
    """A ``parse_float`` hook for :func:`json.loads` that notes whether any number overflowed."""

    def __init__(self) -> None:
        self.seen = False

    def __call__(self, text: str) -> float:
        """*text* as a float, as :func:`json.loads` would parse it."""
        value = float(text)
        if not math.isfinite(value):
            self.seen = True
        return value


def _is_unicode(text: str) -> bool:
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _join(path: str, key: str | int) -> str:
    return f"{path}[{key}]" if isinstance(key, int) else f"{path}.{key}"


def _param(path: str) -> str | None:
    return path.removeprefix("$").removeprefix(".") or None


def _bad_string(path: str) -> InvalidRequest:
    return InvalidRequest(
        f"the string at {path} is not valid Unicode: it holds a lone surrogate "
        "(a \\ud800-\\udfff escape without its pair)",
        code="parse_error",
        param=_param(path),
    )


def _walk(data: Any) -> None:
    """Raise for the first lone surrogate or non-finite number, naming its JSON path."""
    stack: list[tuple[Any, str]] = [(data, "$")]
    while stack:
        value, path = stack.pop()
        if isinstance(value, dict):
            for key in value:
                if not _is_unicode(key):
                    raise InvalidRequest(
                        f"a key of the object at {path} is not valid Unicode: it holds a lone surrogate "
                        "(a \\ud800-\\udfff escape without its pair)",
                        code="parse_error",
                        param=_param(path),
                    )
            stack.extend((item, _join(path, key)) for key, item in reversed(value.items()))
        elif isinstance(value, list):
            stack.extend((item, _join(path, index)) for index, item in reversed(list(enumerate(value))))
        elif isinstance(value, str):
            if not _is_unicode(value):
                raise _bad_string(path)
        elif isinstance(value, float) and not math.isfinite(value):
            raise InvalidRequest(
                f"the number at {path} is too large: JSON numbers must be finite (at most about 1.8e308)",
                code="parse_error",
                param=_param(path),
            )


def check_values(data: Any, body: bytes, numbers: NonFiniteNumbers) -> None:
    """Refuse *data* (parsed from *body* with *numbers* as its float hook) if it holds an unusable value.

    Raises:
        InvalidRequest: ``parse_error``, ``param`` the path of the first lone surrogate or infinite number.

    """
    if numbers.seen or json.detect_encoding(body) != "utf-8" or _MAY_HOLD_SURROGATE.search(body):
        _walk(data)
