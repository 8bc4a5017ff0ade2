"""Chat templates: the GGUF's Jinja template rendered as transformers renders it."""

from .chat import CHATML as CHATML
from .chat import THINK_CLOSE as THINK_CLOSE
from .chat import THINK_OPEN as THINK_OPEN
from .chat import ChatTemplate as ChatTemplate
