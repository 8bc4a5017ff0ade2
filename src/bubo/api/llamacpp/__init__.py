"""The llama-server dialect: /completion, /tokenize, /detokenize, /props, /slots, /metrics."""

from .routes import blueprint as blueprint
