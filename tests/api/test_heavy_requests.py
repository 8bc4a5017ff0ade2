"""Heavy requests: off the event loop, bounded in number and size, refused early when they cannot fit."""

from __future__ import annotations

import functools
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
import trio.testing
from quart_trio import QuartTrio

from bubo.api import _context as api_context
from bubo.api._chat import translate as chat_translate
from bubo.api.anthropic import translate as anthropic_translate
from bubo.api.llamacpp.routes import MAX_TOKENS
from bubo.api.ollama import routes as ollama_routes
from bubo.api.ollama import translate as ollama_translate
from bubo.api.responses import translate as responses_translate
from bubo.config import Settings
from bubo.errors import InsufficientMemory, QueueFull
from bubo.service import chat as service_chat
from bubo.service import generation as service_generation
from bubo.service.slot_store import SlotFileStore
from bubo.service.work import Workers
from bubo.tokenizer import HFTokenizer

from ..conftest import RuntimeFactory, serving_app
from ._memory import MIB, guard_with, with_memory

HEAVY = "Heavy"  # the text whose tokenizing is held


class HeldTokenizer:
    """The real tokenizer, except that one chosen method waits until the test lets it go.

    It tells whether a request's heavy step runs on the event loop: if it did,
    nothing else (``/health`` included) could be answered while it waits.
    ``encode`` and ``count`` wait only for a text that contains ``HEAVY``.
    """

    def __init__(self, inner: HFTokenizer, held: str) -> None:
        self._inner = inner
        self.held = held
        self.started = threading.Event()
        self.release = threading.Event()
        self.finished = threading.Event()
        self.texts: list[str] = []  # every text given to encode or count

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def _hold(self, method: str, text: str = HEAVY) -> None:
        if method == self.held and HEAVY in text and not self.started.is_set():
            self.started.set()
            self.release.wait(timeout=10)  # on the event loop this freezes the test for 10 s, then fails it
            self.finished.set()

    def encode(self, text: str, **options: Any) -> list[int]:
        self.texts.append(text)
        self._hold("encode", text)
        return self._inner.encode(text, **options)

    def count(self, text: str, **options: Any) -> int:
        self.texts.append(text)
        self._hold("count", text)
        return self._inner.count(text, **options)

    def decode(self, token_ids: Sequence[int]) -> str:
        self._hold("decode")
        return self._inner.decode(token_ids)


@pytest.fixture(name="held")
def _held(request: pytest.FixtureRequest, tokenizer: HFTokenizer) -> HeldTokenizer:
    return HeldTokenizer(tokenizer, getattr(request, "param", "encode"))


@pytest.fixture(name="held_app")
async def _held_app(
    settings: Settings, make_runtime: RuntimeFactory, held: HeldTokenizer
) -> AsyncIterator[QuartTrio]:
    runtime = attrs.evolve(make_runtime(), tokenizer=held)
    async with serving_app(settings, runtime) as test_app:
        yield test_app


CHAT = {"model": "bubo", "messages": [{"role": "user", "content": f"{HEAVY} lifting"}], "max_tokens": 2}
HEAVY_STEPS = [
    pytest.param("encode", "/tokenize", {"content": f"{HEAVY} lifting"}, id="tokenize"),
    pytest.param("decode", "/detokenize", {"tokens": [1, 2, 3]}, id="detokenize"),
    pytest.param(
        "encode",
        "/completion",
        {"prompt": "Hi", "n_predict": 1, "logit_bias": [[HEAVY, 1.0]]},
        id="completion-logit-bias",
    ),
    pytest.param("encode", "/completion", {"prompt": f"{HEAVY} lifting", "n_predict": 1}, id="completion"),
    pytest.param("encode", "/v1/chat/completions", CHAT, id="chat"),
    pytest.param("encode", "/apply-template", CHAT, id="apply-template"),
    pytest.param("count", "/v1/messages/count_tokens", CHAT, id="count_tokens"),
]


class TestOffTheEventLoop:
    @pytest.mark.parametrize(("held", "path", "body"), HEAVY_STEPS, indirect=["held"])
    async def test_health_answers_while_a_heavy_step_runs(
        self, held_app, held: HeldTokenizer, path: str, body: dict[str, Any]
    ) -> None:
        """While a request tokenizes (or counts, or decodes), /health answers before that step ends."""
        client = held_app.test_client()
        statuses: list[int] = []

        async def heavy() -> None:
            statuses.append((await client.post(path, json=body)).status_code)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(heavy)
            with trio.fail_after(30):
                await trio.to_thread.run_sync(held.started.wait, 30)
            health = await client.get("/health")
            answered_while_held = not held.finished.is_set()
            held.release.set()
        assert health.status_code == 200
        assert answered_while_held
        assert statuses == [200]


SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}}
SMALL_BODIES = [
    pytest.param("/v1/chat/completions", CHAT, id="chat"),
    pytest.param(
        "/v1/chat/completions",
        {**CHAT, "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA}}},
        id="chat-schema",
    ),
    pytest.param("/v1/completions", {"model": "bubo", "prompt": "Hi", "max_tokens": 1}, id="completions"),
    pytest.param(
        "/completion", {"prompt": "Hi", "n_predict": 1, "json_schema": SCHEMA}, id="completion-schema"
    ),
    pytest.param("/v1/messages", {**CHAT, "max_tokens": 1}, id="messages"),
    pytest.param("/v1/responses", {"model": "bubo", "input": "Hi", "max_output_tokens": 1}, id="responses"),
    pytest.param("/api/chat", {**CHAT, "stream": False}, id="ollama-chat"),
    pytest.param("/api/chat", {"model": "bubo", "messages": [], "options": {"top_k": 3}}, id="ollama-load"),
    pytest.param(
        "/api/generate",
        {
            "model": "bubo",
            "prompt": "Hi",
            "context": [1, 2, 3],
            "stream": False,
            "options": {"num_predict": 1},
        },
        id="ollama-generate-context",
    ),
    pytest.param("/apply-template", CHAT, id="apply-template"),
    pytest.param("/lora-adapters", [], id="lora-adapters"),
    pytest.param("/slots/0?action=restore", {"filename": "none.bin"}, id="slots"),
]


class TestEveryBodyOffTheEventLoop:
    @pytest.fixture(name="slot_app")
    async def _slot_app(
        self, settings: Settings, make_runtime: RuntimeFactory, tmp_path: Path
    ) -> AsyncIterator[QuartTrio]:
        """The app with ``--slot-save-path`` (so that ``/slots`` reads its body)."""
        runtime = attrs.evolve(
            make_runtime(),
            slot_files=SlotFileStore(
                directory=tmp_path, max_bytes=1 << 30, max_files=16, fingerprint="b" * 64
            ),
        )
        async with serving_app(settings, runtime) as test_app:
            yield test_app

    @pytest.fixture(name="threads")
    def _threads(self, monkeypatch: pytest.MonkeyPatch) -> list[str]:
        """The thread of each parse, structuring, translation and schema check a request runs."""
        seen: list[str] = []

        def noted(fn: Callable[..., Any]) -> Callable[..., Any]:
            def run(*args: Any, **kwargs: Any) -> Any:
                seen.append(threading.current_thread().name)
                return fn(*args, **kwargs)

            return run

        for module, name in [
            (api_context, "parse_json"),
            (api_context, "parse_json_object"),
            (api_context, "structure"),
            (chat_translate, "chat_request"),
            (anthropic_translate, "messages_request"),
            (responses_translate, "responses_request"),
            (service_chat, "check_schema"),
            (service_generation, "check_schema"),
            (ollama_translate, "check_context"),
            (ollama_routes, "generation_options"),
        ]:
            monkeypatch.setattr(module, name, noted(getattr(module, name)))
        return seen

    @pytest.mark.parametrize(("path", "body"), SMALL_BODIES)
    async def test_a_small_body_is_parsed_and_translated_in_a_worker(
        self, slot_app, threads: list[str], path: str, body: Any
    ) -> None:
        """Not one step of reading a body runs on the event loop's thread, whatever its size and route."""
        response = await slot_app.test_client().post(path, json=body)
        assert response.status_code < 500, await response.get_data()
        assert threads
        assert threading.main_thread().name not in threads


class TestWorkers:
    async def test_at_most_max_jobs_run_at_once(self) -> None:
        """Jobs beyond max_jobs wait for a free worker."""
        workers = Workers(max_jobs=2)
        running = 0
        most = 0
        lock = threading.Lock()
        release = threading.Event()

        def job() -> None:
            nonlocal running, most
            with lock:
                running += 1
                most = max(most, running)
            release.wait(timeout=10)
            with lock:
                running -= 1

        async with trio.open_nursery() as nursery:
            for _ in range(5):
                nursery.start_soon(workers.run, job)
            with trio.fail_after(10):
                while most < 2:
                    await trio.sleep(0.001)
            release.set()
        assert most == 2

    async def test_at_most_max_waiting_wait_for_a_worker(self) -> None:
        """Past max_waiting callers waiting, one more is refused with 503 queue_full and a short Retry-After."""
        workers = Workers(max_jobs=1, max_waiting=2)
        release = threading.Event()
        async with trio.open_nursery() as nursery:
            for _ in range(3):  # one running, two waiting
                nursery.start_soon(workers.run, functools.partial(release.wait, 10))
            await trio.testing.wait_all_tasks_blocked()
            with pytest.raises(QueueFull) as refused:
                await workers.run(lambda: None)
            release.set()
        assert refused.value.headers == {"Retry-After": "1"}
        assert "--max-queue" in refused.value.message
        assert await workers.run(lambda: 7) == 7  # room again once they ran

    async def test_memory_is_admitted_against_what_running_jobs_hold(self) -> None:
        """A job's memory need counts the jobs already running: 60 + 60 MiB do not fit in 100 MiB."""
        workers = Workers(max_jobs=2, guard=guard_with(100 * MIB))
        release = threading.Event()
        outcomes: list[str] = []

        async def first() -> None:
            await workers.run(lambda: release.wait(timeout=10), need_bytes=60 * MIB)
            outcomes.append("first ran")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(first)
            with trio.fail_after(10):
                while workers.reserved_bytes == 0:
                    await trio.sleep(0.001)
            with pytest.raises(InsufficientMemory) as refused:
                await workers.run(lambda: None, need_bytes=60 * MIB)
            release.set()
        assert refused.value.code == "insufficient_memory"
        assert outcomes == ["first ran"]
        assert workers.reserved_bytes == 0
        await workers.run(lambda: None, need_bytes=60 * MIB)  # fits once the first is done


class TestSizeLimits:
    async def test_a_prompt_that_cannot_fit_is_refused_without_tokenizing(
        self, held_app, held: HeldTokenizer
    ) -> None:
        """10 MB of chat in a 2,048-token context: 400 context_length_exceeded from its size alone."""
        held.release.set()
        huge = "word " * 2_000_000
        body = {"model": "bubo", "messages": [{"role": "user", "content": huge}]}
        response = await held_app.test_client().post("/v1/chat/completions", json=body)
        assert response.status_code == 400
        error = (await response.get_json())["error"]
        assert (error["code"], error["param"]) == ("context_length_exceeded", "messages")
        assert "at least" in error["message"]
        assert all(len(text) < 1000 for text in held.texts)  # the huge text was never tokenized

    async def test_a_raw_prompt_that_cannot_fit_is_refused_without_tokenizing(
        self, held_app, held: HeldTokenizer
    ) -> None:
        held.release.set()
        response = await held_app.test_client().post("/completion", json={"prompt": "word " * 500_000})
        assert response.status_code == 400
        error = (await response.get_json())["error"]
        assert (error["code"], error["param"]) == ("context_length_exceeded", "prompt")
        assert all(len(text) < 1000 for text in held.texts)

    async def test_a_prompt_over_the_context_stops_tokenizing_past_it(self, app) -> None:
        """A prompt just over the context is counted only until it is known not to fit."""
        text = "Hello there, how are you? " * 2000  # about 16,000 tokens
        response = await app.test_client().post("/completion", json={"prompt": text})
        error = (await response.get_json())["error"]
        assert (error["code"], error["n_ctx"]) == ("context_length_exceeded", 2048)
        assert 2048 <= error["n_prompt_tokens"] < 16_000

    async def test_tokenize_answers_at_most_max_tokens(self, app) -> None:
        response = await app.test_client().post("/tokenize", json={"content": [1] * (MAX_TOKENS + 1)})
        assert response.status_code == 400
        assert (await response.get_json())["error"]["param"] == "content"

    async def test_tokenize_refuses_a_text_of_more_than_max_tokens(self, app) -> None:
        response = await app.test_client().post("/tokenize", json={"content": "a." * (MAX_TOKENS // 2 + 1)})
        assert response.status_code == 400
        error = (await response.get_json())["error"]
        assert error["param"] == "content"
        assert str(MAX_TOKENS) in error["message"]

    async def test_detokenize_takes_at_most_max_tokens(self, app) -> None:
        response = await app.test_client().post("/detokenize", json={"tokens": [1] * (MAX_TOKENS + 1)})
        assert response.status_code == 400
        assert (await response.get_json())["error"]["param"] == "tokens"

    async def test_a_logit_bias_larger_than_the_vocabulary(self, app) -> None:
        """100,000 text biases (3.2 s on the event loop before) are refused: the vocabulary has 49,152 tokens."""
        bias = [[f"w{n}", 1.0] for n in range(100_000)]
        response = await app.test_client().post("/completion", json={"prompt": "Hi", "logit_bias": bias})
        assert response.status_code == 400
        assert (await response.get_json())["error"]["param"] == "logit_bias"

    async def test_count_tokens_counts_a_prompt_of_any_length(self, app, tokenizer: HFTokenizer) -> None:
        """count_tokens has no context limit: a prompt of 100,000+ tokens is counted whole."""
        text = "Hello there, how are you? " * 20_000
        body = {"model": "bubo", "max_tokens": 1, "messages": [{"role": "user", "content": text}]}
        response = await app.test_client().post("/v1/messages/count_tokens", json=body)
        assert response.status_code == 200
        assert (await response.get_json())["input_tokens"] > len(tokenizer.encode(text))


class TestWorkingMemory:
    @pytest.fixture(name="short_app")
    async def _short_app(self, settings: Settings, make_runtime: RuntimeFactory) -> AsyncIterator[QuartTrio]:
        """The app on a machine with 8 MiB available (the guard's probe says so)."""
        async with serving_app(settings, with_memory(make_runtime(), 8 * MIB)) as test_app:
            yield test_app

    async def test_parsing_and_tokenizing_are_admitted_against_memory(self, short_app) -> None:
        """A 3 MiB body needs more than 8 MiB to parse and tokenize: 503 insufficient_memory, not a try."""
        client = short_app.test_client()
        big = await client.post("/tokenize", json={"content": "word " * 600_000})
        assert big.status_code == 503
        error = (await big.get_json())["error"]
        assert error["code"] == "insufficient_memory"
        assert big.headers["Retry-After"] == "5"
        small = await client.post("/tokenize", json={"content": "word " * 100})
        assert small.status_code == 200
