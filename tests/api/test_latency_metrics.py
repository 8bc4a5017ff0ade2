"""/metrics' latency histograms, fed by every dialect, streaming or not (fake engine).

The counts are exact (one first token and one end per request, one gap per
token after the first); the sums are checked for consistency only, since the
app runs on the real clock: per request, the queue wait comes before the first
token, and the first token plus the gaps after it end before the request does.
"""

from __future__ import annotations

import json

import trio
import trio.testing
from prometheus_client.parser import text_string_to_metric_families

from bubo.engine.fake import FakeEngine, FakeScript

from .._asgi import exchange, post_stream

FAMILIES = (
    "bubo:time_to_first_token_seconds",
    "bubo:inter_token_latency_seconds",
    "bubo:queue_wait_seconds",
    "bubo:request_duration_seconds",
)
MESSAGES = [{"role": "user", "content": "Hi"}]
# (path, body) for each dialect; each is sent streaming and not
REQUESTS = (
    ("/v1/chat/completions", {"model": "bubo", "messages": MESSAGES}),
    ("/v1/completions", {"model": "bubo", "prompt": "Hi"}),
    ("/v1/responses", {"model": "bubo", "input": "Hi"}),
    ("/v1/messages", {"model": "bubo", "max_tokens": 64, "messages": MESSAGES}),
    ("/completion", {"prompt": "Hi"}),
)


async def scrape(app) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of /metrics by name and labels."""
    text = (await (await app.test_client().get("/metrics")).get_data()).decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def outcomes(samples) -> dict[str, float]:
    return {
        outcome: value(samples, "bubo:request_duration_seconds_count", outcome=outcome)
        for outcome in ("finished", "cancelled", "failed")
    }


async def test_the_families_are_there_before_any_request(app) -> None:
    """A scraper sees all four histograms, empty, as soon as the model is loaded."""
    text = (await (await app.test_client().get("/metrics")).get_data()).decode()
    for name in FAMILIES:
        assert f"# TYPE {name} histogram" in text
    assert "_created" not in text
    samples = await scrape(app)
    for name in FAMILIES[:3]:
        assert value(samples, f"{name}_count") == 0
    assert outcomes(samples) == {"finished": 0, "cancelled": 0, "failed": 0}


async def test_every_dialect_streaming_or_not_is_measured(app, script: FakeScript) -> None:
    """Ten requests of three tokens: ten first tokens, twenty gaps, ten queue waits, ten finished."""
    script.reply = "one two three"
    client = app.test_client()
    for path, body in REQUESTS:
        response = await client.post(path, json=body)
        assert response.status_code == 200, await response.get_data()
        streamed = await post_stream(app.app, path, {**body, "stream": True})
        assert b"three" in streamed
    samples = await scrape(app)
    assert value(samples, "bubo:time_to_first_token_seconds_count") == 10
    assert value(samples, "bubo:inter_token_latency_seconds_count") == 20
    assert value(samples, "bubo:queue_wait_seconds_count") == 10
    assert outcomes(samples) == {"finished": 10, "cancelled": 0, "failed": 0}
    queue_wait = value(samples, "bubo:queue_wait_seconds_sum")
    first_token = value(samples, "bubo:time_to_first_token_seconds_sum")
    gaps = value(samples, "bubo:inter_token_latency_seconds_sum")
    duration = value(samples, "bubo:request_duration_seconds_sum", outcome="finished")
    assert 0 <= queue_wait <= first_token
    assert 0 < first_token + gaps <= duration


async def test_requests_refused_before_the_queue_are_not_measured(app) -> None:
    """A 400 never waited for a slot: no latency is recorded for it."""
    response = await app.test_client().post("/v1/chat/completions", json={"model": "bubo", "messages": []})
    assert response.status_code == 400
    samples = await scrape(app)
    assert value(samples, "bubo:time_to_first_token_seconds_count") == 0
    assert outcomes(samples) == {"finished": 0, "cancelled": 0, "failed": 0}


async def test_a_client_that_leaves_mid_stream_is_a_cancelled_request(
    app, script: FakeScript, fake_engine: FakeEngine
) -> None:
    """Its duration counts as cancelled; its tokens until then are timed."""
    script.reply = "word " * 500
    script.piece_delay = 0.01
    body = {"model": "bubo", "messages": MESSAGES, "stream": True}
    async with exchange(app.app, "/v1/chat/completions", json.dumps(body).encode()) as connection:
        await connection.receive_chunk()  # role chunk
        await connection.receive_chunk()  # first word
        await connection.receive_chunk()  # second word
        await connection.disconnect()
    with trio.fail_after(5):
        await fake_engine.wait_until(lambda statistics: statistics.requests_processing == 0)
        await trio.testing.wait_all_tasks_blocked()  # the handler has finished its bookkeeping
    samples = await scrape(app)
    assert outcomes(samples) == {"finished": 0, "cancelled": 1, "failed": 0}
    assert value(samples, "bubo:time_to_first_token_seconds_count") == 1
    assert 1 <= value(samples, "bubo:inter_token_latency_seconds_count") < 500
    assert fake_engine.cancelled == 1


async def test_a_failed_generation_is_a_failed_request(app, script: FakeScript) -> None:
    """An engine failure mid-way ends the request as failed."""
    script.reply = "one two three"
    script.fail_after = 1
    response = await app.test_client().post("/completion", json={"prompt": "Hi"})
    assert response.status_code == 500
    samples = await scrape(app)
    assert outcomes(samples) == {"finished": 0, "cancelled": 0, "failed": 1}
    assert value(samples, "bubo:time_to_first_token_seconds_count") == 1
    assert value(samples, "bubo:inter_token_latency_seconds_count") == 0
