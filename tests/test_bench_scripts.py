"""bench/'s scripts still start: each imports, and each in-process one builds its engines' options.

The benchmarks are never part of the test run (they take minutes and load models), so a change to
the engine's options or to what ``bubo.engine`` exports broke them unnoticed.  Here, without
loading a model: every script under bench/ imports (as its ``python bench/NAME.py`` does, from
bench/ itself); every script that loads the engine in-process exposes ``parser()`` and
``engine_options(args)`` (see bench/bench_options.py), and for its default arguments those build
``LlamaOptions`` for the default model; and its ``main()`` reaches its first load (the repack probe
or ``load_llama_engine``, replaced here by a stand-in that stops the run) with one of those options;
and none of them silences ruff's check of private attributes (what it reads of the engine once loaded,
``engine.current.context``, is public: a reach into the engine's internals broke at the first load).
"""

from __future__ import annotations

import importlib
import inspect
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import trio

from bubo.engine.llama import LlamaOptions

BENCH = Path(__file__).resolve().parents[1] / "bench"
SCRIPTS = sorted(
    p.stem for p in BENCH.glob("*.py") if p.stem != "conftest" and not p.stem.startswith("test_")
)
IN_PROCESS = [name for name in SCRIPTS if "load_llama_engine(" in (BENCH / f"{name}.py").read_text()]
FIRST_LOADS = (
    "load_llama_engine",
    "decide_repack",
)  # what an in-process script's main calls first with options


class FirstLoad(Exception):
    """Raised by the stand-in for the first call that would load the model, with its options."""

    def __init__(self, options: LlamaOptions) -> None:
        super().__init__(options)
        self.options = options


def bench_module(name: str, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """bench/NAME.py imported as its script imports its siblings: with bench/ first on the path."""
    monkeypatch.syspath_prepend(str(BENCH))
    return importlib.import_module(name)


def extra_arguments(name: str, tmp_path: Path) -> dict[str, Any]:
    """What a script's ``engine_options`` takes beside its arguments (disk_restore: its snapshot folder)."""
    return {"disk_dir": tmp_path} if name == "disk_restore" else {}


def test_the_in_process_scripts_are_found() -> None:
    assert {"repack", "kv_cache_types", "prefill_chunk", "draft_model", "disk_restore", "idle_slots"} <= set(
        IN_PROCESS
    )


@pytest.mark.parametrize("name", SCRIPTS)
def test_every_bench_script_imports(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    module = bench_module(name, monkeypatch)
    assert module.__file__ == str(BENCH / f"{name}.py")


@pytest.mark.parametrize("name", IN_PROCESS)
def test_no_private_reach_into_the_engine(name: str) -> None:
    """ruff's SLF001 (bench/ is linted) flags a private attribute: an in-process script may not silence it.

    The engine's internals change under it (``engine._context`` went); its public ``current.context`` stays.
    """
    assert "SLF001" not in (BENCH / f"{name}.py").read_text()


@pytest.mark.parametrize("name", IN_PROCESS)
def test_default_arguments_build_engine_options(
    name: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, model_path: Path
) -> None:
    module = bench_module(name, monkeypatch)
    args = module.parser().parse_args([])
    loads = module.engine_options(args, **extra_arguments(name, tmp_path))
    assert loads
    for options in loads.values():
        assert isinstance(options, LlamaOptions)
        assert options.model_path == model_path


@pytest.mark.parametrize("name", IN_PROCESS)
def test_main_reaches_its_first_load_with_those_options(
    name: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    module = bench_module(name, monkeypatch)

    def stop(*args: object, **_kwargs: object) -> None:
        raise FirstLoad(next(a for a in args if isinstance(a, LlamaOptions)))

    replaced = [call for call in FIRST_LOADS if hasattr(module, call)]
    assert replaced
    for call in replaced:
        monkeypatch.setattr(module, call, stop)
    monkeypatch.setattr(sys, "argv", [f"{name}.py"])
    run = (lambda: trio.run(module.main)) if inspect.iscoroutinefunction(module.main) else module.main
    with pytest.raises(FirstLoad) as stopped:
        run()
    built = module.engine_options(module.parser().parse_args([]), **extra_arguments(name, tmp_path))
    assert stopped.value.options in built.values()
