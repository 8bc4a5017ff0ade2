"""A child's command line: the router's flags less its own and the child's address."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from bubo.cli import _parser
from bubo.config import OPTIONS, Option
from bubo.errors import InvalidRequest
from bubo.router.catalog import CatalogEntry
from bubo.router.command import (
    EXTRA_ARGS_FLAGS,
    child_command,
    child_environment,
    extra_args,
    inherited_flags,
)


def test_children_inherit_every_flag_but_the_router_s_own() -> None:
    """Model, address, key, --drain-delay and the --models-* flags are the router's; the rest each child repeats."""
    flags = inherited_flags(
        {
            "model__ctx_size": "512",
            "generation__n_predict": "-1",
            "server__api_key": "secret",
            "server__port": "8080",
            "server__hosts": "0.0.0.0",
            "serving__served_model_name": "x",
            "router__models_dir": "/models",
            "router__models_max": "2",
            "server__debug_hooks": "on",
            "server__verbose": "on",  # a child sees the router's loopback address, whoever asks
            "server__drain_delay": "5",  # the router unloads its children itself: they need not wait
        }
    )
    assert flags == ("--debug-hooks=on", "--ctx-size=512", "--n-predict=-1")


def test_a_repeated_flag_is_repeated_for_each_child() -> None:
    """--dry-sequence-breaker given twice reaches each child twice, in order."""
    flags = inherited_flags({"generation__sampling__dry_sequence_breakers": ["\n", ":"]})
    assert flags == ("--dry-sequence-breaker=\n", "--dry-sequence-breaker=:")


def test_the_command_serves_one_file_on_loopback_under_the_model_s_name() -> None:
    """python -m bubo serve --model=FILE --host=127.0.0.1 --port=N --served-model-name=NAME, then the rest."""
    entry = CatalogEntry(name="tiny", path=Path("/m/tiny.gguf"))
    command = child_command(entry, 4321, ("--ctx-size=512",), ("--temp", "0.1"))
    assert command == (
        sys.executable,
        *("-m", "bubo", "serve", "--model=/m/tiny.gguf", "--host=127.0.0.1", "--port=4321"),
        *("--served-model-name=tiny", "--ctx-size=512", "--temp", "0.1"),
    )


def test_a_model_s_projector_is_the_child_s_mmproj() -> None:
    """llama-server's layout: the mmproj file in a model's subdirectory is loaded with that model."""
    entry = CatalogEntry(
        name="gemma", path=Path("/m/gemma/gemma.gguf"), projector=Path("/m/gemma/mmproj.gguf")
    )
    parsed = _parser().parse_args(child_command(entry, 4321, ())[3:])
    assert parsed.model__mmproj == "/m/gemma/mmproj.gguf"


def test_the_router_s_own_projector_is_not_every_child_s() -> None:
    """--mmproj belongs to one model: a router started with it does not hand it to each child."""
    assert inherited_flags({"model__mmproj": "/m/mmproj.gguf", "model__ctx_size": "512"}) == (
        "--ctx-size=512",
    )


def test_a_name_or_file_that_looks_like_a_flag_is_still_the_child_s_value() -> None:
    """bubo serve reads the command back as the model's file and name, even when they begin with '-'."""
    entry = CatalogEntry(name="-tiny", path=Path("-m/-tiny.gguf"))
    parsed = _parser().parse_args(child_command(entry, 4321, ())[3:])
    assert parsed.model__path == "-m/-tiny.gguf"
    assert parsed.serving__served_model_name == "-tiny"


def test_the_child_key_replaces_the_router_s_in_the_environment() -> None:
    """The child requires the router's own key, given in its environment (never on its command line).

    The environment also marks it as a router's child (it stops when the router is gone) and names the
    descriptor of the listening socket the router hands it.
    """
    environment = child_environment({"BUBO_API_KEY": "client-key", "PATH": "/bin"}, "child-key", 7)
    assert environment == {
        "BUBO_API_KEY": "child-key",
        "PATH": "/bin",
        "BUBO_ROUTER_CHILD": "1",
        "BUBO_ROUTER_LISTEN_FD": "7",
    }


def _long(option: Option) -> str:
    return next(flag for flag in option.flags if flag.startswith("--"))


def _allowed(option: Option) -> bool:
    return _long(option) in EXTRA_ARGS_FLAGS


def _spelled(option: Option) -> list[str]:
    """A command line that sets *option*: its long flag, with a value for each word it takes."""
    return [_long(option)] if option.is_switch else [_long(option), *["0"] * option.arity]


