"""A scripted engine for fast tests of everything above the engine.

Same slots, queue, accounting and cancellation machinery as the llama.cpp
engine (:class:`SlotEngine`, :class:`Slot`), and the same rules for when a
generation ends (:class:`EndPolicy`: limits, stop strings, the time limit,
``n_indent``, the thinking budget); instead of decoding it replays a reply
text piece by piece, with an optional delay per piece and an optional failure.
Each slot remembers the last prompt it ran, so slot choice by prefix works as
on the real engine.  Slot files are read and written on a thread of their own,
crossed to and waited for as the real engine's decode thread is
(:mod:`._crossing`), so a file call that hangs (``FakeScript.slot_file_call``)
takes the same path.  Never imports ``llama_cpp``.
"""

from __future__ import annotations

import collections
import hashlib
import json
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TypeVar

import attrs
import numpy as np
import numpy.typing as npt
import trio

from bubo.domain.generation import (
    CacheReport,
    EngineEvent,
    GenerationFinished,
    GenerationRequest,
    GenerationStats,
    GrammarSpec,
    PromptProgress,
    StopCause,
    TokenGenerated,
    TokenLogprob,
    TopLogprob,
)
from bubo.domain.media import PromptImage, stand_in_ids
from bubo.domain.modes import Pooling

from ._crossing import RELEASE_WAIT_S, SLOT_ACTION_WAIT_S, Job, cross
from ._end_policy import EndPolicy
from .base import EngineFailure, ModelInfo, PairFormat, RepackDecision, SlotEngine, SlotFile
from .lora import NO_ADAPTERS, AdapterSet, LoraAdapter, adapter_set
from .slots import Slot, common_prefix

__all__ = ["FakeEmbedder", "FakeEngine", "FakeVision", "fake_model_info"]

_PIECES = re.compile(r"\s*\S+|\s+")

T = TypeVar("T")


def fake_model_info(n_ctx: int = 2048, n_vocab: int = 49152) -> ModelInfo:
    """Model facts for a fake engine."""
    return ModelInfo(
        path="/fake/model.gguf",
        architecture="fake",
        n_ctx=n_ctx,
        n_ctx_train=n_ctx,
        n_vocab=n_vocab,
        n_embd=64,
        n_params=1_000_000,
        size_bytes=1_000_000,
        vocab_type=2,
        description="fake 1M",
        eog_token_ids=frozenset({2}),
        repack=RepackDecision(enabled=False, reason="a fake engine has no weights"),
        state_identity=hashlib.sha256(b"fake 1M").hexdigest(),
    )


@attrs.define
class FakeScript:
    """What the fake engine does on each request; tests change it between requests."""

    reply: str | Callable[[GenerationRequest], str] = "Hello from the fake engine."
    # The reply as each token's bytes, instead of ``reply`` cut into words (a character may span tokens).
    pieces: tuple[bytes, ...] | None = None
    piece_delay: float = 0.0  # seconds per generated piece
    prefill_delay: float = 0.0  # seconds for the whole prompt
    fail_after: int | None = None  # raise EngineFailure after this many pieces
    # The bytes of tokens the engine inserts (the end of thinking: ThinkingBudget.end_tokens); others: empty.
    vocabulary: Mapping[int, bytes] = attrs.field(factory=dict)
    # Called on the file thread where llama.cpp's slot file call runs (a test makes it hang there).
    slot_file_call: Callable[[], object] | None = None


@attrs.define
class FakeEmbedder:
    """Embeddings without weights: each token id stands for a fixed random vector, pooled as llama.cpp pools.

    Texts that share tokens get close vectors, as a real model's pooled states do.
    """

    pooling: Pooling = "mean"
    n_tokens: int = 512
    n_embd: int = 64  # with rank pooling, the scores per input (a reranker's classifier outputs)
    pair_format: PairFormat = attrs.field(factory=PairFormat)
    inputs: list[tuple[int, ...]] = attrs.field(factory=list)  # every input embedded, in order

    def _vector(self, token: int) -> npt.NDArray[np.float32]:
        return np.random.default_rng(token).standard_normal(self.n_embd).astype(np.float32)

    def embed(self, tokens: Sequence[int], *, last_only: bool = False) -> npt.NDArray[np.float32]:
        """Like :meth:`bubo.engine._embedder.Embedder.embed`."""
        if not 0 < len(tokens) <= self.n_tokens:
            raise EngineFailure(
                f"an embedding input must have 1 to {self.n_tokens} tokens, not {len(tokens)}"
            )
        self.inputs.append(tuple(tokens))
        rows: npt.NDArray[np.float32] = np.array([self._vector(token) for token in tokens], dtype=np.float32)
        pooled: npt.NDArray[np.float32]
        match self.pooling:
            case "none":
                pooled = rows[-1] if last_only else rows
            case "cls":
                pooled = rows[0]
            case "last":
                pooled = rows[-1]
            case "rank":
                pooled = rows.mean(axis=0, dtype=np.float32)[: self.n_embd]
            case _:
                pooled = rows.mean(axis=0, dtype=np.float32)
        return pooled


