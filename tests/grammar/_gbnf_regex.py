"""GBNF of the numeric range writers, read back as a Python regex, to compare languages in tests."""

from __future__ import annotations

import re

# what the range writers emit: "literals", [classes], {m,n}, groups, optional groups and items, alternatives
_TOKEN = re.compile(r'\s*("[0-9.-]*"|\[[0-9]-[0-9]\]|\{\d+,\d+\}|\(|\)|\?|\|)')


def as_regex(gbnf: str) -> re.Pattern[str]:
    """The same language as a Python regex; fails on anything outside that subset."""
    parts, position, gbnf = [], 0, gbnf.strip()
    while position < len(gbnf):
        token = _TOKEN.match(gbnf, position)
        assert token is not None, f"unexpected GBNF at {gbnf[position:]!r}"
        text, position = token.group(1), token.end()
        parts.append(re.escape(text[1:-1]) if text.startswith('"') else "(?:" if text == "(" else text)
    return re.compile("".join(parts))
