"""Keep-alives through the real clients: a prompt read slowly, streamed in every dialect, parsed unchanged.

The server is ``harness_server.py`` with a 0.2 s ``--sse-keepalive``; its
``prefill-delay`` switch makes every prompt chunk wait two seconds, so each
stream below is silent for about ten keep-alive intervals before its first
token, on any machine.  Each client streams a greedy answer with the delay on
(a prompt nothing has cached yet, so it is really read) and gets it again
without: the keep-alives it saw are counted (more than none, so the test can
fail) and its assembled answer must be the same.  Clients: the OpenAI SDKs
for Python and JavaScript (chat with their stream helpers, completions),
litellm (what aider and many proxies use), and Ollama's Python client (chat
and generate).  What the agent CLIs see is in test_agent_replays.py.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import attrs
import httpx
import ollama
import openai
import pytest

from .conftest import (
    NODE_PROJECT,
    Server,
    harness_command,
    openai_client,
    serving,
)

pytestmark = [pytest.mark.e2e, pytest.mark.llama]

PREFILL_DELAY_S = 2.0  # per prompt chunk: ten 0.2 s keep-alive intervals
GREEDY = {"temperature": 0, "top_k": 1}


@attrs.frozen
class Harness:
    server: Server
    control: Path

    @contextmanager
    def slow_prefill(self) -> Iterator[None]:
        """Every prompt chunk read meanwhile waits PREFILL_DELAY_S first."""
        switch = self.control / "prefill-delay"
        switch.write_text(str(PREFILL_DELAY_S))
        try:
            yield
        finally:
            switch.unlink()


@pytest.fixture(name="harness", scope="module")
def _harness(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
    control = tmp_path_factory.mktemp("keepalive-control")
    log = tmp_path_factory.mktemp("keepalive") / "harness.log"
    with serving(log, env={"BUBO_SSE_KEEPALIVE": "0.2"}, command=harness_command(control)) as server:
        yield Harness(server=server, control=control)


class Tap(httpx.HTTPTransport):
    """An httpx transport that keeps a copy of every response body its client reads."""

    def __init__(self) -> None:
        super().__init__()
        self.bodies: list[bytearray] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        body = bytearray()
        self.bodies.append(body)
        response.stream = _Copying(response.stream, body)  # type: ignore[arg-type]
        return response


class _Copying(httpx.SyncByteStream):
    def __init__(self, stream: Any, copy: bytearray) -> None:
        self._stream = stream
        self._copy = copy

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self._stream:
            self._copy.extend(chunk)
            yield chunk

    def close(self) -> None:
        self._stream.close()


def idle_chat_chunk(chunk: dict[str, Any]) -> bool:
    """A chat keep-alive: one choice, an empty delta, no finish."""
    choices = chunk.get("choices") or []
    return len(choices) == 1 and not any(choices[0]["delta"].values()) and choices[0]["finish_reason"] is None


def idle_completion_chunk(chunk: dict[str, Any]) -> bool:
    """A completions keep-alive: one choice with empty text, no finish."""
    choices = chunk.get("choices") or []
    return len(choices) == 1 and choices[0]["text"] == "" and choices[0]["finish_reason"] is None


def before_first(chunks: list[dict[str, Any]], has_output: Any) -> list[dict[str, Any]]:
    return chunks[: next(i for i, chunk in enumerate(chunks) if has_output(chunk))]


def chat_text(chunk: dict[str, Any]) -> bool:
    return any((c["delta"] or {}).get("content") for c in chunk.get("choices") or ())


def completion_text(chunk: dict[str, Any]) -> bool:
    return any(c["text"] for c in chunk.get("choices") or ())


def check_chat_stream(chunks: list[dict[str, Any]]) -> None:
    """The invariants clients rely on: the role first and once, one finish, the usage chunk last."""
    with_choices = [chunk for chunk in chunks if chunk["choices"]]
    roles = [chunk for chunk in with_choices if chunk["choices"][0]["delta"].get("role")]
    assert roles == [with_choices[0]]
    finishes = [chunk for chunk in with_choices if chunk["choices"][0]["finish_reason"]]
    assert finishes == [with_choices[-1]]
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"]["completion_tokens"] > 0


# ---- the OpenAI Python SDK ---------------------------------------------------------------------------


def test_openai_python_chat_with_its_stream_helper(harness: Harness) -> None:
    """client.chat.completions.stream(): the keep-alives reach its chunk events, its final message is the
    answer (the role once, not joined with itself), the same as without a delay."""
    messages = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
    settings = {"model": "bubo", "messages": messages, "max_tokens": 24, "temperature": 0}
    with openai_client(harness.server) as client:
        with (
            harness.slow_prefill(),
            client.chat.completions.stream(**settings, stream_options={"include_usage": True}) as stream,
        ):
            chunks = [event.chunk.model_dump() for event in stream if event.type == "chunk"]
            final = stream.get_final_completion()
        plain = client.chat.completions.create(**settings)
    assert len([c for c in before_first(chunks, chat_text) if idle_chat_chunk(c)]) > 0
    check_chat_stream(chunks)
    message = final.choices[0].message
    assert (message.role, message.content) == ("assistant", plain.choices[0].message.content)
    assert final.choices[0].finish_reason == plain.choices[0].finish_reason


def test_openai_python_completions(harness: Harness) -> None:
    """Streamed completions: empty-text keep-alives, then the same text as without a delay."""
    settings = {
        "model": "bubo",
        "prompt": "The three primary colours are",
        "max_tokens": 12,
        "temperature": 0,
    }
    with openai_client(harness.server) as client:
        with harness.slow_prefill():
            chunks = [chunk.model_dump() for chunk in client.completions.create(**settings, stream=True)]
        plain = client.completions.create(**settings)
    assert len([c for c in before_first(chunks, completion_text) if idle_completion_chunk(c)]) > 0
    assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == plain.choices[0].text


# ---- the OpenAI JavaScript SDK (qwen-code bundles it) ----------------------------------------------


def run_openai_js(node_modules: Path, server: Server, scenario: str, prompt: str) -> dict[str, Any]:
    node = shutil.which("node")
    assert node is not None, "node is needed (Debian's nodejs package)"
    module = (node_modules / "openai" / "index.mjs").as_uri()
    result = subprocess.run(
        [node, str(NODE_PROJECT / "openai_client.mjs"), module, f"{server.base_url}/v1", scenario, prompt],
        capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    seen: dict[str, Any] = json.loads(result.stdout)
    return seen


def test_openai_js_chat_with_its_stream_helper(harness: Harness, node_modules: Path) -> None:
    """openai-node's ChatCompletionStream: the keep-alives are chunks it emits, its final message the answer."""
    prompt = "What is the capital of Italy? Answer in one word."
    with harness.slow_prefill():
        seen = run_openai_js(node_modules, harness.server, "chat", prompt)
    with openai_client(harness.server) as client:
        plain = client.chat.completions.create(
            model="bubo", messages=[{"role": "user", "content": prompt}], max_tokens=24, temperature=0
        )
    assert len([c for c in before_first(seen["chunks"], chat_text) if idle_chat_chunk(c)]) > 0
    check_chat_stream(seen["chunks"])
    assert seen["message"]["role"] == "assistant"
    assert seen["message"]["content"] == plain.choices[0].message.content
    assert seen["finish_reason"] == plain.choices[0].finish_reason


