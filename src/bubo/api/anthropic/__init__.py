"""The Anthropic dialect: Messages and count_tokens, with Anthropic's error envelope."""

from .errors import render_error as render_error
from .routes import PATH_PREFIX as PATH_PREFIX
from .routes import blueprint as blueprint
from .wire import CountTokensRequest, MessagesRequest

REQUEST_BODIES = (MessagesRequest, CountTokensRequest)
"""The request bodies its routes structure: the app's converter builds their hooks as it is made."""