@attrs.define
class FakeVision:
    """Images without a projector: decoded as the real engine decodes them, ``n_positions`` stand-ins each.

    Every image read is kept in ``read``, in order.
    """

    n_positions: int = 4
    max_pixels: int = 1_000_000
    max_images: int = 32
    encoder_bytes: int = 0
    read: list[PromptImage] = attrs.field(factory=list)

    def read_image(self, data: bytes, *, param: str) -> PromptImage:
        """Like :meth:`bubo.engine._vision.Vision.read_image`."""
        from ._images import decode_image  # noqa: PLC0415 - Pillow, only when a test sends an image

        bitmap = decode_image(data, param=param, max_pixels=self.max_pixels)
        digest = hashlib.sha256(f"{bitmap.width}x{bitmap.height}:".encode() + bitmap.rgb).digest()
        image = PromptImage(
            tokens=stand_in_ids(digest, self.n_positions),
            start=0,
            n_positions=self.n_positions,
            digest=digest.hex(),
            handle=bitmap,
        )
        self.read.append(image)
        return image


@attrs.frozen
class _KvMirror:
    """A slot's "KV sequence": the last prompt it ran."""

    kv: dict[int, tuple[int, ...]]
    slot_id: int
    sets: dict[int, AdapterSet]  # the adapter set each slot's prompt ran under

    @property
    def n_tokens(self) -> int:
        return len(self.kv.get(self.slot_id, ()))

    @property
    def adapters(self) -> AdapterSet:
        return self.sets.get(self.slot_id, NO_ADAPTERS)

    def head(self, n: int) -> tuple[int, ...]:
        return self.kv.get(self.slot_id, ())[:n]


