"""A pytest plugin (``-p _fake_knob``) that adds a knob to the sampler table before Bubo is imported.

``tests/api/test_sampler_table.py`` runs ``fake_knob_checks.py`` under it in a pytest of its own, so
every class, option and page made from ``domain.samplers.KNOBS`` is made with the extra row.
"""

from __future__ import annotations

import sys

# the table is read as the modules that derive from it are imported: none may be imported yet
assert "bubo.domain.sampling" not in sys.modules, "the fake knob must be added before Bubo is imported"

from bubo.domain import samplers  # noqa: E402 - after the check above

FAKE_KNOB = samplers.Knob(
    name="fake_knob",
    kind=float,
    default=0.25,
    lowest=0.0,
    highest=1.0,
    flags=("--fake-knob",),
    metavar="X",
    help="a knob only the sampler table's test has ({default})",
    ollama="fake_knob_option",
    group="Sampling",
    label="Fake knob",
    step=0.05,
)

samplers.KNOBS = (*samplers.KNOBS, FAKE_KNOB)
