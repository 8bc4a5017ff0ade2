"""The models of --models-dir are found the way llama-server finds them."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from bubo.router.catalog import CatalogEntry, scan_models_dir


def _gguf(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"GGUF")
    return path


def test_single_files_are_named_by_their_stem(tmp_path: Path) -> None:
    """NAME.gguf is the model NAME; other files are not models."""
    a = _gguf(tmp_path / "Qwen3-8B-Q4_K_M.gguf")
    b = _gguf(tmp_path / "llama-3.2-1b.gguf")
    (tmp_path / "README.md").write_text("not a model")
    assert scan_models_dir(tmp_path) == (
        CatalogEntry(name="Qwen3-8B-Q4_K_M", path=a),
        CatalogEntry(name="llama-3.2-1b", path=b),
    )


def test_a_subdirectory_is_one_model_loaded_from_its_first_shard(tmp_path: Path) -> None:
    """A multi-file model lives in a folder named after it; its first shard is what loads."""
    folder = tmp_path / "big-model"
    _gguf(folder / "big-model-00002-of-00002.gguf")
    first = _gguf(folder / "big-model-00001-of-00002.gguf")
    assert scan_models_dir(tmp_path) == (CatalogEntry(name="big-model", path=first),)


def test_a_projector_is_noted_but_never_the_model(tmp_path: Path) -> None:
    """mmproj files are multimodal projectors: beside a model, never a model of their own."""
    folder = tmp_path / "gemma-3-4b-it"
    weights = _gguf(folder / "gemma-3-4b-it-Q8_0.gguf")
    projector = _gguf(folder / "mmproj-F16.gguf")
    _gguf(tmp_path / "mmproj-stray.gguf")
    assert scan_models_dir(tmp_path) == (
        CatalogEntry(name="gemma-3-4b-it", path=weights, projector=projector),
    )


def test_folders_without_weights_are_skipped(tmp_path: Path) -> None:
    """An empty folder, or one with only a projector, is no model."""
    (tmp_path / "empty").mkdir()
    _gguf(tmp_path / "only-projector" / "mmproj-F16.gguf")
    assert scan_models_dir(tmp_path) == ()


def test_a_name_with_a_comma_is_skipped_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """--served-model-name splits on commas, so a,b.gguf could not be served under its name."""
    _gguf(tmp_path / "a,b.gguf")
    _gguf(tmp_path / "c,d" / "weights.gguf")
    kept = _gguf(tmp_path / "e.gguf")
    with caplog.at_level(logging.WARNING, logger="bubo.router.catalog"):
        assert scan_models_dir(tmp_path) == (CatalogEntry(name="e", path=kept),)
    assert sum("a,b.gguf" in r.getMessage() for r in caplog.records) == 1
    assert sum("c,d" in r.getMessage() for r in caplog.records) == 1
