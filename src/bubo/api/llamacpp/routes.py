"""llama-server routes: completion, apply-template, tokenize, detokenize, props, slots, metrics."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from quart import Blueprint, Response, request

from bubo.api._chat import translate as chat_translate
from bubo.api._chat import wire as chat_wire
from bubo.api._context import api_context, request_timeline, require_runtime, structured_body
from bubo.api._converter import make_converter
from bubo.api._errors import error_envelope
from bubo.api._json import dumps, json_response, unstructure
from bubo.api._sse import sse_frame, sse_response
from bubo.domain.generation import PromptProgress, TokenLogprob
from bubo.domain.output import Done, OutputEvent, TextDelta
from bubo.errors import BuboError, InvalidRequest
from bubo.service.chat import prompt_chars, render_chat_request
from bubo.service.generation import PreparedGeneration, collect, open_output, prepare_completion
from bubo.service.prompt import raw_tokens
from bubo.service.runtime import Runtime
from bubo.service.work import PREPARE_BYTES_PER_CHAR

from . import translate, wire
from .metrics import CONTENT_TYPE, render_metrics

__all__ = ["answer_completion", "blueprint", "check_id_slot"]

blueprint = Blueprint("llamacpp", __name__)
_converter = make_converter()

MAX_TOKENS = 1 << 20
"""The most token ids one ``/tokenize`` answer or ``/detokenize`` request holds (1,048,576: more than
any model's context; a 10 MB text is about 2.2 million)."""


class _CompletionStream:
    """``/completion`` chunks: one per token, then the full result; no ``[DONE]``."""

    def __init__(
        self, settings: wire.GenerationSettings, prompt: str, *, n_probs: bool, progress: bool
    ) -> None:
        self._settings = settings
        self._prompt = prompt
        self._n_probs = n_probs
        self._progress = progress
        self._predicted = 0
        self._evaluated = 0
        self._slot = 0  # the slot evaluating the prompt (known from its first progress event)
        self._has_new_line = False

    def opening(self) -> Iterable[bytes]:
        return ()

    def _chunk(self, chunk: wire.CompletionChunk) -> list[bytes]:
        return [sse_frame(dumps(unstructure(chunk)))]

    def encode(self, event: OutputEvent) -> Iterable[bytes]:
        match event:
            case PromptProgress() if self._progress:
                self._evaluated = event.total
                self._slot = event.slot_id
                return self._chunk(
                    wire.CompletionChunk(
                        content="",
                        tokens=[],
                        id_slot=event.slot_id,
                        tokens_predicted=0,
                        tokens_evaluated=event.total,
                        prompt_progress=wire.PromptProgress(
                            total=event.total,
                            cache=event.cached,
                            processed=event.processed,
                            time_ms=round(event.elapsed_ms, 3),
                        ),
                    )
                )
            case PromptProgress():
                self._evaluated = event.total
                self._slot = event.slot_id
            case TextDelta(text=text, token_ids=token_ids, logprobs=entries):
                self._predicted += len(token_ids)
                self._has_new_line = self._has_new_line or "\n" in text
                if not text and not (self._n_probs and entries):
                    return ()
                return self._chunk(
                    wire.CompletionChunk(
                        content=text,
                        tokens=list(token_ids),
                        id_slot=self._slot,
                        tokens_predicted=self._predicted,
                        tokens_evaluated=self._evaluated,
                        completion_probabilities=translate.probabilities(entries) if self._n_probs else None,
                    )
                )
            case Done():
                result = translate.completion_result(
                    content="",
                    done=event,
                    settings=self._settings,
                    prompt=self._prompt,
                    logprobs=None,
                    has_new_line=self._has_new_line,
                )
                return [sse_frame(dumps(unstructure(result)))]
        return ()

    def error(self, error: BuboError) -> Iterable[bytes]:
        return [sse_frame(dumps(unstructure(error_envelope(error))))]


@blueprint.post("/completion")
@blueprint.post("/completions")
async def completion() -> Response:
    """Raw-prompt completion; needs no model."""
    runtime = require_runtime()
    body = await structured_body(runtime, _converter, wire.CompletionRequest)
    if body.model is not None:
        runtime.check_model(body.model)
    check_id_slot(runtime, body.id_slot)
    prepared: PreparedGeneration = await prepare_completion(runtime, translate.completion_request(body))
    return await answer_completion(runtime, body, prepared)


def check_id_slot(runtime: Runtime, id_slot: int | None) -> None:
    """400 unless *id_slot* is absent, -1 (any slot) or a slot's id."""
    n_slots = len(runtime.engine.statistics().slots)
    if id_slot not in (None, -1) and not 0 <= id_slot < n_slots:
        raise InvalidRequest(
            f"id_slot must be -1 (any slot) or a slot id from 0 to {n_slots - 1}; got {id_slot}",
            param="id_slot",
        )


async def answer_completion(
    runtime: Runtime, body: wire.CompletionRequest, prepared: PreparedGeneration
) -> Response:
    """Run *prepared* and answer as ``/completion`` does (``/infill`` answers the same way)."""
    stream = bool(body.stream)
    settings = translate.generation_settings(
        prepared.request, n_ctx=runtime.engine.info.n_ctx, model=body.model or runtime.model_id, stream=stream
    )
    n_probs = bool(prepared.request.n_probs)
    if stream:
        return sse_response(
            open_output(runtime, prepared, request_timeline()),
            _CompletionStream(
                settings, prepared.prompt.text, n_probs=n_probs, progress=bool(body.return_progress)
            ),
        )
    async with open_output(runtime, prepared, request_timeline()) as output:
        completion = await collect(output)
    logprobs: tuple[TokenLogprob, ...] | None = completion.logprobs if n_probs else None
    return json_response(
        translate.completion_result(
            content=completion.text,
            done=completion.done,
            settings=settings,
            prompt=prepared.prompt.text,
            logprobs=logprobs,
            has_new_line="\n" in completion.text,
        )
    )


@blueprint.post("/apply-template")
async def apply_template() -> Response:
    """The chat-completions body rendered as prompt text, as generation renders it; no model needed."""
    runtime = require_runtime()
    body = await structured_body(runtime, _converter, chat_wire.ChatCompletionRequest)
    if body.model is not None:
        runtime.check_model(body.model)
    chat = chat_translate.chat_request(body)
    rendered = await runtime.workers.run(
        lambda: render_chat_request(runtime, chat),
        need_bytes=prompt_chars(chat.prompt) * PREPARE_BYTES_PER_CHAR,
    )
    return json_response({"prompt": rendered.text})


@blueprint.post("/tokenize")
async def tokenize() -> Response:
    """Text to token ids, llama-server semantics (no template; ``add_special`` off by default)."""
    runtime = require_runtime()
    body = await structured_body(runtime, _converter, wire.TokenizeRequest, _at_most_max_tokens("content"))
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
    body = await structured_body(runtime, _converter, wire.DetokenizeRequest, _at_most_max_tokens("tokens"))
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
                ),
                n_ctx=info.n_ctx,
            ),
            total_slots=len(runtime.engine.statistics().slots),
            modalities=wire.Modalities(vision=False, audio=False),
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
        )
    )


@blueprint.get("/slots")
@blueprint.get("/v1/slots")
async def slots() -> Response:
    """The session slot's state."""
    runtime = require_runtime()
    return json_response([unstructure(translate.slot(s)) for s in runtime.engine.statistics().slots])


@blueprint.get("/metrics")
@blueprint.get("/v1/metrics")
async def metrics() -> Response:
    """Prometheus text."""
    runtime = require_runtime()
    engine = runtime.engine
    context = api_context()
    text = render_metrics(engine.statistics, context.responses.statistics, context.latency)
    return Response(text, content_type=CONTENT_TYPE)
