"""What a :class:`~.llama.LlamaEngine` keeps across sleeps, learnt by its first load.

A sleep frees everything native (:class:`~._loaded.LoadedModel`); a wake-up
loads the same model under the same options again.  What the first load
learnt therefore holds for every later one, and what the engine gathered
while serving must not be lost with the context: the totals, the drafting
statistics (they describe the model, the machine, the work), the prompt
cache's disk tier (its files and its writer thread), the tokens' bytes and
the KV state's fingerprint.  The engine owns this record; :meth:`Lasting.close`
(the engine's own close) stops the disk tier's writer.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import attrs
import llama_cpp

from ._context import LlamaContext, token_piece
from ._disk_cache import DiskTier, kv_identity
from ._draft_policy import DraftPolicy
from .stats import EngineCounters

if TYPE_CHECKING:
    from .llama import LlamaOptions

__all__ = ["Lasting", "Vocabulary", "state_identity"]

logger = logging.getLogger(__name__)


@attrs.frozen(kw_only=True)
class Vocabulary:
    """The model's tokens as the engine renders and ends on them."""

    pieces: list[bytes]  # each token's bytes (control tokens render empty)
    eog: frozenset[int]  # the end-of-generation tokens


@attrs.define(eq=False)
class Lasting:
    """The engine's state that outlives a sleep; the first load fills what it learns of the model."""

    options: LlamaOptions
    totals: EngineCounters = attrs.Factory(EngineCounters)
    identity: str | None = None  # the KV state's fingerprint (state_identity), set by the first load
    disk: DiskTier | None = None  # the prompt cache's files; None: no disk tier
    drafting: DraftPolicy | None = None  # None: no drafting (--draft-max 0)
    vocabulary: Vocabulary | None = None

    def disk_tier(self, params: llama_cpp.llama_context_params) -> DiskTier | None:
        """The disk tier for contexts of *params*: opened by the first load, the same one after a sleep."""
        if self.identity is None:
            self.identity = state_identity(self.options, params)
            self.disk = _open_disk_tier(self.options, self.identity)
        return self.disk

    def drafting_policy(self, draft_cost_prior: float) -> DraftPolicy | None:
        """The drafting statistics, made by the first load (*draft_cost_prior*: the draft's size ratio)."""
        if self.drafting is None and self.options.drafting.draft_max > 0:
            self.drafting = DraftPolicy(self.options.drafting, draft_cost_prior=draft_cost_prior)
        return self.drafting

    def tokens(self, context: LlamaContext) -> Vocabulary:
        """Every token's bytes and the end-of-generation tokens, read from the first load's vocabulary."""
        if self.vocabulary is None:
            vocab, n_vocab = context.vocab, context.n_vocab
            self.vocabulary = Vocabulary(
                pieces=[token_piece(vocab, token) for token in range(n_vocab)],
                eog=frozenset(t for t in range(n_vocab) if llama_cpp.llama_vocab_is_eog(vocab, t)),
            )
        return self.vocabulary

    def close(self) -> None:
        """Stop the disk tier's writer once it wrote what is queued (the engine is closing)."""
        if self.disk is not None:
            self.disk.close()


def state_identity(options: LlamaOptions, params: llama_cpp.llama_context_params) -> str:
    """The fingerprint of a KV state of this model under these settings (slot files, the disk tier).

    It covers what changes the KV cells a state holds: the model file's content, llama.cpp's
    version and state format, the KV types (``-ctk``/``-ctv``), flash attention, the
    sliding-window and unified caches, RoPE, the LoRA adapter files in id order (a state
    records its adapter set as ids and scales, which mean the same cells only over the same
    files), and the image projector with its token bounds (an image's cells are its
    embeddings).  Not the context size: a prefix's cells do not depend on it.  Blocking: it reads
    samples of the model and adapter files (:func:`kv_identity`).
    """
    settings = {
        "llama_cpp": llama_cpp.__version__,
        "state_seq": [llama_cpp.LLAMA_STATE_SEQ_MAGIC, llama_cpp.LLAMA_STATE_SEQ_VERSION],
        "type_k": params.type_k,
        "type_v": params.type_v,
        "flash_attn": options.flash_attn,
        "swa_full": bool(params.swa_full),
        "kv_unified": bool(params.kv_unified),
        "rope": [
            params.rope_scaling_type,
            params.rope_freq_base,
            params.rope_freq_scale,
            params.yarn_ext_factor,
            params.yarn_attn_factor,
            params.yarn_beta_fast,
            params.yarn_beta_slow,
            params.yarn_orig_ctx,
        ],
        "lora": [kv_identity(lora.path, {}) for lora in options.lora],
    }
    if options.mmproj is not None:  # an image's cells are its projector's embeddings (text-only: unchanged)
        settings["mmproj"] = [
            kv_identity(options.mmproj, {}),
            options.image_min_tokens,
            options.image_max_tokens,
        ]
    return kv_identity(options.model_path, settings)


def _open_disk_tier(options: LlamaOptions, identity: str) -> DiskTier | None:
    """The prompt cache's disk tier, in a directory of its own for *identity* (:func:`state_identity`).

    Files longer than the context are not offered.  A directory that cannot be made costs only
    the disk tier.
    """
    if options.cache_disk_dir is None or options.cache_disk_mib <= 0:
        return None
    try:
        return DiskTier(
            options.cache_disk_dir,
            identity=identity,
            budget_bytes=options.cache_disk_mib << 20,
            max_age_s=options.cache_disk_max_age_days * 86400.0,
        )
    except OSError as error:
        logger.warning("the prompt cache has no disk tier: %s", error)
        return None
