"""Ollama's API end to end: real servers, real models, and the real clients apps use.

`ollama` (Python; its pydantic models parse every answer), LangChain's
`ChatOllama`/`OllamaEmbeddings` (`langchain-ollama`), and `ollama` for
JavaScript (npm, run under the system `node`: tests/e2e/node/). Three servers:
the default model (SmolLM2); Qwen2.5-Coder-0.5B (tools, fill-in-the-middle,
embeddings); SmolLM2 with a Qwen3-style template and a grammar that forces the
``<think>`` shape (MODELS.md: no small thinking model installs from a registry).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import ollama
import pytest
from langchain_core.messages import HumanMessage, ToolMessage
from langchain_ollama import ChatOllama, OllamaEmbeddings
from tests._models import qwen25_coder_path

from .conftest import Server, bubo_command, free_port, hypercorn_command, serving, start_server, stop_server

pytestmark = [pytest.mark.e2e, pytest.mark.llama]

FIXTURES = Path(__file__).parent.parent / "fixtures"
NODE_PROJECT = Path(__file__).parent / "node"
GREEDY = {"temperature": 0, "top_k": 1}
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Get the current weather for a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}  # fmt: skip
QUESTION = "What is the weather in Paris right now?"


def client(server: Server) -> ollama.Client:
    return ollama.Client(host=server.base_url, timeout=120)


@pytest.fixture(name="ollama_js", scope="session")
def _ollama_js(node_modules: Path) -> Path:
    """ollama-js's entry module, installed from tests/e2e/node's lock file."""
    return node_modules / "ollama" / "dist" / "index.mjs"


ONE_SHOT = {"headers": {"Connection": "close"}}
"""LangChain's clients are never closed: each connection closes after its answer, so none is left open."""


def langchain_chat(server: Server, **settings: Any) -> ChatOllama:
    """LangChain's ChatOllama on *server*, greedy."""
    return ChatOllama(
        model="bubo", base_url=server.base_url, temperature=0, top_k=1, client_kwargs=ONE_SHOT, **settings
    )


