"""A child's command line: the router's flags less its own and the child's address."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from bubo.cli import _parser
from bubo.errors import InvalidRequest
from bubo.router.catalog import CatalogEntry
from bubo.router.command import child_command, child_environment, extra_args, inherited_flags


def test_children_inherit_every_flag_but_the_router_s_own() -> None:
    """Model, address, key and the --models-* flags are the router's; the rest each child repeats."""
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
        # what bubo serve cannot parse never reaches a child
        (["-c", "64", "--no-such-flag"], "extra_args[2]"),
        (["-c"], "extra_args"),
        (["stray"], "extra_args"),
        (["--help"], "extra_args[0]"),
    ],
)
def test_extra_args_are_strings_and_never_the_router_s_flags(value: object, param: str) -> None:
    """A bad extra_args is a 400 naming the element."""
    with pytest.raises(InvalidRequest) as caught:
        extra_args(value)
    assert caught.value.param == param


def test_extra_args_pass_through() -> None:
    """Any other flag goes to the child as given (the child validates it)."""
    assert extra_args(["-c", "64", "--temp=0.2"]) == ("-c", "64", "--temp=0.2")
