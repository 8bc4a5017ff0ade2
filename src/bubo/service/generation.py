"""Admission and output: from token ids to a stream of parsed output events.

``prepare_*`` (here and in :mod:`.chat`) do everything that can fail on bad
input before anything is queued or streamed (render, tokenize, context check,
logit-bias resolution, grammars), so those errors become ordinary HTTP errors.
:func:`open_output` then waits for the slot and yields the output events;
:func:`collect` gathers them for a non-streaming response.
"""

from __future__ import annotations

import functools
import math
from collections.abc import AsyncIterator, Mapping
from contextlib import AbstractAsyncContextManager, aclosing, asynccontextmanager
from typing import Any

import attrs
import trio

from bubo.domain.generation import (
    GenerationRequest,
    GrammarSpec,
    PromptProgress,
    TokenLogprob,
)
from bubo.domain.messages import ToolCall
from bubo.domain.output import (
    Completion,
    Done,
    OutputEvent,
    OutputPart,
    ReasoningDelta,
    TextDelta,
    ToolCallArgumentsDelta,
    ToolCallStart,
)
from bubo.domain.requests import CompletionRequest, GenerationOptions, OutputFormat
from bubo.domain.sampling import BANNED, SamplingParams
from bubo.engine import EngineFailure, GrammarRejected, ModelInfo, logprob_bytes, request_scales
from bubo.errors import ContextOverflow, InvalidRequest, NotImplementedOnThisModel, QueueFull
from bubo.grammar import check_request_grammar, check_schema, output_grammar

from .latency import RequestTimeline
from .output import OutputPlan, output_events
from .prompt import RenderedPrompt, image_work_bytes, reading_images, tokenize_raw
from .runtime import Runtime
from .work import PREPARE_BYTES_PER_CHAR

__all__ = [
    "PreparedGeneration",
    "bias_chars",
    "collect",
    "generation_request",
    "most_new_tokens",
    "open_output",
    "prepare_completion",
    "require_generation",
    "schema_grammar",
]

# What a client told that the queue is full should wait before trying again, in seconds.
QUEUE_RETRY_AFTER_S = 5


@attrs.frozen(kw_only=True)
class PreparedGeneration:
    """A request that passed every check and only waits for the slot."""

    prompt: RenderedPrompt
    request: GenerationRequest
    plan: OutputPlan = attrs.field(factory=OutputPlan)


def require_generation(runtime: Runtime) -> None:
    """Refuse generation on a model that cannot generate (an encoder: embeddings or ranking only).

    Raises:
        NotImplementedOnThisModel: llama-server's 501 for completions on an embedding-only server.

    """
    if not runtime.engine.info.generates:
        embedder = runtime.engine.embedder
        serves = "/rerank" if embedder is not None and embedder.pooling == "rank" else "/v1/embeddings"
        raise NotImplementedOnThisModel(
            f"this model does not generate text: it is an encoder ({runtime.engine.info.architecture}), "
            f"served for {serves} only"
        )


async def prepare_completion(runtime: Runtime, request: CompletionRequest) -> PreparedGeneration:
    """Check, tokenize and plan a raw-prompt request by the workers (off the event loop); compile its grammar.

    The grammar or schema is checked in the same job, before the prompt is tokenized.

    Raises:
        NotImplementedOnThisModel: the model cannot generate (:func:`require_generation`).

    """
    require_generation(runtime)

    def prepare() -> tuple[PreparedGeneration, tuple[GrammarSpec, str] | None, OutputFormat | None]:
        planned: tuple[GrammarSpec, str] | None = None
        checked: OutputFormat | None = None  # the answer is checked against its schema once it ends
        if request.grammar is not None:
            check_request_grammar(request.grammar.rules, request.grammar.param)
            planned = GrammarSpec(rules=request.grammar.rules), request.grammar.param
        elif request.output_format is not None:
            output = request.output_format
            checked = attrs.evolve(output, schema=check_schema(output.schema, output.param))
            planned = output_grammar(checked.schema, starts_inside=False, may_think=False), output.param
        rendered = tokenize_raw(
            runtime,
            request.prompt,
            n_ctx=runtime.engine.info.n_ctx,
            images=request.images,
            media_marker=request.media_marker,
        )
        prepared = PreparedGeneration(
            prompt=rendered,
            request=generation_request(runtime, rendered, request.options, prompt_param="prompt"),
        )
        return prepared, planned, checked

    chars = sum(len(p) for p in request.prompt if isinstance(p, str)) + bias_chars(request.options)
    need_bytes = chars * PREPARE_BYTES_PER_CHAR + image_work_bytes(runtime, request.images)
    async with reading_images(runtime, request.images):
        prepared, planned, checked = await runtime.workers.run(prepare, need_bytes=need_bytes)
    grammar = runtime.default_grammar if planned is None else await compile_grammar(runtime, *planned)
    plan = OutputPlan() if checked is None else OutputPlan(schema=checked.schema, schema_param=checked.param)
    return attrs.evolve(prepared, request=attrs.evolve(prepared.request, grammar=grammar), plan=plan)


