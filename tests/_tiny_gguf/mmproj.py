"""A tiny random-weight multimodal projector (mmproj) GGUF for llama.cpp's mtmd.

No registry reachable from here ships a vision model, so the tests build one:
a SigLIP-style vision tower with Gemma 3's projector (``clip.projector_type``
``gemma3``), small enough to build in well under a second (about 300 KB).
Gemma 3's projector is the one chosen because its image markers
(``<start_of_image>``, ``<end_of_image>``) are plain text that any vocabulary
tokenizes, so it pairs with any text model whose ``n_embd`` the projection's
width is given.

The weights are random (seeded: the same file every time), so what the model
"sees" is noise: tests may assert only on shapes, counts, determinism and
errors, never on what a model says about an image.

The sizes: 32x32 images cut into 8x8 patches (a 4x4 grid, 16 patches),
average-pooled 2x2 (``clip.vision.projector.scale_factor``) to 4 image tokens,
each projected to the text model's ``n_embd``.  The key and tensor names are
those llama.cpp's ``tools/mtmd/clip.cpp`` reads (``clip-impl.h``'s ``KEY_*``
and ``TN_*``), spelled through the ``gguf`` package's constants where it has
them.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import numpy.typing as npt

__all__ = [
    "IMAGE_SIZE",
    "IMAGE_TOKENS",
    "PATCH_SIZE",
    "SCALE_FACTOR",
    "build_mmproj",
    "n_embd_of",
]

IMAGE_SIZE = 32  # the encoder's input: every image is resized to this square
PATCH_SIZE = 8
SCALE_FACTOR = 2  # Gemma 3's average pooling of the patch grid, per side
IMAGE_TOKENS = (IMAGE_SIZE // PATCH_SIZE // SCALE_FACTOR) ** 2  # embedding positions per image: 4

_VISION_EMBD = 32  # the vision tower's width
_VISION_HEADS = 2
_VISION_FF = 64
_VISION_BLOCKS = 2
_SEED = 20260601


def build_mmproj(path: Path, *, n_embd: int, seed: int = _SEED) -> Path:
    """Write the tiny Gemma 3 projector to *path*, projecting to *n_embd* (the text model's width).

    A width other than the text model's ``n_embd`` makes a projector llama.cpp
    refuses (``mtmd_init_from_file`` returns NULL): the tests build one on
    purpose.  Another *seed* gives other weights (another projector of the
    same shape).  Returns *path*.
    """
    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(path, arch="clip")
    writer.add_type(gguf.GGUFType.MMPROJ)
    writer.add_name("bubo tiny gemma3 mmproj (random weights)")
    writer.add_string(gguf.Keys.Clip.PROJECTOR_TYPE, "gemma3")
    writer.add_bool(gguf.Keys.Clip.HAS_VISION_ENCODER, True)  # noqa: FBT003
    writer.add_bool(gguf.Keys.Clip.HAS_AUDIO_ENCODER, False)  # noqa: FBT003
    vision = gguf.Keys.ClipVision
    writer.add_uint32(vision.IMAGE_SIZE, IMAGE_SIZE)
    writer.add_uint32(vision.PATCH_SIZE, PATCH_SIZE)
    writer.add_uint32(vision.EMBEDDING_LENGTH, _VISION_EMBD)
    writer.add_uint32(vision.FEED_FORWARD_LENGTH, _VISION_FF)
    writer.add_uint32(vision.PROJECTION_DIM, n_embd)
    writer.add_uint32(vision.BLOCK_COUNT, _VISION_BLOCKS)
    writer.add_uint32(vision.Attention.HEAD_COUNT, _VISION_HEADS)
    writer.add_float32(vision.Attention.LAYERNORM_EPS, 1e-6)
    writer.add_uint32(vision.Projector.SCALE_FACTOR, SCALE_FACTOR)
    writer.add_array(vision.IMAGE_MEAN, [0.5, 0.5, 0.5])
    writer.add_array(vision.IMAGE_STD, [0.5, 0.5, 0.5])
    writer.add_bool(vision.USE_GELU, True)  # noqa: FBT003

    def weights(*shape: int) -> npt.NDArray[np.float32]:
        scale = 1.0 / np.sqrt(shape[-1])  # keeps activations near unit size through the blocks
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    def norm(width: int) -> dict[str, npt.NDArray[np.float32]]:
        return {
            "weight": (1.0 + 0.1 * rng.standard_normal(width)).astype(np.float32),
            "bias": (0.1 * rng.standard_normal(width)).astype(np.float32),
        }

    def linear(n_out: int, n_in: int) -> dict[str, npt.NDArray[np.float32]]:
        # numpy shapes are ggml's reversed: a (n_out, n_in) array is ggml's [n_in, n_out] matrix
        return {"weight": weights(n_out, n_in), "bias": weights(n_out) * 0.1}

    n_patches = (IMAGE_SIZE // PATCH_SIZE) ** 2
    tensors: dict[str, npt.NDArray[np.float32]] = {
        "v.patch_embd.weight": weights(_VISION_EMBD, 3, PATCH_SIZE, PATCH_SIZE),
        "v.patch_embd.bias": weights(_VISION_EMBD) * 0.1,
        "v.position_embd.weight": weights(n_patches, _VISION_EMBD),
    }
    for block in range(_VISION_BLOCKS):
        parts = {
            "ln1": norm(_VISION_EMBD),
            "attn_q": linear(_VISION_EMBD, _VISION_EMBD),
            "attn_k": linear(_VISION_EMBD, _VISION_EMBD),
            "attn_v": linear(_VISION_EMBD, _VISION_EMBD),
            "attn_out": linear(_VISION_EMBD, _VISION_EMBD),
            "ln2": norm(_VISION_EMBD),
            "ffn_up": linear(_VISION_FF, _VISION_EMBD),
            "ffn_down": linear(_VISION_EMBD, _VISION_FF),
        }
        for part, arrays in parts.items():
            for kind, array in arrays.items():
                tensors[f"v.blk.{block}.{part}.{kind}"] = array
    for kind, array in norm(_VISION_EMBD).items():
        tensors[f"v.post_ln.{kind}"] = array
    # Gemma 3 multiplies by this matrix's transpose: ggml's [n_embd, vision] (numpy's (vision, n_embd))
    tensors["mm.input_projection.weight"] = weights(_VISION_EMBD, n_embd)
    tensors["mm.soft_emb_norm.weight"] = (1.0 + 0.1 * rng.standard_normal(_VISION_EMBD)).astype(np.float32)
    for name, array in tensors.items():
        writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def n_embd_of(gguf_path: Path) -> int:
    """The embedding width (``{arch}.embedding_length``) of the text model at *gguf_path*."""
    reader = gguf.GGUFReader(gguf_path)
    arch = _scalar(reader, gguf.Keys.General.ARCHITECTURE)
    return int(_scalar(reader, gguf.Keys.LLM.EMBEDDING_LENGTH.format(arch=arch)))


def _scalar(reader: gguf.GGUFReader, key: str) -> str | int:
    field = reader.get_field(key)
    if field is None:
        raise KeyError(key)
    value = field.contents()
    if not isinstance(value, str | int):
        raise TypeError(f"{key} is {value!r}, not a scalar")
    return value
