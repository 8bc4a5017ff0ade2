"""Responses routes: ``POST /v1/responses``, ``GET`` and ``DELETE /v1/responses/{id}``."""

from __future__ import annotations

import socket
import time

import trio
from quart import Blueprint, Response, request

from bubo.api._context import api_context, read_body, request_timeline, require_runtime
from bubo.api._json import dumps, json_response, unstructure
from bubo.api._omitted import report_omitted
from bubo.api._sse import sse_response
from bubo.domain.ids import new_id
from bubo.domain.messages import Message
from bubo.errors import NotFound
from bubo.service.chat import prepare_chat
from bubo.service.generation import collect, open_output
from bubo.service.response_store import StoredResponse

from . import translate, wire
from .stream import ResponseStream

__all__ = ["blueprint"]

blueprint = Blueprint("responses", __name__)


def _this_server() -> str:
    """The host name and the address the request arrived on: which replica answered, behind a gateway."""
    server = request.scope.get("server")
    address = f"{server[0]}:{server[1]}" if server and server[1] is not None else "unknown address"
    return f"{socket.gethostname()}, {address}"


def _not_stored(response_id: str, server: str, param: str | None = None) -> NotFound:
    """404 for a response this server does not hold, saying which server and how to go on without it."""
    how = "; send the earlier turns as input items instead" if param == "previous_response_id" else ""
    return NotFound(
        f"response {response_id!r} is not stored on this server ({server}): unknown, created with "
        "store: false, deleted, evicted to keep the store within its limits, or stored by another "
        f"replica (each server keeps its own responses; docs/deploy.md){how}",
        code="response_not_found",
        param=param,
    )


@blueprint.post("/v1/responses")
@blueprint.post("/responses")  # llama-server serves it without /v1 too
async def create() -> Response:
    """A response, streaming or not; stored for continuation unless ``store`` is false."""
    runtime = require_runtime()
    store = api_context().responses
    converter = api_context().converter
    server = _this_server()

    def translated(body: wire.ResponsesRequest) -> translate.Conversation:
        """The conversation (in a worker: the store is read on the event loop, where it is kept)."""
        runtime.check_model(body.model)
        previous: tuple[Message, ...] = ()
        if body.previous_response_id is not None:
            stored = trio.from_thread.run_sync(store.get, body.previous_response_id)
            if stored is None:
                raise _not_stored(body.previous_response_id, server, "previous_response_id")
            previous = stored.conversation
        return translate.responses_request(
            converter, body, previous, takes_images=runtime.engine.vision is not None
        )

    body, conversation = await read_body(runtime, wire.ResponsesRequest, translated)
    report_omitted(conversation.request.omitted)
    prepared = await prepare_chat(runtime, conversation.request)
    response_id = new_id("resp_")
    created_at = int(time.time())
    model = body.model or runtime.model_id

    def remember(response: wire.Response, assistant: Message) -> None:
        if body.store is not False:
            entry = StoredResponse(
                body=dumps(unstructure(response)).encode(), conversation=(*conversation.history, assistant)
            )
            store.put(response_id, entry)

    if body.stream:
        encoder = ResponseStream(
            body,
            response_id=response_id,
            created_at=created_at,
            model=model,
            on_finished=remember,
            tools=conversation.tools,
        )
        return sse_response(open_output(runtime, prepared, request_timeline()), encoder)
    async with open_output(runtime, prepared, request_timeline()) as output:
        completion = await collect(output)
    response = translate.response(
        body,
        response_id=response_id,
        created_at=created_at,
        model=model,
        output=translate.output_items(completion, conversation.tools),
        done=completion.done,
    )
    remember(response, translate.assistant_message(response.output))
    return json_response(response)


@blueprint.get("/v1/responses/<response_id>")
@blueprint.get("/responses/<response_id>")
async def retrieve(response_id: str) -> Response:
    """A stored response."""
    require_runtime()
    stored = api_context().responses.get(response_id)
    if stored is None:
        raise _not_stored(response_id, _this_server())
    return Response(stored.body, content_type="application/json")


@blueprint.delete("/v1/responses/<response_id>")
@blueprint.delete("/responses/<response_id>")
async def delete(response_id: str) -> Response:
    """Forget a stored response."""
    require_runtime()
    if not api_context().responses.delete(response_id):
        raise _not_stored(response_id, _this_server())
    return json_response(wire.Deleted(id=response_id, deleted=True))
