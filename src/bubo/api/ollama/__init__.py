"""Ollama's native API (``/api/*``): chat, generate, embeddings, models, with Ollama's error shape."""

from . import models as models
from . import wire as wire
from .errors import render_error as render_error
from .names import listed_name as listed_name
from .names import require_name as require_name
from .options import keep_alive_seconds as keep_alive_seconds
from .routes import PATH_PREFIX as PATH_PREFIX
from .routes import VERSION as VERSION
from .routes import blueprint as blueprint
from .routes import pull_lines as pull_lines
from .routes import pull_response as pull_response
from .routes import unload_answer as unload_answer

REQUEST_BODIES = (
    wire.ShowRequest,
    wire.ChatRequest,
    wire.GenerateRequest,
    wire.EmbedRequest,
    wire.EmbeddingsRequest,
    wire.PullRequest,
)
"""What its routes structure request bodies as (``bubo.server.REQUEST_CONVERTER`` builds them at import)."""
