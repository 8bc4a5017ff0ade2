"""Build the runtime from settings: read the GGUF, build the tokenizer, load the engine.

Blocking (seconds to minutes): the server runs it in a worker thread while
``/ready`` answers 503.  Progress goes to the log and to the caller's callback.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

import attrs

from bubo.config import CACHE_RAM_MAX_MIB, LoadSettings, ServingSettings, Settings
from bubo.domain.generation import GrammarSpec
from bubo.domain.requests import ChatDefaults
from bubo.engine import EmbeddingModel, ModelInfo
from bubo.engine.llama import DraftOptions, LlamaOptions, LoraFile, load_llama_engine
from bubo.engine.probe import VerdictCache, decide_repack
from bubo.engine.vocab import LlamaVocabTokenizer
from bubo.errors import InvalidRequest
from bubo.model import (
    GGUFError,
    GGUFMetadata,
    KvCacheSize,
    ProjectorInfo,
    check_lora_adapter,
    kv_bytes_per_token,
    model_id_from_path,
    read_metadata,
    read_model_card,
    read_projector,
)
from bubo.parsers.registry import format_for_template
from bubo.service.generation import schema_grammar
from bubo.service.idle import IdleSleeper
from bubo.service.memory import MemoryGuard, SystemMemory
from bubo.service.runtime import Runtime
from bubo.service.slot_store import SlotFileStore, model_fingerprint
from bubo.service.work import Workers
from bubo.templates import CHATML, ChatTemplate
from bubo.tokenizer import Tokenizer, UnsupportedVocab, build_hf_tokenizer

__all__ = ["load_runtime"]

logger = logging.getLogger(__name__)

ProgressCallback = Callable[[float], None]


class _ProgressLog:
    """Logs loading progress every 10 %, and forwards every report."""

    def __init__(self, forward: ProgressCallback) -> None:
        self._forward = forward
        self._next_step = 0.0

    def __call__(self, fraction: float) -> None:
        self._forward(fraction)
        if fraction >= self._next_step:
            logger.info("loading model: %3.0f%%", fraction * 100)
            self._next_step = (int(fraction * 10) + 1) / 10


def load_runtime(settings: Settings, on_progress: ProgressCallback) -> Runtime:
    """Load everything the model needs; blocking.

    Raises:
        bubo.model.GGUFError: the file is not a readable GGUF, a LoRA adapter does not fit the model, or
            ``--reranking`` (``--pooling rank``) names a model without a classifier head.
        bubo.engine.EngineFailure: llama.cpp could not load the model, or crashes on it in the probe.
        bubo.errors.InvalidRequest: the default grammar or JSON schema cannot constrain answers (``param``
            names the flag).

    """
    model = settings.model
    path = model.path
    assert path is not None, "load_settings always resolves the model path"
    started = time.perf_counter()
    logger.info("model file: %s", path)
    if model.cache_disk_mib > 0 and settings.cache_dir is None:
        logger.warning("--cache-disk-mib needs --cache-dir (there is no home directory): no disk tier")
    metadata = read_metadata(path)
    snapshot_mib = cache_ram_mib(model.cache_ram, SystemMemory().read().available_bytes)
    logger.info("prompt-cache snapshots in host RAM: up to %d MiB (--cache-ram)", snapshot_mib)
    lora = _lora_files(model, metadata)  # before llama.cpp: an adapter that does not fit could crash it
    _check_ranks(model, metadata)  # before llama.cpp: older builds abort on rank pooling without a head
    projector = _projector(model.mmproj)  # before llama.cpp too: a projector of another width is refused
    if projector is not None and model.cache_reuse > 0:
        logger.warning(
            "--cache-reuse is off with --mmproj (as in llama-server): it would move an image's cells"
        )
    options = llama_options(settings, path, cache_ram_mib=snapshot_mib, lora=lora, projector=projector)
    # First, before anything of llama.cpp runs in this process: the probe's child may crash instead.
    repack = decide_repack(
        model.repack,
        options,
        timeout_s=model.repack_probe_timeout,
        cache=VerdictCache(settings.cache_dir / "repack") if settings.cache_dir is not None else None,
    )
    default = _default_grammar(settings)  # before the model loads: a bad schema fails fast
    tokenizer = _tokenizer(metadata, path)
    template = _template(metadata, settings, tokenizer)
    engine = load_llama_engine(attrs.evolve(options, repack=repack), on_progress=_ProgressLog(on_progress))
    serving = settings.serving
    names = serving.served_model_name or (model_id_from_path(path),)
    model_id, aliases = names[0], names[1:]
    tool_parser = serving.tool_call_parser
    if tool_parser == "auto":
        tool_parser = format_for_template(template.source)
    try:
        default_grammar = None if default is None else engine.compile_grammar(default)
        slot_files = _slot_files(serving, path, engine.info)
    except BaseException:
        engine.close()
        raise
    info = engine.info
    memory_guard = _memory_guard(settings, metadata, info.n_vocab)
    kv_cache = None
    if info.generates:
        kv_cache = KvCacheSize.of(
            metadata,
            type_k=model.cache_type_k,
            type_v=model.cache_type_v,
            n_ctx=engine.statistics().kv_cache_capacity,
        )
        held = f"KV cache {kv_cache.type_k}/{kv_cache.type_v} {kv_cache.bytes / 2**20:.1f} MiB"
    else:
        held = _encoder_use(engine.embedder)
    logger.info(
        "model ready in %.1f s: %s (%s, %d-token context, %s, %s tokenizer, "
        "%s template, %s tool calls, weight repacking %s: %s)",
        time.perf_counter() - started,
        model_id,
        info.description,
        info.n_ctx,
        held,
        tokenizer.name,
        template.origin,
        tool_parser,
        "on" if repack.enabled else "off",
        repack.reason,
    )
    return Runtime(
        model_id=model_id,
        created=int(time.time()),
        engine=engine,
        tokenizer=tokenizer,
        template=template,
        defaults=settings.generation,
        tool_parser=tool_parser,
        default_grammar=default_grammar,
        memory_guard=memory_guard,
        max_queue=settings.server.max_queue,
        workers=Workers(
            max_jobs=settings.server.cpu_jobs, guard=memory_guard, max_waiting=settings.server.max_queue
        ),
        spm_infill=serving.spm_infill,
        slot_files=slot_files,
        aliases=aliases,
        tags=serving.tags,
        any_model_name=serving.model_names == "any",
        chat=ChatDefaults(
            prefill_assistant=settings.requests.prefill_assistant,
            thinking=settings.requests.thinking,
            reasoning_format=settings.requests.reasoning_format,
        ),
        card=read_model_card(path, metadata),
        kv_cache=kv_cache,
        sleeper=IdleSleeper(
            idle_s=settings.server.sleep_idle_seconds if settings.server.sleep_idle_seconds >= 0 else None,
            policy=settings.server.ollama_keep_alive,
        ),
    )


def _encoder_use(embedder: EmbeddingModel | None) -> str:
    """What an encoder (a model that cannot generate) is served for, for the ready line."""
    pooling = "none" if embedder is None else embedder.pooling
    use = "ranking (/rerank)" if pooling == "rank" else f"embeddings only ({pooling} pooling)"
    return f"an encoder: no generation, no KV cache; {use}"


def _slot_files(serving: ServingSettings, path: Path, info: ModelInfo) -> SlotFileStore | None:
    """The slot file store of ``--slot-save-path`` (None without it); reads the whole model file once."""
    if serving.slot_save_path is None:
        return None
    return SlotFileStore(
        directory=serving.slot_save_path,
        max_bytes=serving.slot_save_max_mib << 20,
        max_files=serving.slot_save_max_files,
        fingerprint=model_fingerprint(path, info.state_identity),
    )


def cache_ram_mib(setting: int, available_bytes: int) -> int:
    """The snapshot budget: the setting, or for -1 (auto) a quarter of the available memory, at most 8 GiB.

    One agent session (a 12,000-token main conversation and its sub-agents'
    shorter ones) takes a few hundred MiB on a 0.5B model; a quarter of what is
    free leaves the rest for the model, its context and the machine.
    """
    if setting != -1:
        return setting
    return min(CACHE_RAM_MAX_MIB, available_bytes // 4 // (1024 * 1024))


def _projector(path: Path | None) -> ProjectorInfo | None:
    """What the ``--mmproj`` file says of itself (None without one).

    Raises:
        bubo.model.GGUFError: it is not a readable GGUF projector.

    """
    if path is None:
        return None
    try:
        info = read_projector(path)
    except OSError as error:
        raise GGUFError(f"cannot read the projector {path}: {error.strerror}") from None
    logger.info("image projector: %s (%s)", path, info.projector_type)
    return info


def llama_options(
    settings: Settings,
    path: Path,
    *,
    cache_ram_mib: int,
    lora: tuple[LoraFile, ...],
    projector: ProjectorInfo | None = None,
) -> LlamaOptions:
    """The engine's options from the settings: the one place a load setting reaches the engine.

    *path*, *cache_ram_mib*, *lora* and *projector* are the settings as resolved at load time: the
    model file, ``--cache-ram`` with auto sized, the adapters checked against the model, what the
    ``--mmproj`` file says of itself.
    """
    model = settings.model
    return LlamaOptions(
        model_path=path,
        n_ctx=model.ctx_size,
        n_threads=model.threads,
        n_threads_batch=model.threads_batch,
        n_batch=model.batch_size,
        n_ubatch=model.ubatch_size,
        prefill_chunk=model.prefill_chunk,
        prefill_gap_ms=model.prefill_gap_ms,
        n_parallel=model.parallel,
        kv_unified=model.kv_unified,
        slot_prompt_similarity=model.slot_prompt_similarity,
        flash_attn=model.flash_attn,
        cache_type_k=model.cache_type_k,
        cache_type_v=model.cache_type_v,
        n_gpu_layers=model.n_gpu_layers,
        cache_ram_mib=cache_ram_mib,
        cache_idle_slots=model.cache_idle_slots,
        cache_disk_dir=settings.cache_dir / "prompts" if settings.cache_dir is not None else None,
        cache_disk_mib=model.cache_disk_mib,
        cache_disk_max_age_days=model.cache_disk_max_age_days,
        drafting=DraftOptions(
            draft_max=settings.generation.speculative.n_max,
            ngram_min=model.draft_ngram_min,
            mode=model.draft_policy,
        ),
        draft_model_path=model.model_draft,
        n_ctx_draft=model.ctx_size_draft,
        n_gpu_layers_draft=model.n_gpu_layers_draft,
        embeddings=model.embeddings or model.reranking,
        pooling="rank" if model.reranking else model.pooling,
        mmproj=model.mmproj,
        mmproj_output_width=None if projector is None else projector.output_width,
        mmproj_offload=model.mmproj_offload,
        image_min_tokens=model.image_min_tokens,
        image_max_tokens=model.image_max_tokens,
        image_max_pixels=model.image_max_pixels,
        image_max_count=model.image_max_count,
        context_shift=model.context_shift,
        max_unread_mib=model.max_unread_mib,
        # as llama-server: moving cached runs would move an image's cells, encoded where they stood
        cache_reuse=0 if model.mmproj is not None else model.cache_reuse,
        courier=model.courier,
        lora=lora,
    )


def _lora_files(model: LoadSettings, metadata: GGUFMetadata) -> tuple[LoraFile, ...]:
    """The adapters to load, by id (``--lora`` ones, then ``--lora-scaled`` ones), each checked to fit.

    Raises:
        bubo.model.GGUFError: an adapter is not a LoRA GGUF for this model.

    """
    given = [(path, 1.0) for path in model.lora] + list(model.lora_scaled)
    files: list[LoraFile] = []
    for path, scale in given:
        try:
            info = check_lora_adapter(path, metadata)
        except OSError as error:
            raise GGUFError(f"cannot read the LoRA adapter {path}: {error.strerror}") from None
        logger.info(
            "LoRA adapter %d: %s (%d tensors adapted, alpha %g)", len(files), path, info.n_pairs, info.alpha
        )
        files.append(LoraFile(path, 0.0 if model.lora_init_without_apply else scale))
    return tuple(files)


CLASSIFIER_TENSORS = frozenset({"cls.weight", "cls.output.weight"})
"""A reranker's classifier head (llama.cpp's rank pooling reads either): one of them must be there."""


def _check_ranks(model: LoadSettings, metadata: GGUFMetadata) -> None:
    """Refuse rank pooling asked of a model that has no classifier head to rank with.

    Raises:
        bubo.model.GGUFError: ``--reranking`` or ``--pooling rank`` on such a model.

    """
    if (model.reranking or model.pooling == "rank") and not CLASSIFIER_TENSORS & metadata.tensors.keys():
        flag = "--reranking" if model.reranking else "--pooling rank"
        raise GGUFError(
            f"{flag}: {model.path} has no classifier head (cls.weight or cls.output.weight): it is not a "
            "reranker; serve a reranker GGUF, or start without the flag"
        )


def _default_grammar(settings: Settings) -> GrammarSpec | None:
    """What ``--grammar-file``, ``--grammar`` or ``--json-schema`` (at most one is set) constrain answers to.

    Raises:
        bubo.errors.InvalidRequest: the schema asks for what the grammar cannot enforce (``param`` the flag).

    """
    requests = settings.requests
    if requests.grammar_file is not None:
        return GrammarSpec(rules=requests.grammar_file.read_text(encoding="utf-8"))
    if requests.grammar is not None:
        return GrammarSpec(rules=requests.grammar)
    if requests.json_schema is not None:
        try:
            return schema_grammar(requests.json_schema, "--json-schema")
        except InvalidRequest as error:  # the log line names the flag
            raise InvalidRequest(
                f"--json-schema: {error.message}", code=error.code, param=error.param
            ) from None
    return None


def _memory_guard(settings: Settings, metadata: GGUFMetadata, n_vocab: int) -> MemoryGuard | None:
    if not settings.server.memory_guard:
        return None
    model = settings.model
    verified_positions = 1 + settings.generation.speculative.n_max  # a step's token and its drafts
    return MemoryGuard(
        probe=SystemMemory(),
        kv_bytes_per_token=kv_bytes_per_token(metadata, model.cache_type_k, model.cache_type_v),
        step_bytes=n_vocab * 4 * verified_positions,  # float logits per verified position
        low_water_bytes=settings.server.memory_low_water_mib * 1024 * 1024,
    )


def _tokenizer(metadata: GGUFMetadata, path: Path) -> Tokenizer:
    try:
        return build_hf_tokenizer(metadata)
    except UnsupportedVocab as reason:
        logger.warning(
            "using llama.cpp's tokenizer: Hugging Face tokenizers cannot reproduce it (%s)", reason
        )
        return LlamaVocabTokenizer(path)


def _template(metadata: GGUFMetadata, settings: Settings, tokenizer: Tokenizer) -> ChatTemplate:
    template_file = settings.serving.chat_template_file
    if template_file is not None:
        source, origin = template_file.read_text(encoding="utf-8"), f"file:{template_file}"
    elif isinstance(metadata.get("tokenizer.chat_template"), str):
        source, origin = metadata["tokenizer.chat_template"], "gguf"
    else:
        logger.warning("the model has no chat template; using ChatML")
        source, origin = CHATML, "builtin-chatml"
    return ChatTemplate(
        source,
        bos_token=tokenizer.bos_token,
        eos_token=tokenizer.eos_token,
        origin=origin,
        preserve_reasoning=settings.requests.reasoning_preserve,
    )
