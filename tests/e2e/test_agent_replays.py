"""What Claude Code, Codex CLI and opencode sent, replayed on a real server with the real model.

The fixtures in ``tests/fixtures/agents/`` are requests the real CLIs sent to
Bubo (recorded by ``agents/run.py --record``, machine paths scrubbed): bodies
and the headers that shape them, byte for byte but for the answer's length,
capped here to keep the run short.  Later turns add what each CLI sends back
in its own shapes (Anthropic ``tool_use``/``tool_result``, Responses
``function_call``/``function_call_output`` and ``custom_tool_call``, chat
``tool_calls``/``tool`` messages); each later turn must be served from the
prompt cache, as its usage fields say.  The server is the default model with a
16,384-token context (Claude Code's first prompt has 11,695 tokens) and a
one-second keep-alive, so the long prefills show the keep-alives too, as each
CLI's parser reads them: Anthropic ``ping`` events, ``response.in_progress``
again, chat chunks with an empty delta (opencode's AI SDK and qwen-code's
openai SDK count those against their idle timeouts; an SSE comment they never
see).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import httpx
import pydantic
import pytest
from anthropic.types import RawMessageStreamEvent
from openai.types.chat import ChatCompletionChunk
from openai.types.responses import ResponseStreamEvent

from .conftest import Server, serving

pytestmark = [pytest.mark.e2e, pytest.mark.llama]

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "agents"
ANSWER_TOKENS = 12
CACHE_SLACK = 16  # tokens at the end of the previous prompt that may be re-read (its generation prompt)
IMAGE = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
ANTHROPIC_EVENTS = pydantic.TypeAdapter(RawMessageStreamEvent)
RESPONSES_EVENTS = pydantic.TypeAdapter(ResponseStreamEvent)


def fixture(name: str) -> dict[str, Any]:
    recorded: dict[str, Any] = json.loads((FIXTURES / f"{name}.json").read_text())
    return recorded


@pytest.fixture(name="server", scope="module")
def _server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    env = {"BUBO_CTX_SIZE": "16384", "BUBO_SSE_KEEPALIVE": "1", "BUBO_MODEL_NAMES": "any"}
    with serving(tmp_path_factory.mktemp("agents") / "bubo.log", env=env) as server:
        yield server


@attrs.frozen
class Reply:
    """A streamed answer: its status, headers, SSE events in order (comments as ``(":", text)``)."""

    status: int
    headers: httpx.Headers
    events: list[tuple[str, Any]]

    def data(self, name: str | None = None) -> list[Any]:
        return [data for event, data in self.events if event != ":" and (name is None or event == name)]


def replay(server: Server, recorded: dict[str, Any], body: dict[str, Any] | None = None) -> Reply:
    """POST a recorded request (its headers, *body* or its own) and read the whole stream."""
    events: list[tuple[str, Any]] = []
    event = "message"
    with (
        httpx.Client(base_url=server.base_url, timeout=600) as client,
        client.stream(
            recorded["method"], recorded["path"], headers=recorded["headers"], json=body or recorded["body"]
        ) as response,
    ):
        for line in response.iter_lines():
            if line.startswith(":"):
                events.append((":", line))
            elif line.startswith("event:"):
                event = line.removeprefix("event:").strip()
            elif line.startswith("data:"):
                data = line.removeprefix("data:").strip()
                events.append((event, data if data == "[DONE]" else json.loads(data)))
                event = "message"
        return Reply(status=response.status_code, headers=response.headers, events=events)


def capped(recorded: dict[str, Any], field: str) -> dict[str, Any]:
    """The recorded body with the answer's length capped (the CLIs ask for up to 32,000 tokens)."""
    body = copy.deepcopy(recorded["body"])
    body[field] = ANSWER_TOKENS
    return body


# ---- Claude Code: /v1/messages ---------------------------------------------------------------------


def anthropic_usage(reply: Reply) -> tuple[int, int]:
    """``(prompt tokens, cached tokens)`` from message_start and message_delta, checked as the SDK reads them."""
    for data in reply.data():
        if data["type"] != "ping":  # the SDK skips pings before it reads an event
            ANTHROPIC_EVENTS.validate_python(data)
    (start,) = reply.data("message_start")
    (delta,) = reply.data("message_delta")
    assert reply.data()[-1] == {"type": "message_stop"}
    usage = delta["usage"]
    assert usage["cache_read_input_tokens"] == start["message"]["usage"]["cache_read_input_tokens"]
    return usage["input_tokens"] + usage["cache_read_input_tokens"], usage["cache_read_input_tokens"]


