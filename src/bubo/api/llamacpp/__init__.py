"""llama-server: completion, infill, embedding, rerank, tokens, templates, props, slots, metrics, LoRA."""

from bubo.api._chat.wire import ChatCompletionRequest
from bubo.api._llama_fields import LoraEntry

from . import embedding as embedding
from . import infill as infill
from . import lora as lora
from . import rerank as rerank
from . import slots as slots
from .routes import blueprint as blueprint
from .wire import CompletionRequest, DetokenizeRequest, TokenizeRequest

REQUEST_BODIES = (
    CompletionRequest,
    infill.InfillRequest,
    embedding.EmbeddingRequest,
    rerank.RerankRequest,
    TokenizeRequest,
    DetokenizeRequest,
    ChatCompletionRequest,  # /apply-template
    list[LoraEntry],  # POST /lora-adapters
)
"""What its routes structure request bodies as (``bubo.server.REQUEST_CONVERTER`` builds them at import)."""
