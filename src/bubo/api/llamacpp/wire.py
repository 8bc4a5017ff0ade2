"""llama-server's own endpoints: wire models as its README documents them.

https://github.com/ggml-org/llama.cpp/blob/master/tools/server/README.md
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import attrs

from bubo.api._converter import wire_name
from bubo.api._llama_fields import LlamaServerFields
from bubo.api._progress import Progress
from bubo.api._usage import Timings, Usage
from bubo.domain.samplers import KNOBS, Knob, with_knob_fields

# ---- requests ------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class PromptObject:
    """A prompt given as an object, llama-server's multimodal shape: ``{"prompt_string": …}``.

    ``multimodal_data``: base64 images, one for each ``<__media__>`` marker of the text, in order (a
    model that takes images; a text model refuses them).
    """

    prompt_string: str | list[int | str] | None = None
    multimodal_data: list[str] | None = None


@attrs.frozen(kw_only=True)
class CompletionRequest(LlamaServerFields):
    """``POST /completion``; ``max_tokens`` is accepted as an alias of ``n_predict``.

    ``prompt`` is one prompt (text, token ids, both mixed, or a :class:`PromptObject`) or several (an
    array of texts, of such arrays and of objects): then each is answered, side by side.
    """

    prompt: str | list[int | str | list[int | str] | PromptObject] | PromptObject | None = None
    model: str | None = None
    n_predict: int | None = None
    max_tokens: int | None = None
    stream: bool | None = None
    temperature: float | None = None
    top_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    n_probs: int | None = None
    logit_bias: list[list[Any]] | dict[str, Any] | None = None
    cache_prompt: bool | None = None
    t_max_predict_ms: int | None = None
    return_progress: bool | None = None
    return_tokens: bool | None = None
    id_slot: int | None = None
    # context shift, indentation, and which result fields to send
    n_keep: int | None = None
    n_indent: int | None = None
    response_fields: list[str] | None = None
    timings_per_token: bool | None = None
    post_sampling_probs: bool | None = None


@attrs.frozen(kw_only=True)
class TokenizeRequest:
    """``POST /tokenize``."""

    content: str | list[int | str] | None = None
    add_special: bool | None = None
    parse_special: bool | None = None
    with_pieces: bool | None = None


@attrs.frozen(kw_only=True)
class DetokenizeRequest:
    """``POST /detokenize``."""

    tokens: list[int] | None = None


# ---- responses -----------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class TopProbability:
    """One candidate token."""

    id: int
    token: str
    bytes: list[int]
    logprob: float


@attrs.frozen(kw_only=True)
class Probability:
    """One generated token's probability and the top candidates."""

    id: int
    token: str
    bytes: list[int]
    logprob: float
    top_logprobs: list[TopProbability]


@attrs.frozen(kw_only=True)
class _SamplerSettings:
    """The sampler fields ``generation_settings`` and ``/props``' defaults share (llama-server's names).

    A field per knob of ``domain.samplers.KNOBS`` (:func:`sampler_settings_class` adds them), then
    the settings that are not single numbers.  Only ``translate.sampler_settings`` makes one, from
    the table too; mypy sees this class without fields.
    """


def sampler_settings_class(knobs: Iterable[Knob]) -> type[_SamplerSettings]:
    """:class:`SamplerSettings` for *knobs*: each knob, then ``seed``, the breakers and the order."""
    fields: dict[str, Any] = {knob.name: attrs.field(type=knob.kind) for knob in knobs}
    fields |= {
        "seed": attrs.field(type=int),
        "dry_sequence_breakers": attrs.field(type=list[str]),
        "samplers": attrs.field(type=list[str]),
    }
    return with_knob_fields(_SamplerSettings, fields)


if TYPE_CHECKING:
    SamplerSettings = _SamplerSettings
else:
    SamplerSettings = sampler_settings_class(KNOBS)


@attrs.frozen(kw_only=True)
class TopPostProbability:
    """One candidate token after the sampler chain (``post_sampling_probs``)."""

    id: int
    token: str
    bytes: list[int]
    prob: float


@attrs.frozen(kw_only=True)
class PostProbability:
    """One generated token's probability after the sampler chain, and the candidates it left."""

    id: int
    token: str
    bytes: list[int]
    prob: float
    top_probs: list[TopPostProbability]


Probabilities = list[Probability] | list[PostProbability]


@attrs.frozen(kw_only=True)
class GenerationSettings(SamplerSettings):
    """The settings a completion actually ran with."""

    n_ctx: int
    n_predict: int
    model: str
    stop: list[str]
    n_probs: int
    ignore_eos: bool
    stream: bool
    # context shift, indentation, cache reuse and the resolved logit bias
    n_keep: int = 0
    n_indent: int = 0
    cache_prompt: bool = True
    # drafting's limits, under llama-server's flat keys ("speculative.n_max", …)
    speculative_n_max: int = attrs.field(default=16, metadata=wire_name("speculative.n_max"))
    speculative_n_min: int = attrs.field(default=0, metadata=wire_name("speculative.n_min"))
    speculative_p_min: float = attrs.field(default=0.75, metadata=wire_name("speculative.p_min"))
    logit_bias: list[LogitBiasEntry] = attrs.field(factory=list)


@attrs.frozen(kw_only=True)
class LogitBiasEntry:
    """One resolved ``logit_bias`` entry of ``generation_settings`` (``bias`` null: the token is banned)."""

    token: int
    bias: float | None


