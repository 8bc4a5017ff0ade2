"""The Anthropic dialect: Messages and count_tokens, with Anthropic's error envelope."""

from .errors import render_error as render_error
from .routes import PATH_PREFIX as PATH_PREFIX
from .routes import blueprint as blueprint
from .wire import CountTokensRequest, MessagesRequest

REQUEST_BODIES = (MessagesRequest, CountTokensRequest)
"""What its routes structure request bodies as (``bubo.server.REQUEST_CONVERTER`` builds them at import)."""
