"""The OpenAI Responses dialect: create, retrieve and delete responses; continuations by id."""

from .routes import blueprint as blueprint
from .wire import CustomTool, FunctionTool, NamespaceTool, ResponsesRequest

REQUEST_BODIES = (ResponsesRequest, FunctionTool, CustomTool, NamespaceTool)  # the tools: one by one
"""The request bodies its routes structure: the app's converter builds their hooks as it is made."""