def run_js(ollama_js: Path, server: Server, scenario: str) -> dict[str, Any]:
    node = shutil.which("node")
    assert node is not None, "node is needed (Debian's nodejs package)"
    result = subprocess.run(
        [node, str(NODE_PROJECT / "ollama_client.mjs"), ollama_js.as_uri(), server.base_url, scenario],
        capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def slots_idle(server: Server) -> bool:
    slots = httpx.get(server.base_url + "/slots", timeout=10).json()
    return not any(slot["is_processing"] for slot in slots)


class TestDefaultModel:
    """SmolLM2 on the session's server (hypercorn bubo.app:app)."""

    def test_list_show_and_version(self, server: Server) -> None:
        """The Python client's pydantic models parse tags, ps and show; the model is listed under :latest."""
        with client(server) as api:
            listed = api.list()
            assert [m.model for m in listed.models][-1] == "bubo:latest"
            assert listed.models[0].details.format == "gguf"
            assert listed.models[0].size
            assert listed.models[0].modified_at
            running = api.ps()
            assert running.models[0].context_length == 2048
            shown = api.show("bubo")
            assert shown.capabilities == ["completion", "tools"]
            assert shown.modelinfo["llama.context_length"] == 2048
        version = httpx.get(server.base_url + "/api/version", timeout=10).json()["version"]
        assert tuple(map(int, version.split("."))) >= (0, 6, 4)
        head = httpx.head(server.base_url + "/", timeout=10)
        assert (head.status_code, head.text) == (200, "")
        assert httpx.get(server.base_url + "/", timeout=10).text == "Ollama is running"

    def test_chat_streamed_and_not(self, server: Server) -> None:
        """Both forms give the same greedy answer; the stream ends with done_reason and the counts."""
        messages = [{"role": "user", "content": "What is the capital of France?"}]
        with client(server) as api:
            whole = api.chat(model="bubo", messages=messages, options={**GREEDY, "num_predict": 12})
            parts = list(
                api.chat(model="BUBO", messages=messages, options={**GREEDY, "num_predict": 12}, stream=True)
            )
        assert whole.done
        assert whole.message.content
        assert "".join(p.message.content or "" for p in parts) == whole.message.content
        final = parts[-1]
        assert (final.done, final.done_reason, final.model) == (True, whole.done_reason, "BUBO")
        assert final.eval_count == whole.eval_count
        assert len(parts) == final.eval_count + 1  # a line per token, then the final line
        assert final.prompt_eval_count > 0
        assert final.total_duration >= final.eval_duration > 0

    def test_format_with_a_schema(self, server: Server) -> None:
        schema = {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 20}},
            "required": ["city"],
        }
        with client(server) as api:
            answer = api.chat(
                model="bubo", messages=[{"role": "user", "content": "Name a city, as JSON."}],
                format=schema, options={**GREEDY, "num_predict": 48},
            )  # fmt: skip
        jsonschema.validate(json.loads(answer.message.content), schema)

    def test_generate_raw_and_templated(self, server: Server) -> None:
        """raw continues the text as it is, without context; templated generate returns a context."""
        with client(server) as api:
            raw = api.generate(model="bubo", prompt="The capital of France is", raw=True,
                               options={**GREEDY, "num_predict": 4})  # fmt: skip
            chat_like = api.generate(model="bubo", prompt="Say hi.", options={**GREEDY, "num_predict": 4})
            follow_up = api.generate(model="bubo", prompt="Again.", context=chat_like.context,
                                     options={**GREEDY, "num_predict": 4})  # fmt: skip
        assert "Paris" in raw.response
        assert raw.context is None
        assert chat_like.context
        assert follow_up.prompt_eval_count > len(chat_like.context)

    def test_a_client_that_leaves_frees_its_slot(self, server: Server) -> None:
        with client(server) as api:
            stream = api.chat(model="bubo", messages=[{"role": "user", "content": "Count to a thousand."}],
                              options={"num_predict": 2000, "temperature": 0}, stream=True)  # fmt: skip
            next(stream)
            next(stream)
            stream.close()  # leaves mid-stream: the connection closes
            deadline = time.monotonic() + 10
            while not slots_idle(server):
                assert time.monotonic() < deadline, "the slot is still busy"
                time.sleep(0.05)
            after = api.chat(
                model="bubo", messages=[{"role": "user", "content": "Hi"}], options={"num_predict": 2}
            )
        assert after.done

    def test_errors(self, server: Server) -> None:
        with client(server) as api:
            with pytest.raises(ollama.ResponseError) as missing:
                api.chat(model="llama3.2", messages=[{"role": "user", "content": "Hi"}])
            with pytest.raises(ollama.ResponseError) as thinking:
                api.chat(model="bubo", messages=[{"role": "user", "content": "Hi"}], think=True)
            with pytest.raises(ollama.ResponseError) as options:
                api.chat(
                    model="bubo", messages=[{"role": "user", "content": "Hi"}], options={"top_k": "many"}
                )
        assert (missing.value.status_code, missing.value.error) == (404, "model 'llama3.2' not found")
        assert thinking.value.status_code == 400
        assert (options.value.status_code, options.value.error) == (400, "option 'top_k' must be an integer")

    def test_langchain(self, server: Server) -> None:
        """ChatOllama invokes and streams (it sends Ollama's own options)."""
        chat = langchain_chat(server, num_predict=8)
        whole = chat.invoke([HumanMessage("What is the capital of France?")])
        streamed = "".join(
            str(chunk.content) for chunk in chat.stream([HumanMessage("What is the capital of France?")])
        )
        assert whole.content
        assert streamed == whole.content
        assert whole.usage_metadata is not None
        assert whole.usage_metadata["output_tokens"] == 8

    def test_javascript(self, server: Server, ollama_js: Path) -> None:
        seen = run_js(ollama_js, server, "basic")
        assert seen["names"][-1] == "bubo:latest"
        assert seen["capabilities"] == ["completion", "tools"]
        assert seen["context_length"] == 2048
        assert seen["whole"]["done"] is True
        assert "".join(seen["stream"]["parts"]) == seen["whole"]["content"]
        assert (seen["stream"]["last_done"], seen["stream"]["eval_count"]) == (
            True,
            seen["whole"]["eval_count"],
        )
        assert "Paris" in seen["raw"]["response"]
        assert seen["raw"]["context"] is None
        assert json.loads(seen["formatted"]) == {"legs": 4}


@pytest.fixture(name="coder", scope="module")
def _coder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """Qwen2.5-Coder-0.5B: a tools template, fill-in-the-middle tokens, embeddings."""
    env = {"BUBO_MODEL": str(qwen25_coder_path()), "BUBO_CTX_SIZE": "4096", "BUBO_EMBEDDINGS": "on",
           "BUBO_POOLING": "mean"}  # fmt: skip
    with serving(
        tmp_path_factory.mktemp("coder") / "hypercorn.log", env=env, command=hypercorn_command
    ) as server:
        yield server


