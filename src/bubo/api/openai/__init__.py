"""The OpenAI dialect: chat completions, text completions, models, embeddings."""

from bubo.api._chat.wire import ChatCompletionRequest

from . import embeddings as embeddings
from .routes import blueprint as blueprint
from .wire import CompletionRequest

REQUEST_BODIES = (ChatCompletionRequest, CompletionRequest, embeddings.EmbeddingRequest)
"""What its routes structure request bodies as (``bubo.server.REQUEST_CONVERTER`` builds them at import)."""
