"""GBNF as Bubo writes it (freeform grammars, numeric ranges), read back as one Python regex, to compare languages."""

from __future__ import annotations

import re

_TOKEN = re.compile(r'\s*("(?:\\.|[^"\\])*"|\[(?:\\.|[^\]\\])*\]|[a-z0-9-]+|\{\d+(?:,\d*)?\}|[()|*+?])')
_ESCAPE = re.compile(r"\\(x[0-9A-Fa-f]{2}|u[0-9A-Fa-f]{4}|U[0-9A-Fa-f]{8}|.)")
_SIMPLE = {"n": "\n", "r": "\r", "t": "\t", "\\": "\\", '"': '"', "[": "[", "]": "]"}


def _unescaped(text: str) -> str:
    def one(match: re.Match[str]) -> str:
        code = match.group(1)
        return chr(int(code[1:], 16)) if len(code) > 1 else _SIMPLE[code]

    return _ESCAPE.sub(one, text)


def language(gbnf: str, root: str) -> re.Pattern[str]:
    """The strings rule *root* of *gbnf* derives, as a compiled regex (fails on a recursive rule)."""
    rules = {}
    for line in gbnf.strip().splitlines():
        name, _, body = line.partition(" ::= ")
        rules[name] = body
    return re.compile(_regex(rules, root, ()), re.DOTALL)


def _regex(rules: dict[str, str], name: str, path: tuple[str, ...]) -> str:
    assert name not in path, f"recursive rule {name}"
    body, out, position = rules[name], [], 0
    while position < len(body.rstrip()):
        token = _TOKEN.match(body, position)
        assert token is not None, f"unexpected GBNF at {body[position:]!r}"
        text, position = token.group(1), token.end()
        if text.startswith('"'):
            out.append(re.escape(_unescaped(text[1:-1])))
        elif text.startswith("["):
            inner = text[1:-1]
            pieces = re.findall(r"\\(?:x[0-9A-Fa-f]{2}|u[0-9A-Fa-f]{4}|U[0-9A-Fa-f]{8}|.)|[^\\]", inner)
            out.append("[" + "".join(p if p == "-" else re.escape(_unescaped(p)) for p in pieces) + "]")
        elif text == "(":
            out.append("(?:")
        elif text[0] in ")|*+?{":
            out.append(text)
        else:
            out.append("(?:" + _regex(rules, text, (*path, name)) + ")")
    return "".join(out)


def as_regex(expression: str) -> re.Pattern[str]:
    """The language of one GBNF *expression* (a rule's body, as the numeric range writers write it)."""
    return language(f"expression ::= {' '.join(expression.split())}", "expression")
