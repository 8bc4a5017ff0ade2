"""Schemas that killed, hung or failed a real server: each is a 400, and the server serves on.

Before the schema limits, maxLength 20,000 and maxItems 50,000 killed the
process with SIGSEGV inside llama.cpp's grammar parser, 500 levels of
``items`` answered 500, a 100,000-value enum kept the request busy for
minutes, and the pattern ``^}$`` sent the converter into an endless loop.
The server here is this module's own, so a crash cannot take others' down.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from .conftest import Server, free_port, hypercorn_command, start_server, stop_server


def nested_items(depth: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(depth - 1):
        schema = {"type": "array", "items": schema}
    return schema


HOSTILE = {
    "maxLength 20000": {"type": "object", "properties": {"x": {"type": "string", "maxLength": 20_000}}},
    "maxItems 50000": {"type": "array", "items": {"type": "integer"}, "maxItems": 50_000},
    "500 levels": nested_items(500),
    "100k enum": {"enum": [f"value {i}" for i in range(100_000)]},
    "endless pattern": {"type": "string", "pattern": "^}$"},
    "invalid pattern": {"type": "string", "pattern": "^(($"},
}


@pytest.fixture(name="own_server", scope="module")
def _own_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    port = free_port()
    log: Path = tmp_path_factory.mktemp("hostile") / "hypercorn.log"
    server = start_server(hypercorn_command(port), port, log)
    yield server
    stop_server(server)


def chat(schema: dict[str, Any] | None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "bubo",
        "messages": [{"role": "user", "content": "Say hi."}],
        "max_tokens": 8,
    }
    if schema is not None:
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    return body


def test_hostile_schemas_are_refused_and_the_server_serves_on(own_server: Server) -> None:
    """Each hostile schema, in response_format and as a forced tool, is a 400; then /health and a chat work."""
    # a timeout, not a timing assertion: a hang fails the test instead of stalling the suite
    with httpx.Client(base_url=own_server.base_url, timeout=60) as http:
        for name, schema in HOSTILE.items():
            answer = http.post("/v1/chat/completions", json=chat(schema))
            assert answer.status_code == 400, (name, answer.text[:300])
            assert answer.json()["error"]["param"].startswith("response_format.json_schema.schema"), name
            forced = {
                **chat(None),
                "tools": [{"type": "function", "function": {"name": "f", "parameters": schema}}],
                "tool_choice": "required",
            }
            answer = http.post("/v1/chat/completions", json=forced)
            assert answer.status_code == 400, (name, answer.text[:300])
            assert answer.json()["error"]["param"].startswith("tools[0].function.parameters"), name
        assert own_server.process.poll() is None, own_server.output()[-2000:]
        assert http.get("/health").json() == {"status": "ok"}
        answer = http.post("/v1/chat/completions", json=chat(None))
        assert answer.status_code == 200
        assert answer.json()["choices"][0]["message"]["content"]
        constrained = http.post("/v1/chat/completions", json=chat({"type": "string", "maxLength": 1000}))
        assert constrained.status_code == 200
        assert isinstance(constrained.json()["choices"][0]["message"]["content"], str)
