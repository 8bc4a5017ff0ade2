"""GGUF metadata reading and the served model id."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from bubo.model import GGUFError, model_id_from_path, read_metadata


class TestMetadata:
    def test_default_model(self, model_path: Path) -> None:
        """The default model's metadata reads with arrays as tuples."""
        metadata = read_metadata(model_path)
        assert metadata.architecture == "llama"
        assert metadata.arch_value("context_length") == 8192
        assert metadata["tokenizer.ggml.model"] == "gpt2"
        assert metadata["tokenizer.ggml.pre"] == "smollm"
        assert len(metadata["tokenizer.ggml.tokens"]) == 49152
        assert metadata["tokenizer.ggml.tokens"][:3] == ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
        assert "{% for message in messages %}" in metadata["tokenizer.chat_template"]

    def test_all_value_types(self, tmp_path: Path) -> None:
        """Every GGUF scalar type and nested arrays decode."""

        def string(text: str) -> bytes:
            data = text.encode()
            return struct.pack("<Q", len(data)) + data

        kvs = [
            (string("u8") + struct.pack("<IB", 0, 7)),
            (string("i32") + struct.pack("<Ii", 5, -3)),
            (string("f32") + struct.pack("<If", 6, 0.5)),
            (string("bool") + struct.pack("<I?", 7, True)),  # noqa: FBT003
            (string("s") + struct.pack("<I", 8) + string("héllo")),
            (string("arr") + struct.pack("<IIQ", 9, 11, 2) + struct.pack("<qq", -1, 2)),
            (string("nested") + struct.pack("<IIQ", 9, 9, 1) + struct.pack("<IQ", 8, 1) + string("x")),
            (string("f64") + struct.pack("<Id", 12, 1.25)),
        ]
        path = tmp_path / "t.gguf"
        path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, len(kvs)) + b"".join(kvs))
        metadata = read_metadata(path)
        assert dict(metadata) == {
            "u8": 7, "i32": -3, "f32": 0.5, "bool": True, "s": "héllo", "arr": (-1, 2), "nested": (("x",),), "f64": 1.25,
        }  # fmt: skip

    @pytest.mark.parametrize(
        "content",
        [
            b"",
            b"GGML" + bytes(20),
            b"GGUF",
            b"GGUF" + struct.pack("<IQQ", 1, 0, 0),
            b"GGUF" + struct.pack("<IQQ", 3, 0, 5),
        ],
    )
    def test_rejects_broken_files(self, tmp_path: Path, content: bytes) -> None:
        """Empty, foreign, old-version and truncated files raise GGUFError."""
        path = tmp_path / "bad.gguf"
        path.write_bytes(content)
        with pytest.raises(GGUFError):
            read_metadata(path)


class TestModelId:
    @pytest.mark.parametrize(
        ("name", "expected"),
        [
            ("Huihui-Qwen3.8-Flash-Next-UD-Q4_K_XL-v1.gguf", "huihui-qwen38-flash-next-ud-q4-k-xl-v1"),
            ("SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2-135m-instruct-q4-1"),
            ("gemma-3-270m-q4_k_m.gguf", "gemma-3-270m-q4-k-m"),
            ("___.gguf", "bubo"),
        ],
    )
    def test_from_file_name(self, name: str, expected: str) -> None:
        """Lower case, digit.digit dots dropped, other separators one hyphen."""
        assert model_id_from_path(Path("/models") / name) == expected
