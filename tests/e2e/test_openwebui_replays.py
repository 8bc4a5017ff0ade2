"""What Open WebUI sent Bubo, replayed on a real server with the real model, checked as Open WebUI reads it.

The fixtures in ``tests/fixtures/openwebui/`` are the requests Open WebUI sent during
``nox -s openwebui`` (tests/openwebui/, recorded through agents/proxy.py with
``BUBO_OPENWEBUI_RECORD``): through the Ollama connection (``ollama.json``) and the OpenAI one
(``openai.json``), in order: the model list and ``/api/ps``, the chats (its 36 built-in tools
offered, a system prompt, an uploaded file's text), the background title, tags and follow-up
tasks, the regenerated answer, and Ollama's Eject (an empty ``/api/generate`` with
``keep_alive: 0``).  Each is replayed byte for byte but for the answer's length, capped to keep
the run short, and its answer is checked for the fields Open WebUI's parsers read
(``open_webui/routers/ollama.py``, ``open_webui/utils/response.py``, the OpenAI SDK's types for
the OpenAI connection).  The server has the default model's own context (8,192 tokens): the
chats with tools hold about 7,000.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai.types import Model
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from .conftest import Server, serving

pytestmark = [pytest.mark.e2e, pytest.mark.llama]

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "openwebui"
ANSWER_TOKENS = 16
DURATIONS = ("total_duration", "load_duration", "prompt_eval_duration", "eval_duration")


def recorded(connection: str) -> list[dict[str, Any]]:
    requests: list[dict[str, Any]] = json.loads((FIXTURES / f"{connection}.json").read_text())["requests"]
    return requests


REQUESTS = [
    pytest.param(connection, request, id=f"{connection}-{index}-{request['purpose'][:40]}")
    for connection in ("ollama", "openai")
    for index, request in enumerate(recorded(connection))
]


@pytest.fixture(name="server", scope="module")
def _server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with serving(tmp_path_factory.mktemp("openwebui") / "bubo.log", env={"BUBO_CTX_SIZE": "8192"}) as server:
        yield server


def capped(request: dict[str, Any]) -> dict[str, Any] | None:
    """The recorded body with the answer's length capped (Open WebUI asks its tasks for up to 1,000 tokens)."""
    body = copy.deepcopy(request["body"])
    if body is None:
        return None
    if request["path"] == "/api/chat":
        body["options"] = {**body.get("options", {}), "num_predict": ANSWER_TOKENS}
    elif request["path"] == "/v1/chat/completions":
        body.pop("max_completion_tokens", None)
        body["max_tokens"] = ANSWER_TOKENS
    return body


@pytest.mark.parametrize(("connection", "request_"), REQUESTS)
def test_open_webui_reads_the_answer(server: Server, connection: str, request_: dict[str, Any]) -> None:
    """The recorded request answers 200 with what Open WebUI's parser for that endpoint reads."""
    del connection  # in the test's id
    with (
        httpx.Client(base_url=server.base_url, timeout=600) as client,
        client.stream(
            request_["method"], request_["path"], headers=request_["headers"], json=capped(request_)
        ) as response,
    ):
        lines = [line for line in response.iter_lines() if line]
        assert response.status_code == 200, lines
    CHECKS[(request_["method"], request_["path"])](request_["body"], lines)


def check_version(_: Any, lines: list[str]) -> None:
    (line,) = lines
    assert isinstance(json.loads(line)["version"], str)


def check_tags(_: Any, lines: list[str]) -> None:
    models = json.loads("".join(lines))["models"]
    assert {m["model"] for m in models} == {m["name"] for m in models} >= {"bubo:latest"}
    for model in models:
        assert isinstance(model["details"]["parameter_size"], str)


def check_ps(_: Any, lines: list[str]) -> None:
    """Open WebUI reads each model's ``expires_at`` with Python's datetime.fromisoformat (as of 3.11)."""
    models = json.loads("".join(lines))["models"]
    assert {m["model"] for m in models} >= {"bubo:latest"}
    for model in models:
        assert datetime.fromisoformat(model["expires_at"]).tzinfo is not None


def check_ollama_message(message: dict[str, Any]) -> None:
    assert message["role"] == "assistant"
    assert isinstance(message["content"], str)
    for call in message.get("tool_calls") or ():  # Ollama's shape: arguments as an object
        assert isinstance(call["function"]["name"], str)
        assert isinstance(call["function"]["arguments"], dict)


def check_ollama_chat(body: dict[str, Any], lines: list[str]) -> None:
    """Every line one object with ``message``; the last ``done`` with its reason, counts and durations."""
    objects = [json.loads(line) for line in lines]
    if not body.get("stream", True):
        assert len(objects) == 1
    for piece in objects:
        check_ollama_message(piece["message"])
    *pieces, final = objects
    assert not any(piece["done"] for piece in pieces)
    assert final["done"] is True
    assert final["done_reason"] in ("stop", "length")
    assert final["prompt_eval_count"] > 0
    assert final["eval_count"] > 0
    assert all(isinstance(final[name], int) for name in DURATIONS)
    text = "".join(piece["message"]["content"] for piece in objects)
    assert text or any(piece["message"].get("tool_calls") for piece in objects)


def check_eject(body: dict[str, Any], lines: list[str]) -> None:
    """Open WebUI's Eject: an empty prompt with keep_alive 0 frees the model."""
    assert body["keep_alive"] == 0
    (line,) = lines
    answer = json.loads(line)
    assert (answer["done"], answer["done_reason"]) == (True, "unload")


def check_models(_: Any, lines: list[str]) -> None:
    answer = json.loads("".join(lines))
    ids = {Model.model_validate(model).id for model in answer["data"]}
    assert ids >= {"bubo"}


def check_openai_chat(body: dict[str, Any], lines: list[str]) -> None:
    """Each SSE chunk as the OpenAI SDK reads it, ending in [DONE]; or one whole completion."""
    if not body.get("stream"):
        completion = ChatCompletion.model_validate_json("".join(lines))
        assert completion.choices[0].message.content or completion.choices[0].message.tool_calls
        return
    data = [line.removeprefix("data:").strip() for line in lines if line.startswith("data:")]
    assert data[-1] == "[DONE]"
    chunks = [ChatCompletionChunk.model_validate_json(item) for item in data[:-1]]
    finished = [choice.finish_reason for chunk in chunks for choice in chunk.choices if choice.finish_reason]
    assert finished in (["stop"], ["length"], ["tool_calls"])


CHECKS = {
    ("GET", "/api/version"): check_version,
    ("GET", "/api/tags"): check_tags,
    ("GET", "/api/ps"): check_ps,
    ("POST", "/api/chat"): check_ollama_chat,
    ("POST", "/api/generate"): check_eject,
    ("GET", "/v1/models"): check_models,
    ("POST", "/v1/chat/completions"): check_openai_chat,
}
