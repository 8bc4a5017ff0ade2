"""The engine's error causes on the wire: one row each in ``ENGINE_CAUSES``, and the status and headers it gives."""

from __future__ import annotations

import json

import pytest

from bubo.api import anthropic, ollama
from bubo.api._errors import ENGINE_CAUSES, engine_error, known_error, render_error
from bubo.engine.errors import (
    Cause,
    ContextFull,
    EngineError,
    EngineFailure,
    GrammarRejected,
    Lost,
    SlotBusy,
    SlotFileNoRoom,
    StreamNotRead,
    Unexpected,
    Unloaded,
    Waking,
)
from bubo.errors import InvalidRequest

# what each cause answered before the engine stopped deciding it (the reference's statuses and headers)
WIRE = [
    (EngineFailure("llama_decode failed"), 500, "server_error", "engine_error", {}),
    (Unexpected("the engine failed on this request"), 500, "server_error", "internal_error", {}),
    (Lost("the engine failed"), 503, "server_error", "device_lost", {}),
    (
        ContextFull("Context size has been exceeded"),
        503,
        "server_error",
        "context_full",
        {"Retry-After": "1"},
    ),
    (SlotFileNoRoom("no room for the file"), 503, "server_error", "context_full", {"Retry-After": "1"}),
    (SlotBusy("slot 0 is busy"), 503, "server_error", "slot_busy", {}),
    (Waking("still loading"), 503, "server_error", "model_waking", {"Retry-After": "5"}),
    (Unloaded("the model was unloaded"), 503, "server_error", "not_ready", {}),
    (StreamNotRead("unread"), 503, "server_error", "stream_not_read", {}),
    (GrammarRejected("cannot parse"), 400, "invalid_request_error", "unsupported_schema", {}),
    (
        GrammarRejected("too deep", cause=Cause.GRAMMAR_TOO_COMPLEX),
        400,
        "invalid_request_error",
        "schema_too_complex",
        {},
    ),
]


def test_every_cause_has_its_row() -> None:
    """A new cause without a status fails here, not as a KeyError in a client's request."""
    assert set(ENGINE_CAUSES) == set(Cause)
    assert {error.cause for error, *_ in WIRE} == set(Cause)


@pytest.mark.parametrize(
    ("error", "status", "type_", "code", "headers"), WIRE, ids=lambda v: getattr(v, "code", None)
)
def test_a_cause_becomes_its_status_type_code_and_headers(
    error: EngineError, status: int, type_: str, code: str, headers: dict[str, str]
) -> None:
    rendered = engine_error(error)
    assert (rendered.status, rendered.type, rendered.code, dict(rendered.headers)) == (
        status,
        type_,
        code,
        headers,
    )
    assert rendered.message == error.message
    assert rendered.__cause__ is error  # the engine's error stays reachable for the log


@pytest.mark.parametrize(("error", "status", "type_", "code", "headers"), WIRE[3:7])
async def test_every_dialect_answers_with_the_causes_status_and_headers(
    error: EngineError, status: int, type_: str, code: str, headers: dict[str, str]
) -> None:
    rendered = engine_error(error)
    for response in (
        render_error(rendered),
        render_error(rendered, llama_server=True),
        anthropic.render_error(rendered, "req_1"),
        ollama.render_error(rendered),
    ):
        assert response.status_code == status
        assert {name: response.headers[name] for name in headers} == headers
    body = json.loads(await render_error(rendered).get_data())
    assert body["error"] == {"message": error.message, "type": type_, "param": None, "code": code}


def test_known_errors_are_bubo_errors_and_engine_errors_only() -> None:
    request_error = InvalidRequest("bad", param="x")
    assert known_error(request_error) is request_error
    assert known_error(SlotBusy("busy")).code == "slot_busy"  # type: ignore[union-attr]
    assert known_error(KeyError("a bug")) is None
