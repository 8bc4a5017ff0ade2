"""Check a LoRA adapter GGUF against its base model before llama.cpp sees it.

llama.cpp's loader (``llama_adapter_lora_init``) refuses most adapters that do
not fit with an error, but not all of them safely: it reads ``general.type``,
``adapter.type`` and ``adapter.lora.alpha`` with accessors that abort the
process on a value of another GGUF type, and it trusts the tensor types it is
given.  So every adapter is read here first, without llama.cpp, and refused
with a message naming the file and the tensor unless llama.cpp will take it:

- ``general.type`` is the string ``adapter``, ``adapter.type`` the string
  ``lora``, ``adapter.lora.alpha`` (if present) a 32-bit float, and
  ``general.architecture`` the base model's;
- every tensor is ``<base tensor>.lora_a`` or ``.lora_b``, in pairs, each named
  after a tensor the base model has, with llama.cpp's shapes in ggml's order:
  ``lora_a`` is ``[n_in, rank]`` and ``lora_b`` ``[rank, n_out]`` for a base
  ``[n_in, n_out]`` (the token embeddings the other way round, as llama.cpp
  reads them);
- each tensor is F32, F16, BF16 or Q8_0 (what llama.cpp's converter writes),
  and its data lies inside the file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

import attrs

from .gguf import GGUFError, GGUFMetadata, TensorInfo, read_metadata

__all__ = ["AdapterInfo", "check_lora_adapter"]

_SUFFIXES: Final = (".lora_a", ".lora_b")
_TOKEN_EMBD: Final = "token_embd.weight"  # noqa: S105 - a tensor's name
# ggml type id -> (block elements, block bytes) for the types an adapter may hold
_TYPES: Final[dict[int, tuple[int, int]]] = {0: (1, 4), 1: (1, 2), 30: (1, 2), 8: (32, 34)}
_TYPE_NAMES: Final = "F32, F16, BF16 or Q8_0"


@attrs.frozen(kw_only=True)
class AdapterInfo:
    """What a checked adapter holds."""

    alpha: float  # 0: llama.cpp applies the scale as given (else scale * alpha / rank)
    n_pairs: int  # base tensors it adapts


def check_lora_adapter(path: Path, base: GGUFMetadata) -> AdapterInfo:
    """Read the adapter at *path* and check it fits the model *base* describes.

    Raises:
        GGUFError: it is not a GGUF file, not a LoRA adapter, or not one for this model (the message says
            which tensor and why).
        OSError: it cannot be read.

    """
    adapter = read_metadata(path)
    _check_kind(path, adapter, base)
    pairs: dict[str, dict[str, TensorInfo]] = {}
    for name, info in adapter.tensors.items():
        suffix = next((s for s in _SUFFIXES if name.endswith(s)), None)
        if suffix is None:
            raise GGUFError(f"{path}: tensor {name!r} is not a LoRA tensor (.lora_a or .lora_b)")
        _check_data(path, adapter, name, info)
        pairs.setdefault(name.removesuffix(suffix), {})[suffix] = info
    for target, pair in pairs.items():
        if len(pair) != 2:
            raise GGUFError(f"{path}: the LoRA pair for {target!r} lacks one of .lora_a and .lora_b")
        model_tensor = base.tensors.get(target)
        if model_tensor is None:
            raise GGUFError(
                f"{path}: the base model has no tensor {target!r} (an adapter for another model?)"
            )
        _check_shapes(path, target, model_tensor.shape, pair[".lora_a"].shape, pair[".lora_b"].shape)
    alpha = adapter.get("adapter.lora.alpha", 0.0)
    return AdapterInfo(alpha=float(alpha), n_pairs=len(pairs))


def _check_kind(path: Path, adapter: GGUFMetadata, base: GGUFMetadata) -> None:
    if adapter.get("general.type") != "adapter":
        raise GGUFError(f"{path} is not an adapter (its general.type is {adapter.get('general.type')!r})")
    if adapter.get("adapter.type") != "lora":
        raise GGUFError(f"{path} is not a LoRA adapter (its adapter.type is {adapter.get('adapter.type')!r})")
    alpha = adapter.get("adapter.lora.alpha")
    if alpha is not None and not adapter.is_f32("adapter.lora.alpha"):
        raise GGUFError(f"{path}: adapter.lora.alpha must be a 32-bit float")
    if adapter.architecture != base.architecture:
        raise GGUFError(
            f"{path} is an adapter for {adapter.architecture or 'no architecture'!r}, "
            f"the model is {base.architecture!r}"
        )
    if not adapter.tensors:
        raise GGUFError(f"{path} holds no LoRA tensors")


def _check_data(path: Path, adapter: GGUFMetadata, name: str, info: TensorInfo) -> None:
    layout = _TYPES.get(info.type)
    if layout is None:
        raise GGUFError(f"{path}: tensor {name!r} has ggml type {info.type}; a LoRA tensor is {_TYPE_NAMES}")
    block, block_bytes = layout
    if len(info.shape) != 2 or min(info.shape) < 1 or info.shape[0] % block:
        raise GGUFError(
            f"{path}: tensor {name!r} has the shape {list(info.shape)}, not a matrix llama.cpp takes"
        )
    size = info.shape[0] // block * block_bytes * info.shape[1]
    if adapter.data_offset + info.offset + size > adapter.file_size:
        raise GGUFError(f"{path}: the data of tensor {name!r} runs past the end of the file (truncated?)")


def _check_shapes(
    path: Path, target: str, model: tuple[int, ...], a: tuple[int, ...], b: tuple[int, ...]
) -> None:
    if len(model) != 2:
        raise GGUFError(f"{path}: {target!r} is not a matrix; LoRA adapts matrices only")
    if target == _TOKEN_EMBD:  # llama.cpp reads these two the other way round (llm_build_inp_embd)
        fits = model[0] == b[1] and model[1] == a[1] and a[0] == b[0]
    else:
        fits = model[0] == a[0] and model[1] == b[1] and a[1] == b[0]
    if not fits:
        raise GGUFError(
            f"{path}: the LoRA pair for {target!r} has the shapes {list(a)} and {list(b)}, which do not fit "
            f"the model's {list(model)} (an adapter for another model?)"
        )
