"""LoRA adapter GGUFs the tests write for a real base model, with llama.cpp's own writer (``gguf``).

A real adapter as llama.cpp's ``convert_lora_to_gguf.py`` writes one:
``general.type`` ``adapter``, ``adapter.type`` ``lora``, ``adapter.lora.alpha``,
and for each adapted weight ``<name>.lora_a`` (numpy ``(rank, n_in)``, ggml
``[n_in, rank]``) and ``<name>.lora_b`` (numpy ``(n_out, rank)``).  Its weights
are seeded noise, large enough to change what the model says.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import gguf
import numpy as np

from bubo.model import read_metadata

RANK = 8
DEFAULT_TARGETS = ("attn_q", "attn_v")


def write_lora(
    path: Path,
    base: Path,
    *,
    seed: int = 0,
    targets: Sequence[str] = DEFAULT_TARGETS,
    rank: int = RANK,
    magnitude: float = 0.1,
    edit: Callable[[str, np.ndarray], np.ndarray] | None = None,
    architecture: str | None = None,
) -> Path:
    """Write an adapter for every ``blk.N.<target>.weight`` of *base* to *path*; *edit* may spoil a tensor."""
    metadata = read_metadata(base)
    writer = gguf.GGUFWriter(str(path), architecture or metadata.architecture)
    writer.add_type(gguf.GGUFType.ADAPTER)
    writer.add_string(gguf.Keys.Adapter.TYPE, "lora")
    writer.add_float32(gguf.Keys.Adapter.LORA_ALPHA, float(rank))
    rng = np.random.default_rng(seed)
    for name, info in metadata.tensors.items():
        if not name.startswith("blk.") or name.split(".")[2] not in targets:
            continue
        n_in, n_out = info.shape
        tensors = {
            f"{name}.lora_a": rng.normal(0, magnitude, (rank, n_in)).astype(np.float32),
            f"{name}.lora_b": rng.normal(0, magnitude, (n_out, rank)).astype(np.float32),
        }
        for tensor_name, data in tensors.items():
            writer.add_tensor(tensor_name, edit(tensor_name, data) if edit is not None else data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
