"""What a multimodal projector file (``--mmproj``) says about itself, read before llama.cpp sees it.

llama.cpp's mtmd refuses a projector made for another model by returning NULL
and logging why; reading the projector's output width here lets the loader
say exactly which widths differ, and keep such a file from mtmd altogether
(``bubo.engine``'s ``load_projector`` takes the width).  The width is read from
the tensor mtmd itself reads it from (``clip_n_mmproj_embd`` in llama.cpp's
``tools/mtmd/clip.cpp``), for the projector types listed in
:data:`OUTPUT_WIDTH_TENSORS`; for the others it is None and mtmd's own check
stands.  ``clip.vision.projection_dim`` is not used: files converted by
llama.cpp's older scripts hold the vision tower's projection there, not the
text model's width.
"""

from __future__ import annotations

from pathlib import Path

import attrs

from .gguf import GGUFError, GGUFMetadata, read_metadata

__all__ = ["OUTPUT_WIDTH_TENSORS", "ProjectorInfo", "read_projector"]

OUTPUT_WIDTH_TENSORS: dict[str, tuple[str, int]] = {
    # projector type: (tensor, the axis of its ggml shape that is the output width)
    "gemma3": ("mm.input_projection.weight", 0),  # multiplied transposed: ggml [n_embd, vision]
    "mlp": ("mm.2.weight", 1),  # LLaVA's two-layer MLP: ggml [hidden, n_embd]
}


@attrs.frozen(kw_only=True)
class ProjectorInfo:
    """A projector file's kind and what it feeds the text model."""

    projector_type: str  # clip.projector_type (or the vision one of a mixed file)
    vision: bool  # clip.has_vision_encoder
    audio: bool  # clip.has_audio_encoder
    output_width: int | None  # the embedding width it produces; None: a type this module does not read


def read_projector(path: Path) -> ProjectorInfo:
    """The projector at *path*, as its GGUF describes it.

    Raises:
        GGUFError: it is not a GGUF file, or not a projector (its architecture is not ``clip``).
        OSError: it cannot be read.

    """
    metadata = read_metadata(path)
    if metadata.architecture != "clip":
        raise GGUFError(
            f"{path} is not a multimodal projector "
            f"(its architecture is {metadata.architecture!r}, not 'clip')"
        )
    projector_type = str(
        metadata.get("clip.projector_type") or metadata.get("clip.vision.projector_type") or "unknown"
    )
    return ProjectorInfo(
        projector_type=projector_type,
        vision=bool(metadata.get("clip.has_vision_encoder", False)),
        audio=bool(metadata.get("clip.has_audio_encoder", False)),
        output_width=_output_width(metadata, projector_type),
    )


def _output_width(metadata: GGUFMetadata, projector_type: str) -> int | None:
    where = OUTPUT_WIDTH_TENSORS.get(projector_type)
    if where is None:
        return None
    name, axis = where
    tensor = metadata.tensors.get(name)
    if tensor is None or len(tensor.shape) <= axis:
        return None  # mtmd will refuse the file for the missing tensor, in its own words
    return tensor.shape[axis]
