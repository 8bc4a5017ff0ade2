"""llama-server: /completion, /infill, /embedding, tokens, templates, /props, /slots, /metrics."""

from . import embedding as embedding
from . import infill as infill
from . import slots as slots
from .routes import blueprint as blueprint
