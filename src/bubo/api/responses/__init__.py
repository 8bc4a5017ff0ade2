"""The OpenAI Responses dialect: create, retrieve and delete responses; continuations by id."""

from .routes import blueprint as blueprint
from .wire import CustomTool, FunctionTool, NamespaceTool, ResponsesRequest

REQUEST_BODIES = (ResponsesRequest, FunctionTool, CustomTool, NamespaceTool)  # the tools: one by one
"""What its routes structure request bodies as (``bubo.server.REQUEST_CONVERTER`` builds them at import)."""
