"""Whether the sampler table and the classes that declare its knobs agree.

``domain.sampling.SamplingParams`` and ``SamplingOverrides`` declare a field per knob by hand (so
the type checker sees each knob's type); the table (``domain.samplers.KNOBS``) stays the one
declaration of what a knob is.  :func:`disagreements` lists every way the two differ: a row
without its field, a field without its row, a field of another type, default or range than its
row's.  Used by ``tests/domain/test_sampler_declarations.py`` and by the fake knob's checks
(``tests/api/fake_knob_checks.py``), which declare the fake knob and find the two agreeing.
"""

from __future__ import annotations

import math
import typing
from collections.abc import Iterable
from typing import Any

import attrs

from bubo.domain.samplers import KNOB, Knob, KnobOutOfRange
from bubo.domain.sampling import SamplingOverrides, SamplingParams

NOT_KNOBS = frozenset({"seed"})
"""The numeric fields that are no knob: ``seed`` (None draws one) has a reading of its own."""


def _numeric(tp: object) -> bool:
    return tp in (int, float, int | None, float | None)


def _outside(knob: Knob) -> tuple[float, float]:
    """The value just below the range (or its lowest, where that is excluded) and just above it."""
    if knob.kind is int:
        below = knob.lowest if knob.above_lowest else knob.lowest - 1
        return below, knob.highest + 1
    below = knob.lowest if knob.above_lowest else math.nextafter(knob.lowest, -math.inf)
    return below, math.nextafter(knob.highest, math.inf)


def _refuses(cls: type, name: str, value: float) -> bool:
    try:
        cls(**{name: value})
    except KnobOutOfRange:
        return True
    return False


def _range_disagreements(cls: type, knob: Knob) -> list[str]:
    """Where *cls*'s field takes a value the row refuses or refuses one the row takes, at the range's ends."""
    inside = [knob.highest] if knob.above_lowest else [knob.lowest, knob.highest]
    wrong = [("refuses", value) for value in inside if _refuses(cls, knob.name, value)]
    wrong += [("takes", value) for value in _outside(knob) if not _refuses(cls, knob.name, value)]
    floor = "above" if knob.above_lowest else "from"
    return [
        f"{cls.__name__}.{knob.name} {verb} {value!r} (the row's range: {floor} {knob.lowest!r} to {knob.highest!r})"
        for verb, value in wrong
    ]


def _field_disagreements(cls: type, knob: Knob, *, optional: bool) -> list[str]:
    fields = attrs.fields_dict(cls)
    if knob.name not in fields:
        return [f"{cls.__name__} has no field {knob.name}"]
    field: attrs.Attribute[Any] = fields[knob.name]
    declared = typing.get_type_hints(cls)[knob.name]
    wanted: object = knob.optional_type if optional else knob.kind
    default = None if optional else knob.default
    found = []
    if field.metadata.get(KNOB) != knob.name:
        found.append(f"{cls.__name__}.{knob.name} is not made from its row (metadata {field.metadata})")
    if declared != wanted:
        found.append(f"{cls.__name__}.{knob.name} is declared {declared}, its row says {wanted}")
    if field.default != default or type(field.default) is not type(default):
        found.append(f"{cls.__name__}.{knob.name} defaults to {field.default!r}, its row to {default!r}")
    if optional and _refuses(cls, knob.name, None):  # type: ignore[arg-type] # None is an override's "keep"
        found.append(f"{cls.__name__}.{knob.name} refuses None")
    return found + _range_disagreements(cls, knob)


def _rowless_fields(cls: type, knobs: Iterable[Knob]) -> list[str]:
    rows = {knob.name for knob in knobs}
    hints = typing.get_type_hints(cls)
    return [
        f"{cls.__name__}.{field.name} ({hints[field.name]}) has no row in the sampler table"
        for field in attrs.fields(cls)
        if _numeric(hints[field.name]) and field.name not in rows | NOT_KNOBS
    ]


def disagreements(
    knobs: Iterable[Knob],
    params: type = SamplingParams,
    overrides: type = SamplingOverrides,
) -> list[str]:
    """Every way *knobs* and the classes that declare them differ; empty when they agree."""
    knobs = tuple(knobs)
    found: list[str] = []
    for cls, optional in ((params, False), (overrides, True)):
        for knob in knobs:
            found += _field_disagreements(cls, knob, optional=optional)
        found += _rowless_fields(cls, knobs)
    return found
