"""The command line and environment of a model's child ``bubo serve``.

A child inherits the router's flags (those that are not the router's own or
the child's address) and its environment, as llama-server's instances do; it
listens on 127.0.0.1 only, on the socket the router bound for it (``child.py``),
and requires the router's own key, which travels in the environment
(``BUBO_API_KEY``), never on the command line.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Any

from bubo.config import OPTIONS, Option, serve_flag_values
from bubo.errors import InvalidRequest

from .catalog import CatalogEntry
from .child import LISTEN_FD_ENV, ROUTER_CHILD_ENV

__all__ = ["CHILD_HOST", "child_command", "child_environment", "extra_args", "inherited_flags"]

CHILD_HOST = "127.0.0.1"
# Set by the router for each child; the router's own value of these never reaches a child.
_RESERVED_DESTS = frozenset(
    {
        ("model", "path"),
        ("serving", "served_model_name"),
        ("server", "hosts"),
        ("server", "port"),
        ("server", "api_key"),
    }
)


def _reserved(option: Option) -> bool:
    return option.dest in _RESERVED_DESTS or option.dest[0] == "router"


def _long(option: Option) -> str:
    return next(flag for flag in option.flags if flag.startswith("--"))


def inherited_flags(cli_values: Mapping[str, str | list[str]]) -> tuple[str, ...]:
    """The router's command-line flags a child repeats (``--flag=value``), from ``Option.key`` → text.

    A repeatable option's values (a list) are repeated, one flag each, in order.
    """
    flags: list[str] = []
    for option in OPTIONS:
        if option.key not in cli_values or _reserved(option):
            continue
        value = cli_values[option.key]
        flags.extend(f"{_long(option)}={text}" for text in ([value] if isinstance(value, str) else value))
    return tuple(flags)


def extra_args(value: Any) -> tuple[str, ...]:
    """``extra_args`` of ``POST /models/load``: a ``bubo serve`` command line setting nothing the router sets.

    Each argument is read by ``bubo serve``'s own parser (no abbreviations; ``-aNAME``
    and ``--flag=value`` are the flag they spell), so no spelling of a reserved flag
    passes; the values themselves are the child's to check.

    Raises:
        InvalidRequest: not an array of strings, a reserved flag (``param`` names the element), or a
            command line ``bubo serve`` refuses.

    """
    if not isinstance(value, list):
        raise InvalidRequest("extra_args must be an array of strings", param="extra_args")
    for index, item in enumerate(value):
        if not isinstance(item, str):
            raise InvalidRequest("extra_args must be an array of strings", param=f"extra_args[{index}]")
        if _sets_reserved(item):
            raise InvalidRequest(
                f"{item} is set by the router for each model and cannot be an extra arg",
                param=f"extra_args[{index}]",
            )
    try:
        serve_flag_values(value)
    except ValueError as error:
        unknown = (i for i, item in enumerate(value) if item.startswith("-") and _parsed(item) is None)
        unknown_at = next(unknown, None)
        raise InvalidRequest(
            f"extra_args is not a bubo serve command line: {error}",
            param="extra_args" if unknown_at is None else f"extra_args[{unknown_at}]",
        ) from error
    return tuple(value)


def _parsed(argument: str) -> dict[str, str | list[str]] | None:
    """What *argument* sets, alone or followed by a value; None when it is no flag of ``bubo serve``."""
    for command_line in ([argument], [argument, "0"]):
        try:
            return serve_flag_values(command_line)
        except ValueError:
            continue
    return None


def _sets_reserved(argument: str) -> bool:
    """Whether *argument*, alone or followed by a value, sets an option the router sets."""
    reserved = {option.key for option in OPTIONS if _reserved(option)}
    return bool(reserved & (_parsed(argument) or {}).keys())


def child_command(
    entry: CatalogEntry, port: int, inherited: Sequence[str], extra: Sequence[str] = ()
) -> tuple[str, ...]:
    """``python -m bubo serve --model=FILE --host=127.0.0.1 --port=PORT --served-model-name=NAME …``.

    The names are the model's and its aliases (the child answers to each); then its tags, its preset's
    flags, the router's own and the load's *extra*, each later one winning (the precedence of
    llama-server's presets: the command line over a model's section over ``[*]``).  Each value is
    attached to its flag, so a file or model name that begins with ``-`` is still a value.
    """
    return (
        sys.executable,
        "-m",
        "bubo",
        "serve",
        f"--model={entry.path}",
        f"--host={CHILD_HOST}",
        f"--port={port}",
        f"--served-model-name={','.join(entry.names)}",
        *((f"--tags={','.join(entry.tags)}",) if entry.tags else ()),
        *entry.args,
        *inherited,
        *extra,
    )


def child_environment(environ: Mapping[str, str], child_key: str, listen_fd: int) -> dict[str, str]:
    """The router's environment with the child's key in place of the router's, and the child's mark.

    It also names the descriptor of the listening socket the router hands the child (``child.py``).
    """
    return {**environ, "BUBO_API_KEY": child_key, ROUTER_CHILD_ENV: "1", LISTEN_FD_ENV: str(listen_fd)}