def schema_grammar(schema: Mapping[str, Any], param: str) -> GrammarSpec:
    """The grammar of a whole answer that is a JSON value of *schema* (``json_schema``, ``--json-schema``).

    Raises:
        InvalidRequest: the schema asks for what no grammar enforces, or too much; ``param`` below *param*.

    """
    return output_grammar(check_schema(schema, param), starts_inside=False, may_think=False)


async def compile_grammar(runtime: Runtime, spec: GrammarSpec, param: str) -> str:
    """*spec* as checked GBNF, compiled by the workers (off the event loop) before the request queues.

    Raises:
        InvalidRequest: llama.cpp cannot take it; *param* names the request field it came from.

    """
    try:
        async with runtime.engine.awake():  # llama.cpp checks it with the model's vocabulary
            return await runtime.workers.run(functools.partial(runtime.engine.compile_grammar, spec))
    except GrammarRejected as error:
        raise InvalidRequest(error.message, code=error.code, param=param) from None


def bias_chars(options: GenerationOptions) -> int:
    """The size of a request's logit bias, for the work estimate (its texts are tokenized)."""
    return sum(len(target) if isinstance(target, str) else 1 for target, _ in options.sampling.logit_bias)


def generation_request(
    runtime: Runtime, rendered: RenderedPrompt, options: GenerationOptions, *, prompt_param: str
) -> GenerationRequest:
    """The engine request for a rendered prompt, after the context check (run it on a worker thread).

    Raises:
        InvalidRequest: an empty prompt or a bad logit bias.
        ContextOverflow: the prompt does not fit the context.

    """
    n_ctx = runtime.engine.info.n_ctx
    n_prompt = len(rendered.tokens)
    if n_prompt == 0:
        raise InvalidRequest("the prompt is empty", param=prompt_param)
    if n_prompt >= n_ctx:
        raise ContextOverflow(n_prompt_tokens=n_prompt, n_ctx=n_ctx, param=prompt_param)
    max_tokens = runtime.defaults.n_predict if options.max_tokens is None else options.max_tokens
    if runtime.memory_guard is not None:
        vision = runtime.engine.vision
        runtime.memory_guard.admit(
            min(n_ctx, n_prompt + max_tokens) if max_tokens >= 0 else n_ctx,
            output_bytes=most_new_tokens(runtime.engine.info, n_prompt, max_tokens)
            * logprob_bytes(options.n_probs),
            image_bytes=vision.encoder_bytes if rendered.images and vision is not None else 0,
        )
    sampling = _sampling(runtime, options)
    runtime.engine.prepare_sampling(sampling)  # on this worker thread, not the decode thread
    return GenerationRequest(
        prompt_tokens=rendered.tokens,
        max_new_tokens=max_tokens if max_tokens >= 0 else None,
        sampling=sampling,
        stop=options.stop,
        ignore_eos=options.ignore_eos,
        n_probs=options.n_probs,
        time_limit_ms=options.time_limit_ms,
        slot=options.slot,
        n_keep=runtime.defaults.n_keep if options.n_keep is None else options.n_keep,
        cache_prompt=options.cache_prompt,
        n_indent=options.n_indent,
        post_sampling_probs=options.post_sampling_probs,
        speculative=runtime.defaults.speculative.with_overrides(options.speculative),
        lora=_lora(runtime, options),
        images=rendered.images,
    )


def most_new_tokens(info: ModelInfo, n_prompt: int, max_tokens: int) -> int:
    """The most tokens a generation after *n_prompt* prompt tokens may produce (*max_tokens* -1: no limit).

    Without context shift the context's end ends it.  With it, the model's
    training context does, whatever the limit (the engine's ``EndPolicy``;
    llama-server caps only ``n_predict`` -1 there): a shifting generation with a
    limit of billions would otherwise hold its slot and its output for days.
    """
    end = info.n_ctx_train if info.context_shift else min(info.n_ctx, info.n_ctx_train)
    if max_tokens >= 0:
        return max(0, min(max_tokens, (end if info.context_shift else info.n_ctx) - n_prompt))
    return max(1, end - n_prompt)


def _lora(runtime: Runtime, options: GenerationOptions) -> tuple[float, ...] | None:
    """Every adapter's scale for the request's own ``lora`` (those it names, the others at 0); None: global.

    Raises:
        InvalidRequest: an id names no loaded adapter (``param``: ``lora[i].id``).

    """
    if options.lora is None:
        return None
    return request_scales(options.lora, len(runtime.engine.lora_adapters), "lora")