@attrs.frozen(kw_only=True)
class CompletionResult:
    """The ``/completion`` response (and the last chunk of its stream)."""

    index: int = 0
    content: str
    tokens: list[int]
    id_slot: int
    stop: bool
    model: str
    tokens_predicted: int
    tokens_evaluated: int
    generation_settings: GenerationSettings
    prompt: str
    has_new_line: bool
    truncated: bool
    stop_type: str
    stopping_word: str
    tokens_cached: int
    timings: Timings
    usage: Usage
    completion_probabilities: Probabilities | None = None


@attrs.frozen(kw_only=True)
class CompletionChunk:
    """A partial ``/completion`` stream chunk."""

    index: int = 0
    content: str
    tokens: list[int]
    stop: bool = False
    id_slot: int
    tokens_predicted: int
    tokens_evaluated: int
    completion_probabilities: Probabilities | None = None
    prompt_progress: Progress | None = None
    timings: Timings | None = None  # timings_per_token


@attrs.frozen(kw_only=True)
class TokenPiece:
    """A token with its text (or raw bytes when they are not valid UTF-8)."""

    id: int
    piece: str | list[int]


@attrs.frozen(kw_only=True)
class Tokens:
    """``/tokenize`` response."""

    tokens: list[int] | list[TokenPiece]


@attrs.frozen(kw_only=True)
class Detokenized:
    """``/detokenize`` response."""

    content: str


@attrs.frozen(kw_only=True)
class LoraScaleEntry:
    """One adapter's scale, as llama-server lists a request's or the server's ``lora``."""

    id: int
    scale: float


@attrs.frozen(kw_only=True)
class SamplingDefaults(SamplerSettings):
    """``default_generation_settings.params`` of ``/props``."""

    n_predict: int
    n_keep: int  # --keep
    lora: list[LoraScaleEntry]  # the global scales (POST /lora-adapters)


@attrs.frozen(kw_only=True)
class SlotParams:
    """``params`` of a ``/slots`` entry: the current or last task's LoRA scales."""

    lora: list[LoraScaleEntry]


@attrs.frozen(kw_only=True)
class DefaultGenerationSettings:
    """``default_generation_settings`` of ``/props``."""

    params: SamplingDefaults
    n_ctx: int


@attrs.frozen(kw_only=True)
class ModelInfo:
    """``model_info`` of ``/props``."""

    architecture: str
    description: str
    n_params: int
    size: int
    n_ctx_train: int
    n_embd: int
    n_vocab: int
    vocab_type: int
    tokenizer: str
    repack: bool  # llama.cpp repacks the weights into its CPU extra buffer types
    repack_reason: str


@attrs.frozen(kw_only=True)
class Modalities:
    """What the model takes besides text."""

    vision: bool
    audio: bool


@attrs.frozen(kw_only=True)
class ChatTemplateCaps:
    """What the chat template renders by itself (Bubo polyfills the rest)."""

    supports_tools: bool
    supports_tool_calls: bool
    supports_tool_responses: bool
    supports_system_role: bool
    supports_preserve_reasoning: bool
    preserves_reasoning: bool  # earlier turns' reasoning is rendered (by default or as asked)


@attrs.frozen(kw_only=True)
class KvCache:
    """``kv_cache`` of ``/props``: the KV cache's data types and memory, against an f16 cache."""

    type_k: str
    type_v: str
    n_ctx: int  # cells, every slot's together
    size_bytes: int
    size_mib: float
    f16_bytes: int  # what the same cache takes in f16 (llama.cpp's default)
    saved_bytes: int  # f16_bytes - size_bytes
    saved_share: float  # saved_bytes / f16_bytes


@attrs.frozen(kw_only=True)
class Props:
    """``GET /props``: model names, template and defaults."""

    model: str
    model_alias: str
    model_path: str
    model_info: ModelInfo
    default_generation_settings: DefaultGenerationSettings
    total_slots: int
    modalities: Modalities
    template: str
    chat_template: str
    chat_template_origin: str
    chat_template_caps: ChatTemplateCaps
    bos_token: str
    eos_token: str
    build_info: str
    is_sleeping: bool  # the model is freed while idle (--sleep-idle-seconds); the next request loads it
    kv_cache: KvCache | None = None  # None: the engine does not say (the fake engine)
    capabilities: list[str] = attrs.field(factory=lambda: ["completion"])  # /v1/models' words: an encoder's


@attrs.frozen(kw_only=True)
class NextToken:
    """The slot's generation progress."""

    has_next_token: bool
    n_decoded: int
    n_remain: int


@attrs.frozen(kw_only=True)
class Slot:
    """One ``/slots`` entry.

    ``id_task``, ``params`` and ``next_token`` describe the slot's current or
    last task, so a slot that has run none leaves them out, as llama-server's;
    the prompt token counts are always there (0), as the API reference lists them.
    """

    id: int
    n_ctx: int
    speculative: bool
    is_processing: bool
    is_sleeping: bool  # the model is freed while idle: the slot holds nothing until the next request
    state: str
    n_prompt_tokens: int
    n_prompt_tokens_processed: int
    n_prompt_tokens_cache: int
    shared_tokens: int  # of n_prompt_tokens_cache, those taken from another slot's cells
    id_task: int | None = None
    params: SlotParams | None = None
    next_token: list[NextToken] | None = None
