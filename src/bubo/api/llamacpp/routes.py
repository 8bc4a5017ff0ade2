"""llama-server routes: completion, apply-template, tokenize, detokenize, props, slots, metrics."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable
from contextlib import AbstractAsyncContextManager, aclosing, asynccontextmanager
from typing import Any, cast

import attrs
import trio
from quart import Blueprint, Response, request

from bubo.api._capabilities import llama_server_capabilities
from bubo.api._chat.reading import chat_request_without_model, on_the_prompt
from bubo.api._context import api_context, read_body, request_timeline, require_runtime, structured_body
from bubo.api._errors import error_envelope
from bubo.api._images import shown_without_images
from bubo.api._json import dumps, json_response, unstructure
from bubo.api._progress import LiveTimings, progress
from bubo.api._sse import COMMENT_KEEPALIVE, sse_frame, sse_response
from bubo.domain.generation import PromptProgress
from bubo.domain.output import Completion, Done, OutputEvent, TextDelta
from bubo.domain.requests import CompletionRequest
from bubo.errors import BuboError, InvalidRequest, NotImplementedOnThisModel
from bubo.service.chat import render_chat_request
from bubo.service.generation import PreparedGeneration, collect, open_output, prepare_completion
from bubo.service.prompt import raw_tokens
from bubo.service.runtime import Runtime
from bubo.service.work import PREPARE_BYTES_PER_CHAR

from . import translate, wire
from .metrics import CONTENT_TYPE, render_metrics

__all__ = ["answer_completion", "blueprint", "check_id_slot"]

blueprint = Blueprint("llamacpp", __name__)

MAX_TOKENS = 1 << 20
"""The most token ids one ``/tokenize`` answer or ``/detokenize`` request holds (1,048,576: more than
any model's context; a 10 MB text is about 2.2 million)."""
MAX_PROMPTS = 64
"""The most prompts one ``/completion`` request holds (each is a generation of its own)."""


@attrs.frozen(kw_only=True)
class _StreamOptions:
    """What a ``/completion`` stream's chunks carry, as the request asks."""

    n_probs: bool
    progress: bool = False  # return_progress
    fields: list[str] | None = None  # response_fields
    timings_per_token: bool = False
    post_sampling: bool = False  # post_sampling_probs


class _CompletionStream:
    """One prompt's ``/completion`` chunks: one per token, then the full result; no ``[DONE]``.

    Each chunk's ``tokens`` carries its token ids whether or not ``return_tokens`` asks, as
    llama-server's stream does (``return_tokens`` is for the whole answer's ids, which a stream's last
    chunk leaves empty); ``fields`` (``response_fields``) projects the final result.

    Keep-alives are the SSE comment: llama-server sends no data line while it reads a
    prompt, so one would be a chunk its clients never saw from it.  A client that asked
    for ``return_progress`` reads progress chunks, so while its prompt is read the
    keep-alive is the last ``prompt_progress`` chunk again (the comment before the first).
    """

    def __init__(
        self, settings: wire.GenerationSettings, prompt: str, options: _StreamOptions, *, index: int = 0
    ) -> None:
        self._settings = settings
        self._prompt = prompt
        self._n_probs = options.n_probs
        self._progress = options.progress
        self._fields = options.fields
        self._post_sampling = options.post_sampling
        self._index = index
        self._live = LiveTimings() if options.timings_per_token else None
        self._predicted = 0
        self._evaluated = 0
        self._slot = 0  # the slot evaluating the prompt (known from its first progress event)
        self._has_new_line = False
        self._read: PromptProgress | None = None  # the last progress while the prompt is read, else None

    def opening(self) -> Iterable[bytes]:
        return ()

    def _chunk(self, chunk: wire.CompletionChunk) -> list[bytes]:
        if self._live is not None:
            chunk = attrs.evolve(chunk, timings=self._live.now())
        return [sse_frame(dumps(unstructure(chunk)))]

    def encode(self, event: OutputEvent) -> Iterable[bytes]:
        if self._live is not None:
            self._live.saw(event)
        match event:
            case PromptProgress() if self._progress:
                self._evaluated = event.total
                self._slot = event.slot_id
                self._read = event
                return self._progress_chunk(event)
            case PromptProgress():
                self._evaluated = event.total
                self._slot = event.slot_id
            case TextDelta(text=text, token_ids=token_ids, logprobs=entries):
                self._read = None
                self._predicted += len(token_ids)
                self._has_new_line = self._has_new_line or "\n" in text
                if not text and not (self._n_probs and entries) and not token_ids:
                    return ()
                return self._chunk(
                    wire.CompletionChunk(
                        index=self._index,
                        content=text,
                        tokens=list(token_ids),
                        id_slot=self._slot,
                        tokens_predicted=self._predicted,
                        tokens_evaluated=self._evaluated,
                        completion_probabilities=(
                            translate.probabilities(entries, post_sampling=self._post_sampling)
                            if self._n_probs
                            else None
                        ),
                    )
                )
            case Done():
                self._read = None
                result = translate.completion_result(
                    content="",
                    done=event,
                    settings=self._settings,
                    prompt=self._prompt,
                    probabilities=None,
                    has_new_line=self._has_new_line,
                    index=self._index,
                )
                return [sse_frame(dumps(_final(result, self._fields)))]
        return ()

    def _progress_chunk(self, event: PromptProgress) -> list[bytes]:
        return self._chunk(
            wire.CompletionChunk(
                index=self._index,
                content="",
                tokens=[],
                id_slot=event.slot_id,
                tokens_predicted=0,
                tokens_evaluated=event.total,
                prompt_progress=progress(event),
            )
        )

    def error(self, error: BuboError) -> Iterable[bytes]:
        return [sse_frame(dumps(unstructure(error_envelope(error, llama_server=True))))]

    def keepalive(self) -> Iterable[bytes]:
        """The last progress chunk again while a ``return_progress`` prompt is read; else the comment."""
        return [COMMENT_KEEPALIVE] if self._read is None else self._progress_chunk(self._read)


@attrs.frozen
class _Indexed:
    """An output event of prompt number ``index`` of a request with several."""

    index: int
    event: OutputEvent


class _SideBySideStream:
    """Several prompts' chunks, interleaved as they come, each carrying its prompt's ``index``."""

    def __init__(self, streams: list[_CompletionStream]) -> None:
        self._streams = streams

    def opening(self) -> Iterable[bytes]:
        return ()

    def encode(self, event: OutputEvent) -> Iterable[bytes]:
        indexed = cast("_Indexed", event)  # what _side_by_side yields
        return self._streams[indexed.index].encode(indexed.event)

    def error(self, error: BuboError) -> Iterable[bytes]:
        return self._streams[0].error(error)

    def keepalive(self) -> Iterable[bytes]:
        return [COMMENT_KEEPALIVE]


@asynccontextmanager
async def _side_by_side(
    outputs: list[AbstractAsyncContextManager[AsyncIterator[OutputEvent]]],
) -> AsyncIterator[AsyncIterator[OutputEvent]]:
    """Run every output at once; their events merged as they come, each as an :class:`_Indexed`.

    The first error of any ends the merged stream (the others are cancelled on exit).
    """
    send, receive = trio.open_memory_channel[tuple[int, OutputEvent | Exception]](0)

    async def pump(
        index: int,
        output: AbstractAsyncContextManager[AsyncIterator[OutputEvent]],
        sender: trio.MemorySendChannel[tuple[int, OutputEvent | Exception]],
    ) -> None:
        async with sender:
            try:
                async with output as events:
                    async for event in events:
                        await sender.send((index, event))
            except Exception as error:  # noqa: BLE001 - reported in the stream by its reader
                await sender.send((index, error))

    async def merged() -> AsyncGenerator[OutputEvent, None]:
        async for index, item in receive:
            if isinstance(item, Exception):
                raise item
            yield cast("OutputEvent", _Indexed(index, item))

    async with trio.open_nursery() as nursery:
        async with send:
            for index, output in enumerate(outputs):
                nursery.start_soon(pump, index, output, send.clone())
        try:
            async with aclosing(merged()) as events:
                yield events
        finally:
            nursery.cancel_scope.cancel()


def _final(result: wire.CompletionResult, fields: list[str] | None) -> dict[str, Any]:
    """The final result as JSON data, projected to ``response_fields`` when the request names some.

    An empty ``response_fields`` names none: the whole result, as llama-server answers it.
    """
    data: dict[str, Any] = unstructure(result)
    return translate.project(data, fields) if fields else data


@blueprint.post("/completion")
@blueprint.post("/completions")
async def completion() -> Response:
    """Raw-prompt completion; needs no model.  Several prompts are answered side by side, in order."""
    runtime = require_runtime()

    def translated(body: wire.CompletionRequest) -> list[CompletionRequest]:
        if body.model is not None:
            runtime.check_model(body.model)
        check_id_slot(runtime, body.id_slot)
        prompts = translate.prompts(body, takes_images=runtime.engine.vision is not None)
        if len(prompts) > MAX_PROMPTS:
            raise InvalidRequest(
                f"at most {MAX_PROMPTS} prompts in one request, got {len(prompts)}", param="prompt"
            )
        return [translate.completion_request(body, prompt.pieces, prompt.images) for prompt in prompts]

    body, requests = await read_body(runtime, wire.CompletionRequest, translated)
    prepared = [await prepare_completion(runtime, one) for one in requests]
    return await answer_completion(runtime, body, prepared)


def check_id_slot(runtime: Runtime, id_slot: int | None) -> None:
    """400 unless *id_slot* is absent, -1 (any slot) or a slot's id."""
    n_slots = runtime.engine.n_slots
    if id_slot not in (None, -1) and not 0 <= id_slot < n_slots:
        raise InvalidRequest(
            f"id_slot must be -1 (any slot) or a slot id from 0 to {n_slots - 1}; got {id_slot}",
            param="id_slot",
        )


async def answer_completion(
    runtime: Runtime, body: wire.CompletionRequest, prepared: list[PreparedGeneration]
) -> Response:
    """Run each of *prepared* side by side and answer as ``/completion`` does (``/infill`` too)."""
    stream = bool(body.stream)
    model = body.model or runtime.model_id
    n_ctx = runtime.engine.info.n_ctx
    settings = [
        translate.generation_settings(p.request, n_ctx=n_ctx, model=model, stream=stream) for p in prepared
    ]
    n_probs = bool(prepared[0].request.n_probs)
    outputs = [open_output(runtime, p, request_timeline()) for p in prepared]
    post_sampling = bool(body.post_sampling_probs)
    if stream:
        options = _StreamOptions(
            n_probs=n_probs,
            progress=bool(body.return_progress),
            fields=body.response_fields,
            timings_per_token=bool(body.timings_per_token),
            post_sampling=post_sampling,
        )
        streams = [
            _CompletionStream(s, p.prompt.text, options, index=index)
            for index, (s, p) in enumerate(zip(settings, prepared, strict=True))
        ]
        if len(outputs) == 1:
            return sse_response(outputs[0], streams[0])
        return sse_response(_side_by_side(outputs), _SideBySideStream(streams))
    completions = await _collect_all(outputs)
    results = [
        _final(
            translate.completion_result(
                content=c.text,
                done=c.done,
                settings=s,
                prompt=p.prompt.text,
                probabilities=(
                    translate.probabilities(c.logprobs, post_sampling=post_sampling) if n_probs else None
                ),
                has_new_line="\n" in c.text,
                tokens=c.token_ids if body.return_tokens else (),
                index=index,
            ),
            body.response_fields,
        )
        for index, (c, s, p) in enumerate(zip(completions, settings, prepared, strict=True))
    ]
    return json_response(results[0] if len(results) == 1 else results)


async def _collect_all(
    outputs: list[AbstractAsyncContextManager[AsyncIterator[OutputEvent]]],
) -> list[Completion]:
    """Every output collected, side by side; the first error cancels the others and is raised."""
    if len(outputs) == 1:
        async with outputs[0] as events:
            return [await collect(events)]
    done: dict[int, Completion] = {}
    errors: list[Exception] = []

    async def run(index: int, output: AbstractAsyncContextManager[AsyncIterator[OutputEvent]]) -> None:
        try:
            async with output as events:
                done[index] = await collect(events)
        except Exception as error:  # noqa: BLE001 - raised below, once the others are cancelled
            errors.append(error)
            nursery.cancel_scope.cancel()

    async with trio.open_nursery() as nursery:
        for index, output in enumerate(outputs):
            nursery.start_soon(run, index, output)
    if errors:
        raise errors[0]
    return [done[index] for index in range(len(outputs))]


@blueprint.post("/apply-template")
async def apply_template() -> Response:
    """The chat-completions body rendered as prompt text, as generation renders it; no model needed.

    Images are shown as llama.cpp's ``<__media__>`` marker, not read (:func:`shown_without_images`).
    """
    runtime = require_runtime()
    chat = await chat_request_without_model(runtime)
    shown = attrs.evolve(chat, prompt=shown_without_images(chat.prompt))
    rendered = await on_the_prompt(runtime, shown, lambda: render_chat_request(runtime, shown))
    return json_response({"prompt": rendered.text})


@blueprint.post("/tokenize")
async def tokenize() -> Response:
    """Text to token ids, llama-server semantics (no template; ``add_special`` off by default)."""
    runtime = require_runtime()
    body = await structured_body(runtime, wire.TokenizeRequest, _at_most_max_tokens("content"))
    content = body.content if body.content is not None else ""
    pieces = (content,) if isinstance(content, str) else tuple(content)
    chars = sum(len(p) if isinstance(p, str) else 1 for p in pieces)
    text = await runtime.workers.run(
        lambda: _tokenized(runtime, body, pieces), need_bytes=chars * PREPARE_BYTES_PER_CHAR
    )
    return Response(text, content_type="application/json")


def _tokenized(runtime: Runtime, body: wire.TokenizeRequest, pieces: tuple[int | str, ...]) -> str:
    """The ``/tokenize`` answer as JSON text (a job for the workers)."""
    tokenizer = runtime.tokenizer
    ids = raw_tokens(
        tokenizer,
        pieces,
        param="content",
        room=MAX_TOKENS,
        overflow=lambda _n_tokens, _at_least: _too_many_tokens("content", "gives"),
        bos="always" if body.add_special else "never",
        parse_special=body.parse_special is not False,
    )
    if body.with_pieces:
        result = wire.Tokens(
            tokens=[wire.TokenPiece(id=t, piece=translate.token_piece(tokenizer.token_bytes(t))) for t in ids]
        )
    else:
        result = wire.Tokens(tokens=ids)
    return dumps(unstructure(result))


def _at_most_max_tokens(field: str) -> Callable[[dict[str, Any]], None]:
    """A body check: the array *field* holds at most ``MAX_TOKENS`` items (before each is checked)."""

    def check(data: dict[str, Any]) -> None:
        value = data.get(field)
        if isinstance(value, list) and len(value) > MAX_TOKENS:
            raise _too_many_tokens(field, "has")

    return check


def _too_many_tokens(param: str, verb: str) -> InvalidRequest:
    return InvalidRequest(
        f"{param} {verb} more than {MAX_TOKENS} tokens, the most one request may; send it in parts",
        param=param,
    )


@blueprint.post("/detokenize")
async def detokenize() -> Response:
    """Token ids to text."""
    runtime = require_runtime()
    body = await structured_body(runtime, wire.DetokenizeRequest, _at_most_max_tokens("tokens"))
    tokens = body.tokens or []
    tokenizer = runtime.tokenizer

    def detokenized() -> str:
        n_vocab = tokenizer.n_vocab
        for index, token in enumerate(tokens):
            if not 0 <= token < n_vocab:
                raise InvalidRequest(f"token id {token} is outside the vocabulary", param=f"tokens[{index}]")
        return dumps(unstructure(wire.Detokenized(content=tokenizer.decode(tokens))))

    # the answer holds up to the longest token's text per id (16 bytes where the vocabulary gives no bound)
    per_token = tokenizer.max_token_bytes or 16
    text = await runtime.workers.run(detokenized, need_bytes=len(tokens) * per_token * PREPARE_BYTES_PER_CHAR)
    return Response(text, content_type="application/json")


@blueprint.get("/props")
async def props() -> Response:
    """Model names, template and default settings; ``?model=`` must name the served model."""
    runtime = require_runtime()
    if "model" in request.args:
        runtime.check_model(request.args["model"])
    info = runtime.engine.info
    template = runtime.template
    caps = template.capabilities
    return json_response(
        wire.Props(
            model=runtime.model_id,
            model_alias=runtime.model_names[-1],
            model_path=info.path,
            model_info=wire.ModelInfo(
                architecture=info.architecture,
                description=info.description,
                n_params=info.n_params,
                size=info.size_bytes,
                n_ctx_train=info.n_ctx_train,
                n_embd=info.n_embd,
                n_vocab=info.n_vocab,
                vocab_type=info.vocab_type,
                tokenizer=runtime.tokenizer.name,
                repack=info.repack.enabled,
                repack_reason=info.repack.reason,
            ),
            default_generation_settings=wire.DefaultGenerationSettings(
                params=wire.SamplingDefaults(
                    **translate.sampler_settings(runtime.defaults.sampling),
                    n_predict=runtime.defaults.n_predict,
                    n_keep=runtime.defaults.n_keep,
                    lora=translate.lora_list([adapter.scale for adapter in runtime.engine.lora_adapters]),
                ),
                n_ctx=info.n_ctx,
            ),
            total_slots=runtime.engine.n_slots,
            modalities=wire.Modalities(vision=runtime.engine.vision is not None, audio=False),
            template=template.source,
            chat_template=template.source,
            chat_template_origin=template.origin,
            chat_template_caps=wire.ChatTemplateCaps(
                supports_tools=caps.tools,
                supports_tool_calls=caps.tool_calls,
                supports_tool_responses=caps.tool_responses,
                supports_system_role=caps.system_role,
                supports_preserve_reasoning=caps.past_reasoning or caps.preserve_reasoning is not None,
                preserves_reasoning=caps.past_reasoning or bool(template.default_variables),
            ),
            bos_token=runtime.tokenizer.bos_token,
            eos_token=runtime.tokenizer.eos_token,
            build_info=api_context().fingerprint,
            is_sleeping=runtime.engine.sleeping,
            kv_cache=translate.kv_cache(runtime.kv_cache),
            capabilities=llama_server_capabilities(runtime.capabilities),
        )
    )


@blueprint.get("/slots")
@blueprint.get("/v1/slots")
async def slots() -> Response:
    """The session slots' state (501 with ``--no-slots``, as llama-server)."""
    if not api_context().slots:
        raise NotImplementedOnThisModel("this server does not serve /slots: it was started with --no-slots")
    runtime = require_runtime()
    engine = runtime.engine
    speculative = engine.info.draft_model is not None
    return json_response(
        [
            unstructure(translate.slot(s, speculative=speculative, sleeping=engine.sleeping))
            for s in engine.statistics().slots
        ]
    )


@blueprint.get("/metrics")
@blueprint.get("/v1/metrics")
async def metrics() -> Response:
    """Prometheus text, with llama-server's ``Process-Start-Time-Unix`` header (501 with ``--no-metrics``)."""
    context = api_context()
    if not context.metrics:
        raise NotImplementedOnThisModel(
            "this server does not serve /metrics: it was started with --no-metrics"
        )
    runtime = require_runtime()
    text = render_metrics(
        runtime.engine.statistics,
        context.responses.statistics,
        context.latency,
        adapters=runtime.engine.lora_adapters,
        loaded_at=runtime.created,
    )
    return Response(
        text, content_type=CONTENT_TYPE, headers={"Process-Start-Time-Unix": str(context.started)}
    )