def _sampling(runtime: Runtime, options: GenerationOptions) -> SamplingParams:
    """The request's sampling over the server's defaults, its logit bias resolved to token ids.

    With ``ignore_eos`` every end-of-generation token is banned too, as llama-server bans them (its
    ``generation_settings.logit_bias`` shows them).
    """
    sampling = runtime.defaults.sampling.with_overrides(options.sampling)
    eog = sorted(runtime.engine.info.eog_token_ids) if options.ignore_eos else []
    if not options.sampling.logit_bias and not eog:
        return sampling
    tokenizer = runtime.tokenizer
    if len(options.sampling.logit_bias) > tokenizer.n_vocab:
        raise InvalidRequest(
            f"logit_bias has {len(options.sampling.logit_bias)} entries, more than the model's "
            f"{tokenizer.n_vocab} tokens",
            param="logit_bias",
        )
    biases: dict[int, float] = dict(sampling.logit_bias)
    for index, (target, bias) in enumerate(options.sampling.logit_bias):
        if isinstance(target, str):
            token_ids = tokenizer.encode(target, parse_special=False)
        elif 0 <= target < tokenizer.n_vocab:
            token_ids = [target]
        else:
            raise InvalidRequest(
                f"logit_bias names token {target}, outside the vocabulary (0..{tokenizer.n_vocab - 1})",
                param=f"logit_bias[{index}]",
            )
        if math.isnan(bias):
            raise InvalidRequest("a logit bias must be a number", param=f"logit_bias[{index}]")
        for token_id in token_ids:
            biases[token_id] = bias
    for token_id in eog:
        biases[token_id] = BANNED
    return attrs.evolve(sampling, logit_bias=tuple(biases.items()))


def open_output(
    runtime: Runtime, prepared: PreparedGeneration, timeline: RequestTimeline
) -> AbstractAsyncContextManager[AsyncIterator[OutputEvent]]:
    """Admit the request to the queue now; entering the result waits for the slot and yields the output.

    The queue check happens here, not on entry, so that a streaming handler
    refuses with a 503 before its response headers are sent.  Leaving the
    block early (a client that disconnects) cancels the decode.  *timeline*
    measures the request's latencies (:mod:`.latency`) from entry to exit.

    Raises:
        QueueFull: ``max_queue`` requests already wait for a slot.

    """
    engine = runtime.engine
    if runtime.max_queue is not None and engine.requests_running >= engine.n_slots:
        waiting = engine.requests_waiting
        if waiting >= runtime.max_queue:
            raise QueueFull(
                f"every slot is busy and {waiting} requests already wait "
                f"(at most {runtime.max_queue} may); retry shortly",
                retry_after_s=QUEUE_RETRY_AFTER_S,
            )
    return _output(runtime, prepared, timeline)


@asynccontextmanager
async def _output(
    runtime: Runtime, prepared: PreparedGeneration, timeline: RequestTimeline
) -> AsyncIterator[AsyncIterator[OutputEvent]]:
    asked = trio.current_time()
    try:
        async with runtime.engine.open_generation(prepared.request) as events:
            timeline.slot_held(asked)
            async with aclosing(output_events(timeline.watch(events), prepared.plan)) as output:
                yield output
    except Exception:  # trio.Cancelled (the client left) is a BaseException: that outcome stays cancelled
        timeline.failed()
        raise
    finally:
        timeline.ended()


async def collect(output: AsyncIterator[OutputEvent]) -> Completion:
    """Gather a whole generation for a non-streaming response, its parts in generation order."""
    runs: list[tuple[type[TextDelta | ReasoningDelta] | ToolCallStart, list[str]]] = []
    logprobs: list[TokenLogprob] = []
    token_ids: list[int] = []
    arguments: dict[int, list[str]] = {}
    async for event in output:
        match event:
            case TextDelta() | ReasoningDelta():
                if isinstance(event, TextDelta):
                    logprobs.extend(event.logprobs)
                    token_ids.extend(event.token_ids)
                if event.text:
                    if not runs or runs[-1][0] is not type(event):
                        runs.append((type(event), []))
                    runs[-1][1].append(event.text)
            case ToolCallStart():
                arguments[event.index] = []
                runs.append((event, arguments[event.index]))
            case ToolCallArgumentsDelta():
                arguments[event.index].append(event.fragment)
            case PromptProgress():
                pass
            case Done():
                return Completion(
                    parts=tuple(_part(*run) for run in runs),
                    logprobs=tuple(logprobs),
                    done=event,
                    token_ids=tuple(token_ids),
                )
    raise EngineFailure("the generation ended without a result")


def _part(kind: type[TextDelta | ReasoningDelta] | ToolCallStart, pieces: list[str]) -> OutputPart:
    if isinstance(kind, ToolCallStart):
        return ToolCall(id=kind.id, name=kind.name, arguments="".join(pieces))
    return kind(text="".join(pieces))
