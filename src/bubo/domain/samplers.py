"""The sampler table: every numeric sampler knob, declared once.

A :class:`Knob` row says all Bubo knows of one of llama.cpp's numeric sampler
settings: its name (llama-server's, on the wire and in ``/props``), its type,
its default, the range a value must fall in, the flags ``bubo serve`` reads it
from, its key in an Ollama ``options`` object, and how the chat page's settings
show it.

``domain.sampling.SamplingParams`` and ``SamplingOverrides`` declare a field per
knob, by hand so that the type checker sees its type, but nothing more: its
default and its validator (the range) are the row's, through :func:`setting`
and :func:`override`, so the server's defaults and a request's values pass the
same check; ``tests/domain/test_sampler_declarations.py`` checks that the table
and those classes agree.  The rest is made from :data:`KNOBS` when its module
is imported:

- ``config.OPTIONS``' sampler rows (flags, ``BUBO_*`` variable, help);
- ``api._llama_fields.LlamaServerFields`` (the request fields of every
  llama-server-shaped body) and ``api._numbers.sampling_overrides`` (their
  reading);
- ``api.ollama.options`` (which ``options`` keys are samplers, and their JSON type);
- ``api.llamacpp.wire.SamplerSettings`` and ``translate.sampler_settings``
  (``generation_settings`` and ``/props``' ``default_generation_settings``);
- the chat page's sampler fields (``api.webui``'s ``samplers.js``).

The sampler settings that are not single numbers (``seed``, ``logit_bias``,
``dry_sequence_breakers``, ``samplers``) each have a reading of their own and
are declared beside the table, in ``domain.sampling``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import attrs

__all__ = [
    "FLOAT32_MAX",
    "INT32_MAX",
    "INT32_MIN",
    "KNOB",
    "KNOBS",
    "Knob",
    "KnobOutOfRange",
    "knob_named",
    "override",
    "setting",
    "with_knob_fields",
]

T = TypeVar("T")

INT32_MAX = 2**31 - 1
INT32_MIN = -(2**31)
FLOAT32_MAX = 3.4028234663852886e38
"""llama.cpp takes counts and ``top_k`` as 32-bit integers, every other sampler setting as a 32-bit float."""


class KnobOutOfRange(ValueError):
    """A knob's value outside its range; ``str()`` says the range, ``knob`` names the knob."""

    def __init__(self, knob: str, message: str) -> None:
        super().__init__(message)
        self.knob = knob


def _shown(value: float) -> str:
    return f"{value:.8g}" if isinstance(value, float) else str(value)


@attrs.frozen(kw_only=True)
class Knob:
    """One numeric sampler setting (llama.cpp's name and meaning).

    ``lowest`` is accepted unless ``above_lowest``; ``highest`` always is.  ``flags``
    are ``bubo serve``'s (llama-server's spellings), ``help`` states the default
    as ``{default}``.  ``ollama`` is the key of Ollama's ``options`` that sets it
    (None: Ollama has none).  ``openai``: OpenAI's bodies have the field of their
    own (with OpenAI's meaning), so it is not one of llama-server's extensions.
    ``group``, ``label`` and ``step`` place it in the chat page's settings.
    """

    name: str
    kind: type[int | float]
    default: float
    lowest: float
    highest: float
    above_lowest: bool = False
    flags: tuple[str, ...]
    metavar: str
    help: str
    ollama: str | None = None
    openai: bool = False
    group: str
    label: str
    step: float

    @property
    def optional_type(self) -> Any:
        """The type of a field of this knob that may be None (a request's: "keep the server's")."""
        return self.kind | None

    def check(self, value: float) -> None:
        """Nothing if *value* is in range.

        Raises:
            KnobOutOfRange: it is not (the message names the knob and its range).

        """
        low_ok = self.lowest < value if self.above_lowest else self.lowest <= value
        if not low_ok or value > self.highest:
            floor = "greater than" if self.above_lowest else "at least"
            raise KnobOutOfRange(
                self.name,
                f"{self.name} must be {floor} {_shown(self.lowest)} and at most {_shown(self.highest)}, "
                f"got {_shown(value)}",
            )

    def validator(self, *, optional: bool) -> Callable[[Any, Any, Any], None]:
        """The attrs validator of the knob's field (an *optional* one lets None through)."""

        def check(_instance: object, _attribute: object, value: float | None) -> None:
            if value is None and optional:
                return
            self.check(value)  # type: ignore[arg-type]  # None is refused: a knob is a number

        return check


