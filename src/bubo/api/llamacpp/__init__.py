"""llama-server: /completion, /apply-template, /tokenize, /detokenize, /props, /slots, /metrics, /infill, /embedding, slot actions."""

from . import embedding as embedding
from . import infill as infill
from . import slots as slots
from .routes import blueprint as blueprint