@pytest.mark.parametrize(
    ("value", "param"),
    [
        ("--temp 0.1", "extra_args"),
        (["--temp", 0.1], "extra_args[1]"),
        (["--port", "9"], "extra_args[0]"),
        (["-c", "64", "--api-key=x"], "extra_args[2]"),
        (["--models-max=3"], "extra_args[0]"),
        (["--no-models-autoload"], "extra_args[0]"),
        # abbreviations and attached short values spell reserved flags too
        (["--hos=0.0.0.0"], "extra_args[0]"),
        (["-c", "64", "--por=9"], "extra_args[2]"),
        (["-m/other.gguf"], "extra_args[0]"),
        (["--api-ke=zz"], "extra_args[0]"),
        (["-aother"], "extra_args[0]"),
        # flags that name a file or directory, load code or a model, or open the child
        (["--chat-template-file=/home/user/.ssh/id_ed25519"], "extra_args[0]"),
        (["--temp", "0.2", "--chat-template-file", "/etc/passwd"], "extra_args[2]"),
        (["--slot-save-path=/tmp"], "extra_args[0]"),
        (["--cache-dir", "/tmp"], "extra_args[0]"),
        (["--cache-disk-mib=100000"], "extra_args[0]"),
        (["--debug-hooks"], "extra_args[0]"),
        (["--debug-hooks=on"], "extra_args[0]"),
        (["--lora=/tmp/x.gguf"], "extra_args[0]"),
        (["--lora-scaled", "/tmp/x.gguf", "1"], "extra_args[0]"),
        (["-md/tmp/x.gguf"], "extra_args[0]"),
        (["--model-draft", "/tmp/x.gguf"], "extra_args[0]"),
        (["--grammar-file=/etc/passwd"], "extra_args[0]"),
        (["-jf", "/etc/passwd"], "extra_args[0]"),
        (["--cors-origins=*"], "extra_args[0]"),
        (["--webui"], "extra_args[0]"),
        (["--memory-guard=off"], "extra_args[0]"),
        (["--max-body-mib", "4096"], "extra_args[0]"),
        # what bubo serve cannot parse never reaches a child
        (["-c", "64", "--no-such-flag"], "extra_args[2]"),
        (["-c"], "extra_args"),
        (["stray"], "extra_args"),
        (["--help"], "extra_args[0]"),
    ],
)
def test_extra_args_are_strings_and_tuning_flags_only(value: object, param: str) -> None:
    """A bad extra_args is a 400 naming the element."""
    with pytest.raises(InvalidRequest) as caught:
        extra_args(value, trained_context=8192)
    assert caught.value.param == param


@pytest.mark.parametrize("option", [o for o in OPTIONS if not _allowed(o)], ids=_long)
def test_every_option_not_allowed_is_refused_a_new_one_included(option: Option) -> None:
    """The allow-list is the rule: each option of bubo serve that it does not name is a 400 naming it."""
    with pytest.raises(InvalidRequest) as caught:
        extra_args(_spelled(option), trained_context=8192)
    assert caught.value.param == "extra_args[0]"
    assert _long(option) in caught.value.message


@pytest.mark.parametrize("option", [o for o in OPTIONS if _allowed(o)], ids=_long)
def test_every_tuning_flag_is_accepted(option: Option) -> None:
    """Each allowed option, by its long flag, goes to the child as given (the child checks the value)."""
    arguments = _spelled(option)
    assert extra_args(arguments, trained_context=8192) == tuple(arguments)


def test_the_allow_list_names_long_flags_of_bubo_serve() -> None:
    """Each entry is an option's long flag (its first), so a renamed option cannot leave a stale entry."""
    assert {_long(option) for option in OPTIONS} >= EXTRA_ARGS_FLAGS


def test_extra_args_pass_through() -> None:
    """Tuning flags, in any spelling, go to the child as given."""
    arguments = ["-c", "64", "--temp=0.2", "-np", "2", "-t4", "-ctk", "q8_0", "-fa", "on", "--no-kv-unified"]
    assert extra_args(arguments, trained_context=8192) == tuple(arguments)


@pytest.mark.parametrize(
    ("arguments", "trained", "param"),
    [
        (["-c", "8193"], 8192, "extra_args[0]"),
        (["--temp", "1", "--ctx-size=100000"], 8192, "extra_args[2]"),
        (["-c", "512", "-c", "9000"], 8192, "extra_args[2]"),  # the last one is the child's
        (["-c", "-1"], 8192, "extra_args[0]"),
        (["-c", "lots"], 8192, "extra_args[0]"),
        (["-c", "512"], 0, "extra_args[0]"),  # the trained context is unknown: only 0
    ],
)
def test_the_context_is_capped_by_the_model_s_trained_context(
    arguments: list[str], trained: int, param: str
) -> None:
    """--ctx-size asks for at most the model's trained context (from its card)."""
    with pytest.raises(InvalidRequest) as caught:
        extra_args(arguments, trained_context=trained)
    assert caught.value.param == param


@pytest.mark.parametrize(
    ("arguments", "trained"),
    [(["-c", "8192"], 8192), (["-c9000", "-c", "512"], 8192), (["--ctx-size=0"], 0), (["-c", "1"], 2)],
)
def test_a_context_within_the_trained_one_is_accepted(arguments: list[str], trained: int) -> None:
    """Up to the trained context, and 0 (the model's own) always."""
    assert extra_args(arguments, trained_context=trained) == tuple(arguments)