class TestClaudeCode:
    def test_a_session_is_answered_and_every_later_turn_is_cached(self, server: Server) -> None:
        """Its first request (a system turn among the messages, adaptive thinking, effort, context
        management), the real second turn (tool_use, tool_result), then a screenshot in a tool result."""
        first, second = fixture("claude-0"), fixture("claude-1")
        reply = replay(server, first, capped(first, "max_tokens"))
        assert reply.status == 200
        prompt, _ = anthropic_usage(reply)
        assert prompt > 11_000
        assert len(reply.data("ping")) > 0  # a prefill of that length sent keep-alives

        reply = replay(server, second, capped(second, "max_tokens"))
        assert reply.status == 200
        later, cached = anthropic_usage(reply)
        assert cached >= prompt - CACHE_SLACK

        third = capped(second, "max_tokens")
        third["messages"] += [
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_shot", "name": "Read", "input": {"file_path": "/work/repo/shot.png"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_shot", "content": [IMAGE]}]},
        ]  # fmt: skip
        reply = replay(server, second, third)
        assert reply.status == 200
        assert reply.headers["bubo-omitted-content"] == "image=1"
        _, cached = anthropic_usage(reply)
        assert cached >= later - CACHE_SLACK


# ---- Codex CLI: /v1/responses ----------------------------------------------------------------------


def responses_usage(reply: Reply) -> tuple[int, int]:
    """``(prompt tokens, cached tokens)`` from response.completed, every event checked as the SDK reads it."""
    for data in reply.data():
        RESPONSES_EVENTS.validate_python(data)
    final = reply.data()[-1]
    assert final["type"] in ("response.completed", "response.incomplete")
    usage = final["response"]["usage"]
    return usage["input_tokens"], usage["input_tokens_details"]["cached_tokens"]


class TestCodex:
    def test_a_session_with_function_calls_is_cached(self, server: Server) -> None:
        """The request of a model family Codex does not know (function tools, a namespace tool, a
        web_search tool), then a shell call and its output: the later turn from the cache."""
        recorded = fixture("codex-0")
        body = capped(recorded, "max_output_tokens")
        reply = replay(server, recorded, body)
        assert reply.status == 200
        prompt, _ = responses_usage(reply)
        assert (
            len(reply.data("response.in_progress")) > 1
        )  # its own, then keep-alives while the prompt is read

        body["input"] += [
            {"type": "function_call", "name": "exec_command", "arguments": json.dumps({"cmd": "cat calc.py"}), "call_id": "call_cat"},
            {"type": "function_call_output", "call_id": "call_cat", "output": "def add(a, b):\n    return a - b\n"},
        ]  # fmt: skip
        reply = replay(server, recorded, body)
        assert reply.status == 200
        _, cached = responses_usage(reply)
        assert cached >= prompt - CACHE_SLACK

    def test_a_session_with_custom_tool_calls_is_cached(self, server: Server) -> None:
        """The request of a model family Codex knows (its tools in an additional_tools item: namespaces
        of function and custom tools, exec's Lark grammar), then a custom tool call and its output."""
        recorded = fixture("codex-1")
        body = capped(recorded, "max_output_tokens")
        reply = replay(server, recorded, body)
        assert reply.status == 200
        prompt, _ = responses_usage(reply)

        body["input"] += [
            {"type": "custom_tool_call", "status": "completed", "call_id": "call_exec", "name": "exec", "input": "await tools.exec_command({cmd: 'cat calc.py'})"},
            {"type": "custom_tool_call_output", "call_id": "call_exec", "output": "def add(a, b):\n    return a - b\n"},
        ]  # fmt: skip
        reply = replay(server, recorded, body)
        assert reply.status == 200
        _, cached = responses_usage(reply)
        assert cached >= prompt - CACHE_SLACK

    @pytest.mark.parametrize(
        ("syntax", "definition", "allowed"),
        [
            ("lark", 'start: answer "."\nanswer: "yes" | "no"', {"yes.", "no."}),
            ("regex", "^(owl|hawk)-[0-9]$", {f"{bird}-{n}" for bird in ("owl", "hawk") for n in range(10)}),
        ],
    )
    def test_a_forced_custom_tool_call_follows_its_grammar(
        self, server: Server, syntax: str, definition: str, allowed: set[str]
    ) -> None:
        """tool_choice naming a custom tool: the model's input is written in the tool's Lark or regex grammar."""
        tool = {"type": "custom", "name": "answer", "description": "Give the answer.", "format": {"type": "grammar", "syntax": syntax, "definition": definition}}  # fmt: skip
        body = {
            "model": "bubo",
            "input": "Is the sky blue? Answer with the tool.",
            "tools": [tool],
            "tool_choice": {"type": "custom", "name": "answer"},
            "parallel_tool_calls": False,  # one call: the grammar admits no second
            "max_output_tokens": 64,
            "temperature": 0,
        }
        response = httpx.post(f"{server.base_url}/v1/responses", json=body, timeout=300)
        assert response.status_code == 200, response.text
        output = response.json()["output"]
        assert len(output) == 1, output
        (call,) = output
        assert (call["type"], call["name"]) == ("custom_tool_call", "answer")
        assert call["input"] in allowed


