"""The sampler table and the classes that declare its knobs agree (``tests/_knob_agreement.py``).

A row of ``domain.samplers.KNOBS`` is the knob; ``SamplingParams`` and ``SamplingOverrides`` declare
a typed field per row whose default and range are the row's.  A row added alone, a field added
without a row, or a field of another type, default or range than its row's is a disagreement.
"""

from __future__ import annotations

import attrs

from bubo.domain.samplers import KNOBS, knob_named, setting
from bubo.domain.sampling import SamplingOverrides, SamplingParams

from .._knob_agreement import disagreements


def test_the_table_and_the_classes_agree() -> None:
    assert disagreements(KNOBS) == []


def test_a_row_added_to_the_table_alone_is_a_disagreement_until_its_fields_are_declared() -> None:
    fake = attrs.evolve(knob_named("top_p"), name="fake_knob", flags=("--fake-knob",))
    assert disagreements((*KNOBS, fake)) == [
        "SamplingParams has no field fake_knob",
        "SamplingOverrides has no field fake_knob",
    ]


def test_a_numeric_field_without_a_row_is_a_disagreement() -> None:
    table = tuple(knob for knob in KNOBS if knob.name != "dry_base")
    assert disagreements(table) == [
        "SamplingParams.dry_base (<class 'float'>) has no row in the sampler table",
        "SamplingOverrides.dry_base (float | None) has no row in the sampler table",
    ]


def test_a_field_of_another_type_default_or_range_than_its_row_is_a_disagreement() -> None:
    @attrs.frozen(kw_only=True)
    class Misdeclared(SamplingParams):
        top_p: int = setting("mirostat")  # an int knob's default and range, under top_p's name
        min_p: float = 0.05  # its row's default, but no range

    found = disagreements(KNOBS, params=Misdeclared)
    assert found[:4] == [
        "Misdeclared.top_p is not made from its row (metadata {'knob': 'mirostat'})",
        "Misdeclared.top_p is declared <class 'int'>, its row says <class 'float'>",
        "Misdeclared.top_p defaults to 0, its row to 0.95",
        "Misdeclared.top_p takes 1.0000000000000002 (the row's range: from 0.0 to 1.0)",
    ]
    assert "Misdeclared.min_p is not made from its row (metadata {})" in found
    assert "Misdeclared.min_p takes 1.0000000000000002 (the row's range: from 0.0 to 1.0)" in found
    assert all(line.startswith(("Misdeclared.top_p", "Misdeclared.min_p")) for line in found)


def test_the_types_are_the_declared_ones_for_the_type_checker_too() -> None:
    """The fields are plain declarations: what attrs made is what the class body says."""
    assert attrs.fields(SamplingParams).top_k.default == 40
    assert attrs.fields(SamplingOverrides).top_k.default is None
    assert SamplingParams().with_overrides(SamplingOverrides(top_k=7)).top_k == 7
