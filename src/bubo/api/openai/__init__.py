"""The OpenAI dialect: chat completions, text completions, models, embeddings."""

from . import embeddings as embeddings
from .routes import blueprint as blueprint
