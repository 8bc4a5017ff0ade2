"""The sampler table (``domain/samplers.py``) is the one declaration of a knob.

A knob is a row of the table and a typed field in each of ``SamplingParams`` and
``SamplingOverrides`` whose default and range are the row's (without the fields the row is a
disagreement: ``tests/domain/test_sampler_declarations.py``).  With those two lines and nothing else,
it reaches config, the request bodies and their reading, Ollama's options, ``generation_settings``,
``/props`` and the chat page: ``fake_knob_checks.py`` checks it in a pytest of its own, over a copy
of Bubo's source with the two fields declared, the plugin ``_fake_knob.py`` adding the row before
Bubo is imported (what is made from the table is made at import, so this process's cannot grow one).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import attrs
import pytest
from quart_trio import QuartTrio

import bubo
from bubo.api._llama_fields import LlamaServerFields
from bubo.api.llamacpp.wire import SamplerSettings
from bubo.config import OPTIONS, ConfigError, load_settings, serve_flag_values
from bubo.domain.samplers import KNOBS
from bubo.domain.sampling import SamplingOverrides, SamplingParams

HERE = Path(__file__).parent
CHECKS = 12  # the tests fake_knob_checks.py collects, each parameter apart
SEED = "    seed: int | None = None\n"
"""The line before which the fake knob's fields are declared, in SamplingParams and then SamplingOverrides."""
DECLARATIONS = (
    '    fake_knob: float = setting("fake_knob")\n',
    '    fake_knob: float | None = override("fake_knob")\n',
)


def declare_the_fake_knob(package: Path) -> None:
    """Add the fake knob's field to each class of *package*'s ``domain/sampling.py``, as a developer would."""
    sampling = package / "domain" / "sampling.py"
    before, params, overrides = sampling.read_text().split(SEED)  # one seed field per class
    sampling.write_text(before + DECLARATIONS[0] + SEED + params + DECLARATIONS[1] + SEED + overrides)


def test_a_knob_added_to_the_table_and_declared_is_found_everywhere(tmp_path: Path) -> None:
    package = tmp_path / "bubo"
    shutil.copytree(Path(bubo.__file__).parent, package, ignore=shutil.ignore_patterns("__pycache__"))
    declare_the_fake_knob(package)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(HERE)])}
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


@pytest.mark.parametrize(("knob", "value"), [("repeat_penalty", "0"), ("top_p", "1.5"), ("mirostat", "3")])
async def test_the_server_default_and_a_request_share_the_range(
    app: QuartTrio, knob: str, value: str
) -> None:
    """``bubo serve --repeat-penalty 0`` is refused as a request sending 0 is, with the same words."""
    flag = next(option.flags[0] for option in OPTIONS if option.dest == ("generation", "sampling", knob))
    with pytest.raises(ConfigError) as flagged:
        load_settings(serve_flag_values([flag, value]), environ={})
    body = {"model": "bubo", "messages": [{"role": "user", "content": "Hi"}], knob: json.loads(value)}
    response = await app.test_client().post("/v1/chat/completions", json=body)
    assert response.status_code == 400
    error = (await response.get_json())["error"]
    assert error["param"] == knob
    assert str(flagged.value) == f"{flag}: {error['message']}"
