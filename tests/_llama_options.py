"""The engine's options for tests that load llama.cpp themselves.

``LlamaOptions`` has no defaults (a setting's default lives in ``config.py``), so a test starts from
what ``bubo serve`` with no flags would load, through the loader's own ``llama_options``, and then
sets what it is about.  :data:`TEST_CHOICES` are the engine tests' own, kept small for a shared
two-core machine: two threads, one slot, 1 GiB of RAM snapshots, no drafting.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs

from bubo.config import Settings
from bubo.engine.llama import DraftOptions, LlamaEngine, LlamaOptions, load_llama_engine
from bubo.loader import llama_options

TEST_CHOICES: dict[str, Any] = {
    "n_threads": 2,
    "n_parallel": 1,
    "cache_ram_mib": 1024,
    "drafting": DraftOptions(draft_max=0),
}


def engine_options(*, model_path: Path, **changes: Any) -> LlamaOptions:
    """The options ``bubo serve`` gives *model_path* with no flags, :data:`TEST_CHOICES` and *changes* over them."""
    served = llama_options(Settings(), model_path, cache_ram_mib=0, lora=())
    return attrs.evolve(served, **{**TEST_CHOICES, **changes})


@contextlib.contextmanager
def loaded_engine(*, model_path: Path, **changes: Any) -> Iterator[LlamaEngine]:
    """A llama.cpp engine loaded with :func:`engine_options` (*model_path*, *changes*), closed after the block."""
    engine = load_llama_engine(engine_options(model_path=model_path, **changes))
    try:
        yield engine
    finally:
        engine.close()
