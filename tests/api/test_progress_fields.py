"""``return_progress`` and ``timings_per_token`` on /v1/chat/completions as on /completion (fake engine)."""

from __future__ import annotations

from dirty_equals import IsInt, IsNumber

from bubo.api._progress import progress
from bubo.domain.generation import PromptProgress
from bubo.engine.fake import FakeScript

from .._sse import payloads as events

USER = [{"role": "user", "content": "hi"}]
TIMINGS = {
    "cache_n": IsInt,
    "shared_tokens": IsInt,
    "prompt_n": IsInt,
    "prompt_ms": IsNumber,
    "prompt_per_token_ms": IsNumber,
    "prompt_per_second": IsNumber,
    "predicted_n": IsInt,
    "predicted_ms": IsNumber,
    "predicted_per_token_ms": IsNumber,
    "predicted_per_second": IsNumber,
}


async def chat_stream(app, **fields: object) -> list[dict]:
    body = {"model": "bubo", "messages": USER, "stream": True, **fields}
    return events(await (await app.test_client().post("/v1/chat/completions", json=body)).get_data())


def test_processed_counts_the_reused_tokens() -> None:
    """llama-server's meaning: overall progress is processed / total, reading's (processed - cache) / (total - cache)."""
    wire = progress(PromptProgress(total=10, cached=4, processed=3, elapsed_ms=1.25))
    assert (wire.total, wire.cache, wire.processed, wire.time_ms) == (10, 4, 7, 1.25)


class TestChat:
    async def test_return_progress_streams_prompt_progress_first(self, app, script: FakeScript) -> None:
        script.reply = " one two"  # quart-trio's test client holds 10 body chunks until the response ends
        chunks = await chat_stream(app, return_progress=True)
        progress = [c for c in chunks if "prompt_progress" in c]
        assert progress
        first_text = next(
            i for i, c in enumerate(chunks) if c["choices"] and c["choices"][0]["delta"].get("content")
        )
        assert chunks.index(progress[-1]) < first_text
        assert all(c["choices"] == [] and c["object"] == "chat.completion.chunk" for c in progress)
        last = progress[-1]["prompt_progress"]
        assert last == {"total": IsInt, "cache": 0, "processed": IsInt, "time_ms": IsNumber}
        assert last["processed"] == last["total"]

    async def test_without_it_no_progress(self, app) -> None:
        assert not any("prompt_progress" in c for c in await chat_stream(app))

    async def test_timings_per_token_puts_timings_on_every_chunk_after_the_role_chunk(
        self, app, script: FakeScript
    ) -> None:
        script.reply = " one two three"
        chunks = await chat_stream(app, timings_per_token=True)
        assert "timings" not in chunks[0]  # the role chunk: llama-server's suite checks it has none
        assert all(c["timings"] == TIMINGS for c in chunks[1:])
        content = [c for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")]
        assert [c["timings"]["predicted_n"] for c in content] == [1, 2, 3]

    async def test_without_it_only_the_last_chunk_has_timings(self, app) -> None:
        chunks = await chat_stream(app)
        assert [("timings" in c) for c in chunks] == [False] * (len(chunks) - 1) + [True]


class TestCompletion:
    async def test_timings_per_token_puts_timings_on_every_chunk_after_the_role_chunk(
        self, app, script: FakeScript
    ) -> None:
        script.reply = " one two"
        response = await app.test_client().post(
            "/completion", json={"prompt": "x", "stream": True, "timings_per_token": True}
        )
        chunks = events(await response.get_data())
        assert [c["timings"]["predicted_n"] for c in chunks[:-1]] == [1, 2]
        assert chunks[-1]["timings"] == TIMINGS
