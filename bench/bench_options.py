"""The engine's options for a benchmark that loads llama.cpp in-process.

``LlamaOptions`` has no defaults (a setting's default lives in ``config.py``), so a benchmark
starts from what ``bubo serve`` with no flags would load, through the loader's own
``llama_options`` over ``Settings()``, and then sets what it measures.  :data:`BENCH_CHOICES` are
the choices every in-process benchmark shares unless it says otherwise, written once: two
threads, one slot, 1 GiB of RAM snapshots, no drafting (the engine's defaults these scripts were
written against, so each loads what it loaded before).

Each in-process script exposes ``parser()`` and ``engine_options(args)`` (every engine its run
loads, by name) so that ``tests/test_bench_scripts.py`` builds them for the default arguments
without loading a model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs

from bubo.config import Settings
from bubo.engine.llama import DraftOptions, LlamaOptions
from bubo.loader import llama_options

BENCH_CHOICES: dict[str, Any] = {
    "n_threads": 2,
    "n_parallel": 1,
    "cache_ram_mib": 1024,
    "drafting": DraftOptions(draft_max=0),
}


def bench_options(model_path: Path, **changes: Any) -> LlamaOptions:
    """What ``bubo serve`` loads *model_path* with (no flags), :data:`BENCH_CHOICES` and *changes* over it."""
    served = llama_options(Settings(), model_path, cache_ram_mib=0, lora=())
    return attrs.evolve(served, **{**BENCH_CHOICES, **changes})