def _knob(name: str, kind: type[int | float], default: float, **rest: Any) -> Knob:
    """A row of the table; its range, unless given, is what llama.cpp's 32-bit int or float holds."""
    lowest, highest = (INT32_MIN, INT32_MAX) if kind is int else (-FLOAT32_MAX, FLOAT32_MAX)
    return Knob(name=name, kind=kind, default=default, **{"lowest": lowest, "highest": highest, **rest})


_SAMPLING, _PENALTIES, _DRY, _XTC, _MIROSTAT = "Sampling", "Penalties", "DRY", "XTC", "Mirostat"

KNOBS: tuple[Knob, ...] = (
    _knob("temperature", float, 0.8, flags=("--temp",), metavar="T", help="default temperature ({default})",
          ollama="temperature", openai=True, group=_SAMPLING, label="Temperature", step=0.05),
    _knob("top_k", int, 40, flags=("--top-k",), metavar="N", help="default top-k ({default}; 0 disables)",
          ollama="top_k", group=_SAMPLING, label="Top-k", step=1),
    _knob("top_p", float, 0.95, lowest=0.0, highest=1.0, flags=("--top-p",), metavar="P",
          help="default top-p ({default})", ollama="top_p", openai=True, group=_SAMPLING, label="Top-p",
          step=0.01),
    _knob("min_p", float, 0.05, lowest=0.0, highest=1.0, flags=("--min-p",), metavar="P",
          help="default min-p ({default})", ollama="min_p", group=_SAMPLING, label="Min-p", step=0.01),
    # llama.h: "must be > 0.0" (it divides by it)
    _knob("repeat_penalty", float, 1.0, lowest=0.0, above_lowest=True, flags=("--repeat-penalty",),
          metavar="X", help="default repetition penalty ({default}: off)", ollama="repeat_penalty",
          group=_PENALTIES, label="Repeat penalty", step=0.01),
    _knob("repeat_last_n", int, 64, lowest=-1, flags=("--repeat-last-n",), metavar="N",
          help="tokens the repetition penalties look back on ({default}; -1: the context)",
          ollama="repeat_last_n", group=_PENALTIES, label="Repeat last n", step=1),
    _knob("presence_penalty", float, 0.0, flags=("--presence-penalty",), metavar="X",
          help="default presence penalty ({default})", ollama="presence_penalty", openai=True,
          group=_PENALTIES, label="Presence penalty", step=0.05),
    _knob("frequency_penalty", float, 0.0, flags=("--frequency-penalty",), metavar="X",
          help="default frequency penalty ({default})", ollama="frequency_penalty", openai=True,
          group=_PENALTIES, label="Frequency penalty", step=0.05),
    _knob("dynatemp_range", float, 0.0, flags=("--dynatemp-range",), metavar="X",
          help="dynamic temperature: sample at temperature ± this, by the entropy ({default}: off)",
          group=_SAMPLING, label="Dynamic temperature range", step=0.05),
    _knob("dynatemp_exponent", float, 1.0, flags=("--dynatemp-exp",), metavar="X",
          help="dynamic temperature exponent ({default})", group=_SAMPLING,
          label="Dynamic temperature exponent", step=0.05),
    _knob("typical_p", float, 1.0, lowest=0.0, highest=1.0, flags=("--typical", "--typical-p"), metavar="P",
          help="default locally typical sampling p ({default}: off)", ollama="typical_p", group=_SAMPLING,
          label="Typical-p", step=0.01),
    _knob("top_n_sigma", float, -1.0, flags=("--top-nsigma", "--top-n-sigma"), metavar="N",
          help="default top-n-sigma: keep tokens within N standard deviations of the top logit "
               "({default}: off)", group=_SAMPLING, label="Top-n σ", step=0.1),  # noqa: RUF001 - sigma
    _knob("xtc_probability", float, 0.0, lowest=0.0, highest=1.0, flags=("--xtc-probability",), metavar="P",
          help="default XTC probability of removing the top choices ({default}: off)", group=_XTC,
          label="XTC probability", step=0.01),
    _knob("xtc_threshold", float, 0.1, lowest=0.0, highest=1.0, flags=("--xtc-threshold",), metavar="P",
          help="default XTC threshold: tokens at least this likely are top choices ({default})", group=_XTC,
          label="XTC threshold", step=0.01),
    # 0 off, 1 Mirostat, 2 Mirostat 2.0
    _knob("mirostat", int, 0, lowest=0, highest=2, flags=("--mirostat",), metavar="N",
          help="default Mirostat: 0 off, 1 Mirostat, 2 Mirostat 2.0; it replaces the other samplers "
               "({default})", ollama="mirostat", group=_MIROSTAT, label="Mirostat (0, 1 or 2)", step=1),
    _knob("mirostat_eta", float, 0.1, flags=("--mirostat-lr",), metavar="X",
          help="default Mirostat learning rate, eta ({default})", ollama="mirostat_eta", group=_MIROSTAT,
          label="Mirostat η", step=0.01),
    _knob("mirostat_tau", float, 5.0, flags=("--mirostat-ent",), metavar="X",
          help="default Mirostat target entropy, tau ({default})", ollama="mirostat_tau", group=_MIROSTAT,
          label="Mirostat τ", step=0.1),
    _knob("dry_multiplier", float, 0.0, flags=("--dry-multiplier",), metavar="X",
          help="default DRY (don't repeat yourself) multiplier ({default}: off)", group=_DRY,
          label="DRY multiplier", step=0.05),
    # below 1 turns DRY off, as in llama.cpp
    _knob("dry_base", float, 1.75, flags=("--dry-base",), metavar="X", help="default DRY base ({default})",
          group=_DRY, label="DRY base", step=0.05),
    _knob("dry_allowed_length", int, 2, lowest=0, flags=("--dry-allowed-length",), metavar="N",
          help="repeats this long are not penalised by DRY ({default})", group=_DRY,
          label="DRY allowed length", step=1),
    _knob("dry_penalty_last_n", int, -1, lowest=-1, flags=("--dry-penalty-last-n",), metavar="N",
          help="tokens DRY looks back on ({default}: the context, 0: off)", group=_DRY,
          label="DRY penalty last n", step=1),
)  # fmt: skip
"""Every numeric sampler knob, in the order ``--help``, ``/props`` and the chat page list them."""