class FakeEngine(SlotEngine):
    """Replays ``script.reply`` one word-ish piece at a time; it sleeps by forgetting its slots' prompts."""

    can_sleep = True
    release_wait_s = RELEASE_WAIT_S
    slot_action_wait_s = SLOT_ACTION_WAIT_S

    def __init__(
        self,
        info: ModelInfo | None = None,
        script: FakeScript | None = None,
        *,
        n_slots: int = 1,
        similarity: float = 0.1,
        embedder: FakeEmbedder | None = None,
        vision: FakeVision | None = None,
        lora: Sequence[LoraAdapter] = (),
    ) -> None:
        super().__init__(info or fake_model_info(), n_slots=n_slots, similarity=similarity, lora=lora)
        self.embedder = embedder
        self.vision = vision
        self.script = script or FakeScript()
        self.requests: list[GenerationRequest] = []
        self.slots_used: list[int] = []  # the slot each request ran in, in order
        self.cancelled = 0  # generations cut short by cancellation
        self.closed = False
        self.compiled: list[tuple[GrammarSpec, str]] = []  # every grammar compiled, with its text
        self._kv: dict[int, tuple[int, ...]] = {}  # each slot's last prompt
        self._kv_sets: dict[int, AdapterSet] = {}  # ... and the LoRA adapter set it ran under
        self.loads = 1  # times the "model" was loaded (1 + wake-ups)
        for slot in self.slots:
            slot.mirror = _KvMirror(self._kv, slot.id, self._kv_sets)

    def _fall_asleep(self) -> None:
        self._kv.clear()
        self._kv_sets.clear()

    def _wake_up(self) -> None:
        self.loads += 1

    def compile_grammar(self, spec: GrammarSpec) -> str:
        """The converted text, as the real engine makes it (the fake samples no grammar); recorded."""
        from ._grammar import to_gbnf  # noqa: PLC0415 - llama.cpp's converter, only when a test needs it

        text = to_gbnf(spec)
        self.compiled.append((spec, text))
        return text

    async def _produce(
        self, slot: Slot, request: GenerationRequest, send: trio.MemorySendChannel[EngineEvent]
    ) -> None:
        self.requests.append(request)
        self.slots_used.append(slot.id)
        try:
            await self._replay(slot, request, send)
        except trio.Cancelled:
            self.cancelled += 1
            raise

    async def _replay(
        self, slot: Slot, request: GenerationRequest, send: trio.MemorySendChannel[EngineEvent]
    ) -> None:
        script = self.script
        prompt = request.prompt_tokens
        adapters = adapter_set(request.lora or ())
        same_adapters = self._kv_sets.get(slot.id, NO_ADAPTERS) == adapters
        cached = common_prefix(self._kv.get(slot.id, ()), prompt, len(prompt) - 1) if same_adapters else 0
        started = time.perf_counter()
        slot.reused(cached)
        await send.send(  # the first progress report, before the prompt is read (as the real engine's)
            PromptProgress(total=len(prompt), cached=cached, processed=0, elapsed_ms=0.0, slot_id=slot.id)
        )
        await trio.sleep(script.prefill_delay)
        slot.evaluated(len(prompt) - cached)
        slot.holds(len(prompt))
        self._kv[slot.id] = prompt
        self._kv_sets[slot.id] = adapters
        await send.send(
            PromptProgress(
                total=len(prompt),
                cached=cached,
                processed=len(prompt) - cached,
                elapsed_ms=(time.perf_counter() - started) * 1000,
                slot_id=slot.id,
            )
        )
        prompt_ms = (time.perf_counter() - started) * 1000
        slot.prompt_took(prompt_ms / 1000)
        generated = time.perf_counter()
        ending = EndPolicy(
            request,
            eog=self._info.eog_token_ids,
            n_ctx_train=self._info.n_ctx_train,
            fits=lambda n: len(prompt) + n < self._info.n_ctx,
            clock=trio.current_time,
        )
        pieces = script.pieces if script.pieces is not None else self._words(request)
        upcoming = collections.deque((100 + index, piece) for index, piece in enumerate(pieces))
        cause = StopCause.EOS  # the reply ran out, as if the model ended it
        if ending.nothing_to_generate:
            cause = StopCause.LIMIT
            upcoming.clear()
        while upcoming:
            token, piece = upcoming.popleft()
            if script.fail_after is not None and ending.n_generated >= script.fail_after:
                raise EngineFailure("the fake engine failed as scripted")
            await trio.sleep(script.piece_delay)
            slot.generated()
            self._pool.changed()
            verdict = ending.take(token, piece)
            released = verdict.text
            if verdict.cause is None and not upcoming and not verdict.insert:
                released += ending.flush()
            logprob = None
            if request.n_probs is not None:
                logprob = TokenLogprob(
                    token_id=token,
                    piece=piece,
                    logprob=-0.5,
                    top=tuple(
                        TopLogprob(token_id=token + k, piece=piece, logprob=-0.5 - k)
                        for k in range(request.n_probs)
                    ),
                )
            await send.send(TokenGenerated(token_id=token, text=released, logprob=logprob))
            if verdict.cause is not None:
                cause = verdict.cause
                break
            upcoming.extendleft(reversed([(t, script.vocabulary.get(t, b"")) for t in verdict.insert]))
        predicted_ms = (time.perf_counter() - generated) * 1000
        slot.generation_took(predicted_ms / 1000)
        await send.send(
            GenerationFinished(
                cause=cause,
                stop_word=ending.stop_word,
                stats=GenerationStats(
                    prompt_tokens=len(prompt),
                    cached_tokens=cached,
                    prompt_ms=prompt_ms,
                    completion_tokens=ending.n_generated,
                    predicted_ms=predicted_ms,
                    cache=CacheReport(hit=True, miss_reason=None) if cached else CacheReport(),
                    slot_id=slot.id,
                ),
            )
        )

    async def _save_slot(self, slot: Slot, path: Path) -> SlotFile:
        """The slot's tokens, as JSON (the fake has no KV state)."""
        tokens = list(self._kv.get(slot.id, ()))
        adapters = adapter_set(self._lora_scales)  # the fake keeps no set per slot: the global one

        def save() -> SlotFile:
            self._file_call()
            path.write_text(json.dumps({"fake_slot": tokens}), encoding="utf-8")
            return SlotFile(n_tokens=len(tokens), n_bytes=path.stat().st_size, adapters=adapters)

        return await self._on_file_thread(save, "a slot save")

    async def _restore_slot(self, slot: Slot, path: Path) -> SlotFile:
        """The tokens of a file :meth:`_save_slot` wrote; anything else fails as llama.cpp would."""
        self._kv.pop(slot.id, None)

        def restore() -> tuple[tuple[int, ...], int]:
            self._file_call()
            try:
                return tuple(json.loads(path.read_text(encoding="utf-8"))["fake_slot"]), path.stat().st_size
            except (OSError, ValueError, KeyError, TypeError):
                raise EngineFailure(f"the fake engine could not restore the slot from {path.name}") from None

        tokens, n_bytes = await self._on_file_thread(restore, "a slot restore")
        self._kv[slot.id] = tokens
        return SlotFile(n_tokens=len(tokens), n_bytes=n_bytes, adapters=adapter_set(self._lora_scales))

    def _file_call(self) -> None:
        """Where llama.cpp's file call would run (on the file thread): the script's hook, if any."""
        if self.script.slot_file_call is not None:
            self.script.slot_file_call()

    async def _on_file_thread(self, work: Callable[[], T], what: str) -> T:
        """*work*'s result, run on a thread of its own and waited for as the real engine's decode thread."""
        return await cross(
            _on_a_thread_of_its_own,
            work,
            what=what,
            start_within_s=self.release_wait_s,
            finish_within_s=self.slot_action_wait_s,
            lose=self._lose_to_a_stuck_thread,
        )

    async def _erase_slot(self, slot: Slot) -> int:
        return len(self._kv.pop(slot.id, ()))

    def _words(self, request: GenerationRequest) -> tuple[bytes, ...]:
        reply = self.script.reply(request) if callable(self.script.reply) else self.script.reply
        return tuple(word.encode() for word in _PIECES.findall(reply))

    def close(self) -> None:
        """Record that the server freed the engine."""
        self.closed = True


def _on_a_thread_of_its_own(job: Job) -> None:
    """Start *job* at once on a new thread (the fake's stand-in for the decode thread)."""
    threading.Thread(target=job.execute, name="bubo-fake-slot-file", daemon=True).start()