class TestCoder:
    def test_tools_round_trip(self, coder: Server) -> None:
        """The call comes back with arguments as an object; its result, sent as a tool message, is used."""
        messages: list[Any] = [{"role": "user", "content": QUESTION}]
        with client(coder) as api:
            called = api.chat(model="bubo", messages=messages, tools=[WEATHER], options=GREEDY)
            (call,) = called.message.tool_calls
            assert (call.function.name, call.function.arguments) == ("get_weather", {"city": "Paris"})
            assert called.done_reason == "stop"
            messages += [called.message, {"role": "tool", "tool_name": "get_weather",
                                          "content": '{"temperature": "24 C", "sky": "sunny"}'}]  # fmt: skip
            answered = api.chat(
                model="bubo", messages=messages, tools=[WEATHER], options={**GREEDY, "num_predict": 40}
            )
            streamed = list(
                api.chat(model="bubo", messages=messages[:1], tools=[WEATHER], options=GREEDY, stream=True)
            )
        assert "24" in answered.message.content
        calls = [c for part in streamed for c in part.message.tool_calls or ()]
        assert [c.function.arguments for c in calls] == [{"city": "Paris"}]

    def test_generate_with_suffix(self, coder: Server) -> None:
        with client(coder) as api:
            filled = api.generate(model="bubo", prompt="def add(a, b):\n    return ", suffix="\n\nprint(add(1, 2))\n",
                                  options={**GREEDY, "num_predict": 8})  # fmt: skip
            assert api.show("bubo").capabilities == ["completion", "tools", "insert", "embedding"]
        assert filled.response.strip().startswith("a + b")

    def test_embed(self, coder: Server) -> None:
        """Unit vectors; a paraphrase is nearer than an unrelated sentence; dimensions shortens them."""
        texts = [
            "The cat sat on the mat.",
            "A cat was sitting on the rug.",
            "Quarterly revenue grew by four percent.",
        ]
        with client(coder) as api:
            vectors = api.embed(model="bubo", input=texts).embeddings
            short = api.embed(model="bubo", input=texts[0], dimensions=64).embeddings[0]
            legacy = api.embeddings(model="bubo", prompt=texts[0]).embedding

        def cosine(a: Any, b: Any) -> float:
            return sum(x * y for x, y in zip(a, b, strict=True))

        assert all(abs(cosine(v, v) - 1) < 1e-4 for v in vectors)
        assert cosine(vectors[0], vectors[1]) > cosine(vectors[0], vectors[2])
        assert len(short) == 64
        assert legacy == pytest.approx(vectors[0], abs=1e-5)

    def test_langchain_tools_and_embeddings(self, coder: Server) -> None:
        chat = langchain_chat(coder).bind_tools([WEATHER])
        question = HumanMessage(QUESTION)
        called = chat.invoke([question])
        (call,) = called.tool_calls
        assert (call["name"], call["args"]) == ("get_weather", {"city": "Paris"})
        result = ToolMessage('{"temperature": "24 C"}', tool_call_id=call["id"], name="get_weather")
        answered = chat.invoke([question, called, result])
        assert "24" in str(answered.content)
        embeddings = OllamaEmbeddings(model="bubo", base_url=coder.base_url, client_kwargs=ONE_SHOT)
        vector = embeddings.embed_query("The cat sat on the mat.")
        assert len(vector) == 896

    def test_javascript(self, coder: Server, ollama_js: Path) -> None:
        seen = run_js(ollama_js, coder, "coder")
        assert seen["call"] == {"name": "get_weather", "arguments": {"city": "Paris"}}
        assert "24" in seen["answer"]
        assert seen["filled"].strip().startswith("a + b")
        assert seen["dimensions"] == [896, 896]


@pytest.fixture(name="thinker", scope="module")
def _thinker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """SmolLM2 with a Qwen3-style template, its answers forced into the <think> shape."""
    port = free_port()
    env = {"BUBO_CHAT_TEMPLATE_FILE": str(FIXTURES / "qwen3_style.jinja"),
           "BUBO_GRAMMAR_FILE": str(FIXTURES / "think_short.gbnf")}  # fmt: skip
    server = start_server(
        hypercorn_command(port), port, tmp_path_factory.mktemp("thinker") / "hc.log", env=env
    )
    yield server
    stop_server(server)


class TestThinking:
    def test_python_langchain_and_javascript(self, thinker: Server, ollama_js: Path) -> None:
        """thinking is its own field in every client; the answer holds none of it."""
        with client(thinker) as api:
            answer = api.chat(
                model="bubo", messages=[{"role": "user", "content": "Say hi."}], think=True, options=GREEDY
            )
            parts = list(api.chat(model="bubo", messages=[{"role": "user", "content": "Say hi."}], think="high",
                                  options=GREEDY, stream=True))  # fmt: skip
            assert "thinking" in api.show("bubo").capabilities
        assert answer.message.thinking
        assert "<think>" not in answer.message.content
        assert "".join(p.message.thinking or "" for p in parts) == answer.message.thinking
        reasoning = langchain_chat(thinker, reasoning=True)
        message = reasoning.invoke([HumanMessage("Say hi.")])
        assert message.additional_kwargs["reasoning_content"] == answer.message.thinking
        seen = run_js(ollama_js, thinker, "thinking")
        assert (seen["thinking"], seen["content"]) == (answer.message.thinking, answer.message.content)


def test_an_error_mid_stream_reaches_the_client(tmp_path: Path) -> None:
    """At the shutdown deadline a running stream ends with an {"error"} line: the client raises it."""
    port = free_port()
    command = [bubo_command(), "serve", "--port", str(port), "-c", "4096", "--shutdown-timeout", "1"]
    server = start_server(command, port, tmp_path / "serve.log")
    try:
        with client(server) as api:
            # A raw count goes on to the token limit (thousands of tokens, seconds) rather than ending.
            stream = api.generate(model="bubo", prompt="1, 2, 3, 4, 5, 6, 7, 8, 9, 10,", raw=True,
                                  options={"num_predict": 4000, "temperature": 0}, stream=True)  # fmt: skip
            first = next(stream)
            assert first.done is False
            server.process.terminate()
            with pytest.raises(ollama.ResponseError, match="shutting down"):
                for _part in stream:
                    pass
        assert server.process.wait(timeout=30) == 0
    finally:
        stop_server(server)