KNOB = "knob"
"""The metadata key of a field :func:`setting` or :func:`override` made: the name of its knob."""


def knob_named(name: str) -> Knob:
    """The row of :data:`KNOBS` named *name* (read as it is called: a test may add a row before import).

    Raises:
        KeyError: the table has no such knob.

    """
    row = next((knob for knob in KNOBS if knob.name == name), None)
    if row is None:
        raise KeyError(f"the sampler table has no knob {name!r}")
    return row


def setting(name: str) -> Any:
    """The attrs field of knob *name* in a complete set of settings: its default, its range the validator.

    The field's type is its annotation, where it is declared (``domain.sampling.SamplingParams``);
    typed ``Any`` as ``attrs.field`` is, to stand for the value of any knob.
    """
    row = knob_named(name)
    return attrs.field(default=row.default, validator=row.validator(optional=False), metadata={KNOB: name})


def with_knob_fields(base: type[T], fields: dict[str, Any]) -> type[T]:
    """*base* (a frozen, keyword-only attrs class) with *fields* added, under its own name, module and doc.

    A wire model with one field per row of :data:`KNOBS`: made from the table, so a row added there
    is a field here with no other declaration.
    """
    made = attrs.make_class(base.__name__.lstrip("_"), fields, bases=(base,), frozen=True, kw_only=True)
    made.__doc__, made.__module__ = base.__doc__, base.__module__
    return made


def override(name: str) -> Any:
    """The attrs field of knob *name* in a request's overrides: None ("keep the server's") or in range."""
    row = knob_named(name)
    return attrs.field(default=None, validator=row.validator(optional=True), metadata={KNOB: name})
