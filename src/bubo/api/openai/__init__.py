"""The OpenAI dialect: chat completions, text completions, models."""

from .routes import blueprint as blueprint
