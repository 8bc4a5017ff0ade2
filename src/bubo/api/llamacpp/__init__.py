"""llama-server: /completion, /apply-template, /tokenize, /detokenize, /props, /slots, /metrics."""

from .routes import blueprint as blueprint
