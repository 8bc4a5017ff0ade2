"""The engine's plain values: what it reports of the model, its slot files and its prompt cache.

Frozen attrs records with no behaviour, read by the service and the API
(``/props``, ``/v1/models``, ``/slots``, ``/cache``); the engine's statistics are
in :mod:`.stats`.
"""

from __future__ import annotations

import attrs

from .lora import NO_ADAPTERS, AdapterSet

__all__ = [
    "CacheContents",
    "FimTokens",
    "ModelInfo",
    "PairFormat",
    "RepackDecision",
    "SlotFile",
    "SnapshotInfo",
]


@attrs.frozen(kw_only=True)
class SlotFile:
    """A slot saved to or restored from a file: its tokens, the file's size, the slot's LoRA adapter set."""

    n_tokens: int
    n_bytes: int
    adapters: AdapterSet = NO_ADAPTERS  # its cells' LoRA set: computed under (save), taken as (restore)


@attrs.frozen(kw_only=True)
class RepackDecision:
    """Whether llama.cpp may repack the weights into its CPU extra buffer types (AMX, CPU_REPACK), and why."""

    enabled: bool
    reason: str  # one phrase for the log and /props, e.g. "the probe decode passed"


@attrs.frozen(kw_only=True)
class FimTokens:
    """The vocabulary's fill-in-the-middle tokens (llama.cpp's ``llama_vocab_fim_*``); ``None``: absent.

    ``pre``, ``suf`` and ``mid`` frame the gap; ``rep`` (repository name) and
    ``sep`` (file separator) frame the extra context files of repo-level FIM.
    """

    pre: int
    suf: int
    mid: int
    rep: int | None = None
    sep: int | None = None


@attrs.frozen(kw_only=True)
class ModelInfo:
    """What is known about the loaded model (feeds ``/props``, ``/v1/models``)."""

    path: str
    architecture: str
    n_ctx: int
    n_ctx_train: int
    n_vocab: int
    n_embd: int
    n_params: int
    size_bytes: int
    vocab_type: int  # llama.cpp's enum: 1 SPM, 2 BPE, 3 WPM, 4 UGM
    description: str  # e.g. "llama ?B Q4_1"
    eog_token_ids: frozenset[int]
    repack: RepackDecision
    n_batch: int = 2048  # tokens one llama_decode takes (the context's --batch-size)
    fim: FimTokens | None = None  # None: the vocabulary has no fill-in-the-middle tokens
    draft_model: str | None = None  # the draft model's path (--model-draft); None: none is loaded
    context_shift: bool = False  # generations go on past the context's end (--context-shift)
    # what a KV state of this model and these settings is (the disk tier's kv_identity): the model file's
    # content, llama.cpp's state format, the KV settings, the adapter files; slot files record it
    state_identity: str = ""
    # a decoder with causal attention; False: an encoder (BERT's kind, no KV cache, no next token to
    # sample), which serves embeddings or ranking only
    generates: bool = True


@attrs.frozen(kw_only=True)
class SnapshotInfo:
    """One prompt-cache snapshot, in host RAM or in a file."""

    n_tokens: int
    size_bytes: int
    conversation: str | None  # the conversation tag of the request that left it (RAM only)
    last_used: float = 0.0  # Unix time it was stored or last restored
    tier: str = "ram"  # ram | disk


@attrs.frozen(kw_only=True)
class CacheContents:
    """What the prompt cache holds (``/cache``, ``/debug/cache``), least recently used first in each tier."""

    live_tokens: int  # tokens in the slots' KV cache
    budget_bytes: int  # host RAM allowed for snapshots (0: none)
    snapshots: tuple[SnapshotInfo, ...] = ()  # in host RAM
    disk_budget_bytes: int = 0  # disk allowed for snapshot files (0: no disk tier)
    disk_snapshots: tuple[SnapshotInfo, ...] = ()


@attrs.frozen(kw_only=True)
class PairFormat:
    """How a reranker reads one (query, document) pair: llama.cpp's ``format_prompt_rerank``.

    With the GGUF's ``rerank`` template (``tokenizer.chat_template.rerank``), its
    ``{query}`` and ``{document}`` are replaced by the texts and the whole is
    tokenized with special tokens parsed and none added.  Without one, the
    texts are tokenized apart (specials neither added nor parsed) and joined as
    ``[BOS] query [EOS] [SEP] document [EOS]``, each marker only where the
    vocabulary adds it (None here: not added); EOS is the SEP token in a
    vocabulary without EOS (BERT's: ``[CLS] query [SEP] document``).
    """

    template: str | None = None
    bos: int | None = None
    eos: int | None = None
    sep: int | None = None
