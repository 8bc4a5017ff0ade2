"""A tiny BERT reranker GGUF with random weights, built at test time (about 120 KB).

No registry reachable here ships a reranker, so the tests build one: llama.cpp's
``bert`` architecture, non-causal, ``pooling_type`` rank (4) with one
classifier label, a small WordPiece vocabulary in llama.cpp's "phantom space"
form (whole words, every ASCII letter as a word start and as a continuation, so
any lowercase text tokenizes) with explicit special ids, ``token_types`` in F32
(llama.cpp adds its first row to every input as F32), and the classifier head
``cls.{weight,bias}`` and ``cls.output.{weight,bias}``.

Its weights are seeded noise: the scores are deterministic numbers without
meaning.  Tests on it assert shapes, counts, order and determinism, never which
document is relevant.
"""

from __future__ import annotations

import string
from pathlib import Path

import gguf
import numpy as np

__all__ = ["SPECIAL_TOKENS", "WORDS", "write_reranker"]

N_EMBD = 32
N_HEAD = 2
N_FF = 64
N_BLOCK = 2
N_CTX = 512
SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")  # ids 0..4
WORDS = (
    "the", "a", "cat", "dog", "kitten", "sat", "on", "mat", "stock", "market", "price", "rose",
    "what", "is", "where", "pets", "animals", "finance",
)  # fmt: skip
PUNCTUATION = ".,?!'"


def _vocabulary() -> list[str]:
    """Special tokens, then word starts (``▁word``), then continuations (a bare letter), all distinct."""
    starts = [*WORDS, *string.ascii_lowercase, *string.digits, *PUNCTUATION]
    tokens = [*SPECIAL_TOKENS, *dict.fromkeys("\u2581" + word for word in starts), *string.ascii_lowercase]
    assert len(set(tokens)) == len(tokens)
    return tokens


def write_reranker(path: Path, *, seed: int = 0, rerank_template: str | None = None) -> Path:
    """Write the reranker to *path*; *rerank_template* becomes ``tokenizer.chat_template.rerank``."""
    rng = np.random.default_rng(seed)

    def noise(*shape: int) -> np.ndarray:
        return rng.normal(0.0, 0.2, shape).astype(np.float32)

    tokens = _vocabulary()
    writer = gguf.GGUFWriter(str(path), gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.BERT])
    writer.add_name("tiny random reranker")
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_context_length(N_CTX)
    writer.add_embedding_length(N_EMBD)
    writer.add_feed_forward_length(N_FF)
    writer.add_block_count(N_BLOCK)
    writer.add_head_count(N_HEAD)
    writer.add_layer_norm_eps(1e-12)
    writer.add_causal_attention(False)  # noqa: FBT003
    writer.add_pooling_type(gguf.PoolingType.RANK)
    writer.add_classifier_output_labels(["relevance"])
    writer.add_tokenizer_model("bert")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types(
        [gguf.TokenType.CONTROL if t in SPECIAL_TOKENS else gguf.TokenType.NORMAL for t in tokens]
    )
    writer.add_token_type_count(2)
    writer.add_pad_token_id(0)
    writer.add_unk_token_id(1)
    writer.add_bos_token_id(2)  # [CLS]
    writer.add_sep_token_id(3)
    writer.add_mask_token_id(4)
    writer.add_add_bos_token(True)  # noqa: FBT003
    writer.add_add_sep_token(True)  # noqa: FBT003
    writer.add_add_eos_token(False)  # noqa: FBT003
    if rerank_template is not None:
        writer.add_chat_template([{"name": "rerank", "template": rerank_template}])
    ones, zeros = np.ones(N_EMBD, np.float32), np.zeros(N_EMBD, np.float32)
    tensors = {
        "token_embd.weight": noise(len(tokens), N_EMBD),
        "token_types.weight": noise(2, N_EMBD),
        "position_embd.weight": noise(N_CTX, N_EMBD),
        "token_embd_norm.weight": ones,
        "token_embd_norm.bias": zeros,
    }
    for block in range(N_BLOCK):
        for name, (n_out, n_in) in {
            "attn_q": (N_EMBD, N_EMBD),
            "attn_k": (N_EMBD, N_EMBD),
            "attn_v": (N_EMBD, N_EMBD),
            "attn_output": (N_EMBD, N_EMBD),
            "ffn_up": (N_FF, N_EMBD),
            "ffn_down": (N_EMBD, N_FF),
        }.items():
            tensors[f"blk.{block}.{name}.weight"] = noise(n_out, n_in)
            tensors[f"blk.{block}.{name}.bias"] = noise(n_out)
        for norm in ("attn_output_norm", "layer_output_norm"):
            tensors[f"blk.{block}.{norm}.weight"] = ones
            tensors[f"blk.{block}.{norm}.bias"] = zeros
    tensors |= {
        "cls.weight": noise(N_EMBD, N_EMBD),
        "cls.bias": noise(N_EMBD),
        "cls.output.weight": noise(1, N_EMBD),
        "cls.output.bias": noise(1),
    }
    for name, data in tensors.items():
        writer.add_tensor(name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