def test_openai_js_completions(harness: Harness, node_modules: Path) -> None:
    prompt = "The largest planets of the solar system are"
    with harness.slow_prefill():
        seen = run_openai_js(node_modules, harness.server, "completions", prompt)
    with openai_client(harness.server) as client:
        plain = client.completions.create(model="bubo", prompt=prompt, max_tokens=12, temperature=0)
    chunks = seen["chunks"]
    assert len([c for c in before_first(chunks, completion_text) if idle_completion_chunk(c)]) > 0
    assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == plain.choices[0].text


# ---- litellm -----------------------------------------------------------------------------------------


@pytest.fixture(name="litellm")
def _litellm(monkeypatch: pytest.MonkeyPatch) -> Any:
    """litellm, offline: its model price map from the package, not fetched."""
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm

    return litellm


def test_litellm_chat(harness: Harness, litellm: Any) -> None:
    """litellm's stream wrapper over the OpenAI SDK: the keep-alives reached it (counted in the bytes its
    client read) and it yields the same text as its non-streamed answer."""
    tap = Tap()
    messages = [{"role": "user", "content": "What is the capital of Spain? Answer in one word."}]
    settings = {"model": "openai/bubo", "messages": messages, "max_tokens": 24, "temperature": 0}
    base_url = f"{harness.server.base_url}/v1"
    with httpx.Client(transport=tap, timeout=120) as http:
        client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, http_client=http)
        with harness.slow_prefill():
            parts = list(litellm.completion(**settings, stream=True, client=client))
        plain = litellm.completion(**settings, client=client)
    streamed = "".join(part.choices[0].delta.content or "" for part in parts if part.choices)
    assert streamed == plain.choices[0].message.content
    frames = [
        json.loads(line[len(b"data: ") :])
        for line in tap.bodies[0].splitlines()
        if line.startswith(b"data: {")
    ]
    assert len([c for c in before_first(frames, chat_text) if idle_chat_chunk(c)]) > 0
    assert sum(1 for part in parts if part.choices and part.choices[0].finish_reason) == 1


# ---- Ollama's Python client --------------------------------------------------------------------------


def test_ollama_python_chat(harness: Harness) -> None:
    """Keep-alive lines are chunks with empty content the client yields; the joined answer is unchanged."""
    messages = [{"role": "user", "content": "Name three kinds of owl."}]
    with ollama.Client(host=harness.server.base_url, timeout=120) as api:
        with harness.slow_prefill():
            parts = list(
                api.chat(model="bubo", messages=messages, options={**GREEDY, "num_predict": 12}, stream=True)
            )
        whole = api.chat(model="bubo", messages=messages, options={**GREEDY, "num_predict": 12})
    first = next(i for i, part in enumerate(parts) if part.message.content)
    idle = [part for part in parts[:first] if not part.done and part.message.content == ""]
    assert len(idle) == first > 0
    assert "".join(part.message.content or "" for part in parts) == whole.message.content
    assert [part.done for part in parts].count(True) == 1
    assert parts[-1].done
    assert parts[-1].eval_count == whole.eval_count


def test_ollama_python_generate(harness: Harness) -> None:
    prompt = "Three colours of the rainbow are"
    with ollama.Client(host=harness.server.base_url, timeout=120) as api:
        with harness.slow_prefill():
            parts = list(
                api.generate(model="bubo", prompt=prompt, options={**GREEDY, "num_predict": 12}, stream=True)
            )
        whole = api.generate(model="bubo", prompt=prompt, options={**GREEDY, "num_predict": 12})
    first = next(i for i, part in enumerate(parts) if part.response)
    idle = [part for part in parts[:first] if not part.done and part.response == "" and part.context is None]
    assert len(idle) == first > 0
    assert "".join(part.response for part in parts) == whole.response
    assert [part.done for part in parts].count(True) == 1
    assert parts[-1].context
