"""llama-server: completion, infill, embedding, rerank, tokens, templates, props, slots, metrics, LoRA."""

from . import embedding as embedding
from . import infill as infill
from . import lora as lora
from . import rerank as rerank
from . import slots as slots
from .routes import blueprint as blueprint
