"""The sampler table (``domain/samplers.py``) is the one declaration of a knob.

A knob added to the table alone reaches config, the request bodies and their reading, Ollama's
options, ``generation_settings``, ``/props`` and the chat page: ``fake_knob_checks.py`` checks it in a
pytest of its own, with the plugin ``_fake_knob.py`` adding the row before Bubo is imported (the
derived classes are made at import, so this process's cannot grow one).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import attrs

import bubo
from bubo.api._llama_fields import LlamaServerFields
from bubo.api.llamacpp.wire import SamplerSettings
from bubo.config import OPTIONS
from bubo.domain.samplers import KNOBS
from bubo.domain.sampling import SamplingOverrides, SamplingParams

HERE = Path(__file__).parent
CHECKS = 11  # the tests fake_knob_checks.py collects, each parameter apart


def test_a_knob_added_to_the_table_is_found_everywhere() -> None:
    source = Path(bubo.__file__).parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(source), str(HERE)])}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "_fake_knob", "-p", "no:cacheprovider", "-q",
         str(HERE / "fake_knob_checks.py")],
        cwd=HERE.parents[1], env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert f"{CHECKS} passed" in result.stdout, result.stdout[-4000:]


def test_every_knob_is_in_each_derived_declaration() -> None:
    """Without the fake knob: each knob is a field of the domain's classes, an option and a /props field."""
    names = [knob.name for knob in KNOBS]
    assert len(set(names)) == len(names)
    for cls in (SamplingParams, SamplingOverrides, SamplerSettings):
        assert set(names) <= set(attrs.fields_dict(cls))
    assert {knob.name for knob in KNOBS if not knob.openai} <= set(attrs.fields_dict(LlamaServerFields))
    assert {option.dest[-1] for option in OPTIONS if option.dest[:2] == ("generation", "sampling")} >= set(
        names
    )


def test_the_defaults_are_in_range() -> None:
    for knob in KNOBS:
        knob.check(knob.default)
        assert isinstance(knob.default, knob.kind), knob.name