# ---- opencode: /v1/chat/completions -----------------------------------------------------------------


def chat_usage(reply: Reply) -> tuple[int, int]:
    """``(prompt tokens, cached tokens)`` from the usage chunk, every chunk checked as the SDK reads it."""
    chunks = reply.data()
    assert chunks[-1] == "[DONE]"
    for chunk in chunks[:-1]:
        ChatCompletionChunk.model_validate(chunk)
    usage = chunks[-2]["usage"]
    return usage["prompt_tokens"], usage["prompt_tokens_details"]["cached_tokens"]


class TestOpencode:
    def test_its_title_request_and_its_session(self, server: Server) -> None:
        """The title request, the main request (keep-alive chunks with an empty delta while its prompt is
        read, each a ChatCompletionChunk, no SSE comment), then the model's tool call and its result: the
        later turn from the cache."""
        title = fixture("opencode-0")
        reply = replay(server, title, capped(title, "max_tokens"))
        assert reply.status == 200
        chat_usage(reply)

        recorded = fixture("opencode-1")
        body = capped(recorded, "max_tokens")
        reply = replay(server, recorded, body)
        assert reply.status == 200
        prompt, _ = chat_usage(reply)
        first_content = next(
            i for i, (_, data) in enumerate(reply.events) if isinstance(data, dict) and _has_output(data)
        )
        keepalives = [data for _, data in reply.events[:first_content] if _is_idle(data)]
        assert len(keepalives) > 0
        assert not any(event == ":" for event, _ in reply.events)

        body["messages"] += [
            {"role": "assistant", "content": "", "tool_calls": [{"id": "call_read", "type": "function", "function": {"name": "read", "arguments": json.dumps({"filePath": "/work/repo/calc.py"})}}]},
            {"role": "tool", "tool_call_id": "call_read", "content": "<file>\n00001| def add(a, b):\n00002|     return a - b\n</file>"},
        ]  # fmt: skip
        reply = replay(server, recorded, body)
        assert reply.status == 200
        _, cached = chat_usage(reply)
        assert cached >= prompt - CACHE_SLACK


def _is_idle(chunk: Any) -> bool:
    """A chat keep-alive: a choice with an empty delta and no finish."""
    return isinstance(chunk, dict) and chunk.get("choices") == [
        {"index": 0, "delta": {}, "finish_reason": None}
    ]


def _has_output(chunk: dict[str, Any]) -> bool:
    return any(
        (c.get("delta") or {}).get("content") or (c.get("delta") or {}).get("tool_calls")
        for c in chunk.get("choices") or ()
    )


# ---- text streams at once with tools offered -----------------------------------------------------


def test_with_tools_offered_the_first_text_comes_with_its_first_tokens(server: Server) -> None:
    """A plain answer with tools offered streams from its first tokens on (counted by the chunks' timings)."""
    tools = [
        {"type": "function", "function": {"name": f"tool_{i}", "description": f"Does thing {i}.", "parameters": {"type": "object", "properties": {"x": {"type": "string"}}}}}
        for i in range(12)
    ]  # fmt: skip
    body = {
        "model": "bubo",
        "messages": [{"role": "user", "content": "Write one sentence about owls."}],
        "tools": tools,
        "max_tokens": 24,
        "temperature": 0,
        "stream": True,
        "timings_per_token": True,
    }
    recorded = {"method": "POST", "path": "/v1/chat/completions", "headers": {}, "body": body}
    chunks = [c for c in replay(server, recorded).data() if isinstance(c, dict) and c.get("choices")]
    texts = [c for c in chunks if c["choices"][0]["delta"].get("content")]
    assert texts, chunks
    assert texts[0]["timings"]["predicted_n"] <= 2
    assert len(texts) >= 10  # one chunk per token or so, not one burst at the end
