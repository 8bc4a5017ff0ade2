"""The command line and environment of a model's child ``bubo serve``.

A child inherits the router's flags (those that are not the router's own or
the child's address) and its environment, as llama-server's instances do; it
listens on 127.0.0.1 only, on the socket the router bound for it (``child.py``),
and requires the router's own key, which travels in the environment
(``BUBO_API_KEY``), never on the command line.  ``POST /models/load`` may add
``extra_args`` (``--models-allow-extra-args``): tuning flags only
(:data:`EXTRA_ARGS_FLAGS`), never one that names a file, loads code or opens
the child to anyone.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Any

from bubo.config import OPTIONS, Option, serve_flag_values
from bubo.errors import InvalidRequest

from .catalog import CatalogEntry
from .child import LISTEN_FD_ENV, ROUTER_CHILD_ENV

__all__ = [
    "CHILD_HOST",
    "EXTRA_ARGS_FLAGS",
    "child_command",
    "child_environment",
    "extra_args",
    "inherited_flags",
]

CHILD_HOST = "127.0.0.1"
# Set by the router for each child; the router's own value of these never reaches a child.
_RESERVED_DESTS = frozenset(
    {
        ("model", "path"),
        ("model", "mmproj"),  # each model's own projector, found beside it (or its preset's)
        ("serving", "served_model_name"),
        ("server", "hosts"),
        ("server", "port"),
        ("server", "api_key"),
        ("server", "drain_delay"),  # the router stops its children itself: they need not wait for it
        ("server", "verbose"),  # a child sees the router's loopback address, whoever the client is
    }
)


# What ``extra_args`` of ``POST /models/load`` may set (``--models-allow-extra-args``): tuning only, each
# option named by its long flag (every spelling of it is meant).  Never a flag that names a file or
# directory, loads code or a model, changes who may connect, what is served or the server's limits:
# an option not listed here, a new one included, is refused.  docs/router.md lists these.
EXTRA_ARGS_FLAGS = frozenset(
    {
        # sampling and generation defaults
        *("--temp", "--top-k", "--top-p", "--min-p", "--typical", "--top-nsigma", "--seed", "--n-predict"),
        *("--repeat-penalty", "--repeat-last-n", "--presence-penalty", "--frequency-penalty", "--keep"),
        *("--dynatemp-range", "--dynatemp-exp", "--xtc-probability", "--xtc-threshold"),
        *("--mirostat", "--mirostat-lr", "--mirostat-ent", "--samplers", "--sampler-seq"),
        *("--dry-multiplier", "--dry-base", "--dry-allowed-length", "--dry-penalty-last-n"),
        "--dry-sequence-breaker",
        # reasoning defaults
        *("--reasoning", "--reasoning-format", "--reasoning-budget", "--reasoning-preserve"),
        "--prefill-assistant",
        # prompt-lookup drafting (never a draft model)
        *("--draft-max", "--draft-min", "--draft-p-min", "--draft-ngram-min", "--draft-policy"),
        # context (under the model's trained context: extra_args), slots, KV cache, batches, threads
        *("--ctx-size", "--parallel", "--kv-unified", "--slot-prompt-similarity", "--context-shift"),
        *("--cache-type-k", "--cache-type-v", "--flash-attn", "--cache-reuse", "--cache-idle-slots"),
        *("--batch-size", "--ubatch-size", "--prefill-chunk", "--prefill-gap-ms"),
        *("--threads", "--threads-batch", "--n-gpu-layers", "--courier"),
    }
)


def _reserved(option: Option) -> bool:
    return option.dest in _RESERVED_DESTS or option.dest[0] == "router"


def _long(option: Option) -> str:
    return next(flag for flag in option.flags if flag.startswith("--"))


_EXTRA_ARGS_KEYS = frozenset(option.key for option in OPTIONS if _long(option) in EXTRA_ARGS_FLAGS)
_CTX_SIZE = next(option for option in OPTIONS if option.dest == ("model", "ctx_size"))


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


def extra_args(value: Any, trained_context: int = 0) -> tuple[str, ...]:
    """``extra_args`` of ``POST /models/load``: a ``bubo serve`` command line of tuning flags only.

    Each argument is read by ``bubo serve``'s own parser (no abbreviations; ``-aNAME``
    and ``--flag=value`` are the flag they spell), and every option it sets must be
    one of :data:`EXTRA_ARGS_FLAGS`; ``--ctx-size`` may ask for at most
    *trained_context* tokens (the model's, from its card; 0 when unknown: only
    ``--ctx-size 0``, the model's own).  The other values are the child's to check.

    Raises:
        InvalidRequest: not an array of strings, a flag that is not a tuning flag (``param`` names
            the element), a context over the cap, or a command line ``bubo serve`` refuses.

    """
    if not isinstance(value, list):
        raise InvalidRequest("extra_args must be an array of strings", param="extra_args")
    for index, item in enumerate(value):
        if not isinstance(item, str):
            raise InvalidRequest("extra_args must be an array of strings", param=f"extra_args[{index}]")
        refused = _refused(_parsed(item) or {})
        if refused is not None:
            raise _not_allowed(item, refused, f"extra_args[{index}]")
    try:
        values = serve_flag_values(value)
    except ValueError as error:
        unknown = (i for i, item in enumerate(value) if item.startswith("-") and _parsed(item) is None)
        unknown_at = next(unknown, None)
        raise InvalidRequest(
            f"extra_args is not a bubo serve command line: {error}",
            param="extra_args" if unknown_at is None else f"extra_args[{unknown_at}]",
        ) from error
    refused = _refused(values)
    if refused is not None:  # set by no single element alone: refused all the same
        raise _not_allowed(" ".join(value), refused, "extra_args")
    if _CTX_SIZE.key in values:
        _check_context(value, values[_CTX_SIZE.key], trained_context)
    return tuple(value)


def _parsed(argument: str) -> dict[str, str | list[str]] | None:
    """What *argument* sets, alone or followed by its values; None when it is no flag of ``bubo serve``."""
    for command_line in ([argument], [argument, "0"], [argument, "0", "0"]):
        try:
            return serve_flag_values(command_line)
        except ValueError:
            continue
    return None


def _refused(values: Mapping[str, object]) -> Option | None:
    """The first option *values* (``Option.key`` → text) sets that ``extra_args`` may not set."""
    return next((o for o in OPTIONS if o.key in values and o.key not in _EXTRA_ARGS_KEYS), None)


def _not_allowed(argument: str, option: Option, param: str) -> InvalidRequest:
    if _reserved(option):
        why = "is set by the router for each model"
    else:
        why = "is not a tuning flag: extra_args may set only those docs/router.md lists"
    return InvalidRequest(f"{argument} ({_long(option)}) {why}", param=param)


def _check_context(arguments: list[str], text: str | list[str], trained_context: int) -> None:
    """``--ctx-size`` within 0 … *trained_context* (only 0 when the trained context is unknown)."""
    at = max((i for i, item in enumerate(arguments) if _CTX_SIZE.key in (_parsed(item) or {})), default=None)
    param = "extra_args" if at is None else f"extra_args[{at}]"
    try:
        tokens = _CTX_SIZE.parse(text)
    except ValueError as error:
        raise InvalidRequest(f"--ctx-size: {error}", param=param) from None
    if tokens == 0:
        return
    if trained_context <= 0:
        raise InvalidRequest(
            f"--ctx-size {tokens}: the model's trained context is unknown, so extra_args may only give 0 "
            "(the model's own)",
            param=param,
        )
    if not 0 < tokens <= trained_context:
        raise InvalidRequest(
            f"--ctx-size {tokens}: extra_args may ask for 0 to {trained_context} tokens, the model's trained "
            "context",
            param=param,
        )


def child_command(
    entry: CatalogEntry, port: int, inherited: Sequence[str], extra: Sequence[str] = ()
) -> tuple[str, ...]:
    """``python -m bubo serve --model=FILE --host=127.0.0.1 --port=PORT --served-model-name=NAME …``.

    The names are the model's and its aliases (the child answers to each); then the projector in its
    subdirectory (``--mmproj``; a preset's ``mmproj`` or ``no-mmproj`` comes later and wins), its
    tags, its preset's flags, the router's own and the load's *extra*, each later one winning (the
    precedence of llama-server's presets: the command line over a model's section over ``[*]``).
    Each value is attached to its flag, so a file or model name that begins with ``-`` is still a
    value.
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
        *((f"--mmproj={entry.projector}",) if entry.projector is not None else ()),
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
