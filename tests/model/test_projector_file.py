"""A projector file's kind and output width, read before llama.cpp sees it."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

from bubo.model import GGUFError, read_projector
from bubo.model.projector import ProjectorInfo

from .._tiny_gguf.mmproj import build_mmproj


def clip_file(path: Path, projector_type: str, tensors: dict[str, tuple[int, ...]]) -> Path:
    """A ``clip`` GGUF of *projector_type* holding zero tensors of the given numpy shapes."""
    writer = gguf.GGUFWriter(path, arch="clip")
    writer.add_string("clip.projector_type", projector_type)
    writer.add_bool("clip.has_vision_encoder", True)  # noqa: FBT003
    for name, shape in tensors.items():
        writer.add_tensor(name, np.zeros(shape, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


class TestReadProjector:
    @pytest.mark.parametrize("width", [576, 64])
    def test_a_gemma3_projector_says_its_output_width(self, tmp_path, width) -> None:
        info = read_projector(build_mmproj(tmp_path / "mmproj.gguf", n_embd=width))
        assert info == ProjectorInfo(projector_type="gemma3", vision=True, audio=False, output_width=width)

    def test_a_llava_mlp_projector_says_the_width_of_its_last_layer(self, tmp_path) -> None:
        """LLaVA's mm.2 maps the hidden width to the text model's: numpy (out, in) is ggml [in, out]."""
        path = clip_file(
            tmp_path / "llava.gguf", "mlp", {"mm.0.weight": (1024, 768), "mm.2.weight": (4096, 1024)}
        )
        assert read_projector(path).output_width == 4096

    def test_a_type_whose_width_is_not_read_leaves_it_to_mtmd(self, tmp_path) -> None:
        path = clip_file(tmp_path / "other.gguf", "idefics3", {"mm.model.fc.weight": (576, 128)})
        assert read_projector(path).output_width is None

    def test_a_projector_without_its_width_tensor_leaves_it_to_mtmd(self, tmp_path) -> None:
        path = clip_file(tmp_path / "broken.gguf", "gemma3", {"mm.soft_emb_norm.weight": (32,)})
        assert read_projector(path).output_width is None

    def test_a_text_model_is_no_projector(self, model_path) -> None:
        with pytest.raises(GGUFError, match=r"is not a multimodal projector .*'llama', not 'clip'"):
            read_projector(model_path)

    def test_a_file_that_is_no_gguf_is_refused(self, tmp_path) -> None:
        path = tmp_path / "mmproj.gguf"
        path.write_bytes(b"not a gguf file at all")
        with pytest.raises(GGUFError, match="not a GGUF file"):
            read_projector(path)
