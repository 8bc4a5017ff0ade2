"""Chat templates: the GGUF's Jinja template rendered as transformers renders it."""

from .chat import CHATML as CHATML
from .chat import ChatTemplate as ChatTemplate
