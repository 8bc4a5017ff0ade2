"""Each setting is declared once: its default in the attrs field, its words in a ``Literal`` type.

The help of every flag takes the default from the field (``{default}``), so the two cannot
disagree; a mode's flag accepts exactly its type's words, and the engine's tables cover them.
"""

from __future__ import annotations

import re
import typing

import attrs
import pytest

from bubo.config import DEFAULT, OPTIONS, ConfigError, Option, Settings, load_settings
from bubo.domain.modes import FlashAttention, KvCacheType, Pooling, words

# A default written by hand: a number, a switch or a mode word right after "(" or "default ".
HAND_WRITTEN = re.compile(r"(?:\(|\bdefault )(?:-?\d[\d.]*|on|off|auto)\b")


def _stated(option: Option) -> bool:
    """Whether the option's default is a value a flag could spell (not made by a factory, None or empty)."""
    default = option.default
    return default is not attrs.NOTHING and default is not None and default != ()


def _field(option: Option) -> attrs.Attribute[object]:
    """The attrs field *option* sets, its type resolved."""
    cls: type = Settings
    for name in option.dest[:-1]:
        cls = typing.get_type_hints(cls)[name]
    attrs.resolve_types(cls)
    return attrs.fields_dict(cls)[option.dest[-1]]


@pytest.mark.parametrize("option", OPTIONS, ids=[o.env for o in OPTIONS])
class TestHelp:
    def test_no_default_is_written_by_hand(self, option: Option) -> None:
        """A help text states a default only as {default}, filled in from the field."""
        assert not HAND_WRITTEN.findall(option.help), option.help

    def test_every_default_is_stated_from_its_field(self, option: Option) -> None:
        """A default a flag could spell is in the help, spelled so that the flag reads it back as the default."""
        if option.variant or not _stated(option):  # a variant shares its destination's help; None: in words
            assert DEFAULT not in option.help
            return
        before, after = option.help.split(DEFAULT)
        shown = option.help_text.removeprefix(before).removesuffix(after)
        if option.repeatable:  # each use of the flag gives one value
            values = [text.encode().decode("unicode_escape") for text in shown.split(option.separator)]
            assert option.parse(values) == option.default
        else:
            assert option.parse(shown) == option.default, (shown, option.default)


def test_the_help_shows_the_fields_default() -> None:
    """For example ``--port``: the help says 8080 because ServerSettings.port defaults to 8080."""
    port = next(o for o in OPTIONS if o.dest == ("server", "port"))
    assert port.default == Settings().server.port == 8080
    assert port.help_text == "port to listen on (default 8080)"


def _literal(kind: object) -> object | None:
    """The Literal type *kind* is, or is with None; else None."""
    if typing.get_origin(kind) is typing.Literal:
        return kind
    literals = [k for k in typing.get_args(kind) if typing.get_origin(k) is typing.Literal]
    return literals[0] if len(literals) == 1 else None


MODE_OPTIONS = [o for o in OPTIONS if _literal(_field(o).type) is not None]


def test_the_modes_are_typed() -> None:
    """Every setting chosen from a few words has a Literal type (the ones below, at least)."""
    assert {o.flags[-1] for o in MODE_OPTIONS} >= {
        "--flash-attn",
        "--cache-type-k",
        "--cache-type-v",
        "--pooling",
        "--repack",
        "--draft-policy",
        "--reasoning",
        "--reasoning-format",
        "--model-names",
        "--log-level",
    }


@pytest.mark.parametrize("option", MODE_OPTIONS, ids=[o.env for o in MODE_OPTIONS])
class TestModes:
    def test_every_word_of_the_type_is_accepted(self, option: Option) -> None:
        """The flag takes each word its field's type allows, and the settings hold it as given."""
        for word in words(_literal(_field(option).type)):
            settings = load_settings({option.key: word}, environ={})
            value: object = settings
            for name in option.dest:
                value = getattr(value, name)
            assert value == word

    def test_another_word_is_refused_with_the_flag(self, option: Option) -> None:
        """Any other word is a ConfigError that names the flag and lists the words."""
        long = next(f for f in option.flags if f.startswith("--"))
        with pytest.raises(ConfigError) as caught:
            load_settings({option.key: "nonsense"}, environ={})
        assert str(caught.value) == (
            f"{long}: expected one of {', '.join(words(_literal(_field(option).type)))}, got 'nonsense'"
        )


def test_the_engine_maps_every_word() -> None:
    """The engine's tables from a mode's words to llama.cpp's constants cover the type exactly."""
    from bubo.engine._embedder import POOLING_TYPES
    from bubo.engine._loaded import CACHE_TYPES, FLASH_ATTN
    from bubo.model import KV_CACHE_TYPES

    assert tuple(FLASH_ATTN) == words(FlashAttention)
    assert tuple(CACHE_TYPES) == words(KvCacheType) == tuple(KV_CACHE_TYPES)
    assert tuple(POOLING_TYPES) == words(Pooling)
