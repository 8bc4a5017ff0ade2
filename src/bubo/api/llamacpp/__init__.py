"""llama-server: /completion, /apply-template, /tokenize, /detokenize, /props, /slots, /metrics, /infill, /embedding."""

from . import embedding as embedding
from . import infill as infill
from .routes import blueprint as blueprint
