"""``--models-preset FILE``: llama-server's INI file of per-model settings, read for ``bubo serve``.

Each section is a model: a name of ``--models-dir`` gets settings, another name
is a model of its own and needs ``model = PATH`` (relative to the working
directory).  ``[*]`` holds settings for every model, under each model's own.
Keys are ``bubo serve`` flags without their dashes, long or short (``ctx-size``,
``c``, ``no-webui``), or their ``BUBO_*`` variables, or llama-server's
``LLAMA_ARG_*`` variable where it names a flag Bubo has (``LLAMA_ARG_CTX_SIZE``);
a switch reads ``true``/``false`` (``on``/``off``, ``1``/``0``).  Keys of the
preset itself: ``model``, ``alias`` (more names, separated by commas, that
requests may use), ``tags`` (informational), ``load-on-startup``,
``stop-timeout`` (seconds an unloading model may drain before SIGKILL) and
``dedup-cache-models`` (hide the ``--models-dir`` entry of the same file from
``GET /models``).  ``version`` is ignored.  An unknown key, a value ``bubo serve``
refuses, or a flag the router sets for each model is an error naming the section
and the key.
"""

from __future__ import annotations

import configparser
from collections.abc import Mapping
from pathlib import Path

import attrs

from bubo.config import OPTIONS, ConfigError, Option, check_flag_values, serve_flag_values

__all__ = ["GLOBAL_SECTION", "Preset", "read_presets"]

GLOBAL_SECTION = "*"
_TOP = "__top__"  # the keys before the first section (llama-server's ``version = 1``)
_TRUE = frozenset({"true", "1", "on", "yes", "enabled"})
_FALSE = frozenset({"false", "0", "off", "no", "disabled"})
_ALIAS_KEYS = frozenset({"alias", "a", "served-model-name", "BUBO_SERVED_MODEL_NAME", "LLAMA_ARG_ALIAS"})
_TAGS_KEYS = frozenset({"tags", "BUBO_TAGS", "LLAMA_ARG_TAGS"})
_MODEL_KEYS = frozenset({"model", "m", "BUBO_MODEL", "LLAMA_ARG_MODEL"})
# Options the router sets for each model itself: never from a preset.
_RESERVED = frozenset({("server", "hosts"), ("server", "port"), ("server", "api_key")})


@attrs.frozen(kw_only=True)
class Preset:
    """One model's section, with ``[*]``'s settings under its own."""

    name: str
    model: Path | None = None
    args: tuple[str, ...] = ()  # bubo serve flags for its child, ``--flag=value``: [*]'s, then its own
    aliases: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()
    load_on_startup: bool = False
    stop_timeout: float | None = None  # None: the router's --shutdown-timeout
    dedup: bool = False


def read_presets(path: Path) -> tuple[Preset, ...]:
    """The presets of the INI file at *path*, in file order.

    Raises:
        ConfigError: the file cannot be read or parsed, or a key or value is refused.

    """
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"--models-preset: cannot read {path}: {error}") from None
    parser = configparser.ConfigParser(
        interpolation=None, default_section="__none__", strict=False, comment_prefixes=(";", "#")
    )
    parser.optionxform = str  # type: ignore[assignment,method-assign] # keys keep their case (BUBO_*)
    try:
        parser.read_string(f"[{_TOP}]\n{text}", source=str(path))
    except configparser.Error as error:
        raise ConfigError(f"--models-preset {path}: {error.message}") from None
    sections = {name: dict(parser.items(name)) for name in parser.sections() if name != _TOP}
    common = _Section.read(GLOBAL_SECTION, sections.pop(GLOBAL_SECTION, {}), path)
    return tuple(_Section.read(name, keys, path).over(common) for name, keys in sections.items())


@attrs.frozen(kw_only=True)
class _Section:
    name: str
    args: tuple[str, ...] = ()
    values: Mapping[str, str] = attrs.field(factory=dict)  # the preset's own keys, by canonical name

    @classmethod
    def read(cls, name: str, keys: Mapping[str, str], path: Path) -> _Section:
        args: list[str] = []
        values: dict[str, str] = {}
        for key, value in keys.items():
            where = f"--models-preset {path}, [{name}] {key}"
            canonical = _preset_key(key)
            if canonical is not None:
                values[canonical] = value.strip()
            elif key != "version":
                args.append(_flag(key, value.strip(), where))
        try:
            check_flag_values(serve_flag_values(args))
        except (ValueError, ConfigError) as error:
            raise ConfigError(f"--models-preset {path}, [{name}]: {error}") from None
        return cls(name=name, args=tuple(args), values=values)

    def over(self, common: _Section) -> Preset:
        """The section's preset, with *common*'s (``[*]``) settings under its own."""
        values = {**common.values, **self.values}
        where = f"[{self.name}]"
        model = values.get("model")
        return Preset(
            name=self.name,
            model=Path(model).expanduser() if model else None,
            args=(*common.args, *self.args),
            aliases=_names(self.values.get("alias", "")),  # a name is one model's: not from [*]
            tags=_names(values.get("tags", "")),
            load_on_startup=_truth(values.get("load-on-startup", "false"), f"{where} load-on-startup"),
            stop_timeout=_seconds(values["stop-timeout"], where) if "stop-timeout" in values else None,
            dedup=_truth(values.get("dedup-cache-models", "false"), f"{where} dedup-cache-models"),
        )


def _preset_key(key: str) -> str | None:
    """The canonical name of a key the preset itself reads, or None for a flag."""
    if key in _MODEL_KEYS:
        return "model"
    if key in _ALIAS_KEYS:
        return "alias"
    if key in _TAGS_KEYS:
        return "tags"
    if key in ("load-on-startup", "stop-timeout", "dedup-cache-models"):
        return key
    return None


def _flag(key: str, value: str, where: str) -> str:
    """The ``bubo serve`` argument a preset key sets (``--long=value``)."""
    found = _option(key)
    if found is None:
        raise ConfigError(f"{where}: not an option of bubo serve")
    option, off = found
    if option.dest in _RESERVED or option.dest[0] == "router":
        raise ConfigError(f"{where}: set by the router for each model")
    long = next(flag for flag in option.flags if flag.startswith("--"))
    if off and not option.is_switch:  # ``no-mmproj = true``: the option's value is off
        if not _truth(value, where):
            raise ConfigError(f"--models-preset {where}: only true turns it off; leave it out otherwise")
        return f"{long}=off"
    if option.is_switch:
        on = _truth(value, where)
        return f"{long}={'off' if on == off else 'on'}"
    return f"{long}={value}"


def _option(key: str) -> tuple[Option, bool] | None:
    """The option *key* names, and whether it is one of its ``--no-…`` spellings."""
    for option in OPTIONS:
        if key in (option.env, "LLAMA_ARG_" + option.env.removeprefix("BUBO_")):
            return option, False
        dashed = {flag.lstrip("-") for flag in option.flags}
        if key in dashed:
            return option, False
        if key in {flag.lstrip("-") for flag in option.off_flags}:
            return option, True
    return None


def _truth(value: str, where: str) -> bool:
    if value.lower() in _TRUE:
        return True
    if value.lower() in _FALSE:
        return False
    raise ConfigError(f"--models-preset {where}: expected true or false, got {value!r}")


def _seconds(value: str, where: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not seconds >= 0:
        raise ConfigError(f"--models-preset {where} stop-timeout: expected seconds, got {value!r}")
    return seconds


def _names(value: str) -> tuple[str, ...]:
    return tuple(dict.fromkeys(n.strip() for n in value.split(",") if n.strip()))
