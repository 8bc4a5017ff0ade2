"""The Jinja environment chat templates render in: jinja2's sandbox, shaped like llama.cpp's engine.

Templates are written for transformers (Python's jinja2) and tested against
llama.cpp's own engine (``common/jinja``), which is more forgiving.  Bubo
gives them what both give, in jinja2's sandbox:

- transformers' settings: ``trim_blocks``, ``lstrip_blocks``, the
  ``loopcontrols`` extension and a pass-through ``{% generation %}`` tag;
- the globals ``raise_exception``, ``strftime_now`` (on the server's local
  clock), ``namespace`` and ``range`` (jinja2's own);
- ``tojson`` with Python's options (``ensure_ascii`` off by default,
  ``indent``, ``separators``, ``sort_keys``), which also takes what jinja2's
  filters return (``map``'s generators) as lists;
- ``safe`` as a plain string (no autoescaping, so ``"a"|safe + b`` does not
  HTML-escape ``b``, as in llama.cpp);
- list and dict methods that change them (``ns.items.append(x)``: Kimi K2), as
  llama.cpp allows; the sandbox still refuses private attributes;
- llama.cpp's leniency with missing values: a missing attribute of a missing
  value is missing too, ``+`` between a string and a null or missing value
  treats that value as an empty string, and ``+`` between a string and
  another value joins the other's text (``"x" + 1`` is ``"x1"``).

:func:`context_variables` adds what llama.cpp puts in every template's context
(``date_string``, ``datetime``) and, for a template that reads ``functions``
(FireFunction v2), the tools as indented JSON.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NoReturn

import jinja2
import jinja2.ext
import jinja2.meta
from jinja2.exceptions import SecurityError
from jinja2.sandbox import SandboxedEnvironment

__all__ = ["Clock", "TemplateEnvironment", "context_variables", "local_now", "template_reads"]

Clock = Callable[[], dt.datetime]
"""What "now" is for a template: an aware local time."""

DATE_STRING_FORMAT = "%d %b %Y"  # llama.cpp's date_string: "02 Dec 2025" (Llama 3.x templates)
DATETIME_FORMAT = "%b %d %Y"  # llama.cpp's datetime: "Dec 02 2025" (FireFunction v2)


def local_now() -> dt.datetime:
    """The server's local time (llama.cpp formats dates in local time too)."""
    return dt.datetime.now().astimezone()


class _GenerationTag(jinja2.ext.Extension):
    """transformers' ``{% generation %}…{% endgeneration %}`` marks; rendered as their body."""

    tags = {"generation"}  # noqa: RUF012 - jinja2's own attribute type

    def parse(self, parser: jinja2.parser.Parser) -> list[jinja2.nodes.Node]:
        next(parser.stream)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


class _LenientUndefined(jinja2.ChainableUndefined):
    """A missing value as llama.cpp treats it: chained lookups stay missing, ``+ "text"`` is ``"text"``."""

    def __add__(self, other: object) -> Any:
        if isinstance(other, str):
            return other
        return super().__add__(other)

    def __radd__(self, other: object) -> Any:
        if isinstance(other, str):
            return other
        return super().__radd__(other)


def _text(value: object) -> str:
    """A value joined to a string by ``+``: its text (nothing for a null or missing value)."""
    if value is None or isinstance(value, jinja2.Undefined):
        return ""
    return str(value)


def _plain(value: Any) -> Any:
    """A value ``json.dumps`` cannot encode itself: a generator as a list, a missing value as null."""
    if isinstance(value, jinja2.Undefined):
        return None
    if isinstance(value, Iterable) and not isinstance(value, str | bytes | Mapping):
        return list(value)
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        value,
        ensure_ascii=ensure_ascii,
        indent=indent,
        separators=separators,
        sort_keys=sort_keys,
        default=_plain,
    )


def _raise_exception(message: str) -> NoReturn:
    raise jinja2.exceptions.TemplateError(message)


class TemplateEnvironment(SandboxedEnvironment):
    """jinja2's sandbox with transformers' settings and llama.cpp's globals and leniency."""

    intercepted_binops = frozenset({"+"})

    def __init__(self, clock: Clock = local_now) -> None:
        super().__init__(
            trim_blocks=True,
            lstrip_blocks=True,
            extensions=[jinja2.ext.loopcontrols, _GenerationTag],
            undefined=_LenientUndefined,
        )
        self.filters["tojson"] = _tojson
        self.filters["safe"] = _text
        self.globals["raise_exception"] = _raise_exception
        self.globals["strftime_now"] = lambda format_: clock().strftime(format_)

    def unsafe_undefined(self, obj: Any, attribute: str) -> jinja2.Undefined:
        """A private attribute refuses the render at once (a lenient missing value would hide the attempt)."""
        raise SecurityError(f"access to attribute {attribute!r} of {type(obj).__name__!r} object is unsafe")

    def call_binop(self, context: jinja2.runtime.Context, operator: str, left: Any, right: Any) -> Any:
        """``+`` between a string and anything else joins their text, as llama.cpp's engine does."""
        if operator == "+" and (isinstance(left, str) or isinstance(right, str)):
            return _text(left) + _text(right)
        return super().call_binop(context, operator, left, right)


def template_reads(environment: jinja2.Environment, source: str) -> frozenset[str]:
    """The variables *source* reads without setting them (what its context may provide)."""
    return frozenset(jinja2.meta.find_undeclared_variables(environment.parse(source)))


def context_variables(now: dt.datetime, reads: frozenset[str], tools: list[Any] | None) -> dict[str, Any]:
    """What llama.cpp adds to a template's context, for a template that reads *reads*.

    ``date_string`` and ``datetime`` are today's date (llama.cpp sets both for
    every template); ``functions`` is the tools as JSON indented by 2 ("" without
    tools), for FireFunction v2, as llama.cpp's handler for it gave them.
    """
    variables: dict[str, Any] = {
        "date_string": now.strftime(DATE_STRING_FORMAT),
        "datetime": now.strftime(DATETIME_FORMAT),
    }
    if "functions" in reads:
        variables["functions"] = json.dumps(tools, indent=2, ensure_ascii=False) if tools else ""
    return variables
