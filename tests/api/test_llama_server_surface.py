"""llama-server's switches and what its metrics tell, over the fake engine.

``Process-Start-Time-Unix`` on ``/metrics``, ``--no-metrics`` and ``--no-slots``
(501, as llama-server), an idle slot's counters, generation rates without the
first token, ``timings`` on prompt-progress chunks, ``--tags`` and aliases in
``/v1/models``, and ``--cors-origins localhost``.
"""

from __future__ import annotations

import time

import attrs
import pytest
from tests.conftest import wait_until_ready

from bubo.config import Settings
from bubo.engine.fake import FakeScript
from bubo.server import create_app

from .._sse import payloads as events


async def _served(settings: Settings, make_runtime, **server):
    return create_app(
        attrs.evolve(settings, server=attrs.evolve(settings.server, **server)),
        load=lambda _s, _p: make_runtime(),
        on_load_failure=lambda: None,
    )


@pytest.fixture(name="bare_app")
async def _bare_app(settings, make_runtime, request):
    app = await _served(settings, make_runtime, **request.param)
    async with app.test_app() as test_app:
        await wait_until_ready(app)
        yield test_app


class TestMetrics:
    async def test_process_start_time_header(self, app) -> None:
        """/metrics carries the server's start as unix seconds, as llama-server's does."""
        response = await app.test_client().get("/metrics")
        started = int(response.headers["Process-Start-Time-Unix"])
        assert time.time() - 600 < started <= time.time()

    @pytest.mark.parametrize(
        ("bare_app", "path"),
        [({"metrics": False}, "/metrics"), ({"slots": False}, "/slots")],
        indirect=["bare_app"],
    )
    async def test_switched_off_is_501(self, bare_app, path) -> None:
        """--no-metrics and --no-slots make their endpoint 501 not_implemented."""
        response = await bare_app.test_client().get(path)
        assert response.status_code == 501
        assert (await response.get_json())["error"]["code"] == "not_implemented"

    async def test_idle_slot_counters(self, app) -> None:
        """A finished task's budget does not stay on the idle slot: n_decoded 0, n_remain -1."""
        client = app.test_client()
        await client.post("/completion", json={"prompt": "I believe", "n_predict": 8})
        slots = await (await client.get("/slots")).get_json()
        assert all(not s["is_processing"] for s in slots)
        assert {(s["next_token"][0]["n_decoded"], s["next_token"][0]["n_remain"]) for s in slots} == {(0, -1)}


class TestTimings:
    async def test_one_token_has_no_rate(self, app, script: FakeScript) -> None:
        """The first token comes from the prompt's logits: one token's generation rate is 0."""
        script.reply = " one"
        body = await (
            await app.test_client().post("/completion", json={"prompt": "x", "n_predict": 1})
        ).get_json()
        timings = body["timings"]
        assert timings["predicted_n"] == 1
        assert (timings["predicted_per_second"], timings["predicted_per_token_ms"]) == (0.0, 0.0)

    async def test_rate_over_the_decode_steps(self, app, script: FakeScript) -> None:
        """n tokens take n - 1 decode steps: the rate is over those, computed from the times as shown."""
        script.reply = " one two three four"
        body = await (await app.test_client().post("/completion", json={"prompt": "x"})).get_json()
        timings = body["timings"]
        assert timings["predicted_n"] == 4
        assert timings["predicted_per_second"] == pytest.approx(1e3 / timings["predicted_ms"] * 3, abs=1e-6)
        assert timings["predicted_per_token_ms"] == pytest.approx(timings["predicted_ms"] / 3, abs=1e-9)
        assert timings["prompt_per_second"] == pytest.approx(
            timings["prompt_n"] * 1e3 / timings["prompt_ms"], abs=1e-6
        )

    async def test_progress_chunks_carry_timings(self, app, script: FakeScript) -> None:
        """With return_progress and timings_per_token, the first progress (before any prompt token is
        decoded) reports nothing evaluated, and the prompt's time never goes back."""
        script.reply = " one"
        response = await app.test_client().post(
            "/completion",
            json={"prompt": "x " * 20, "stream": True, "return_progress": True, "timings_per_token": True},
        )
        progress = [c for c in events(await response.get_data()) if "prompt_progress" in c]
        assert len(progress) >= 2
        first = progress[0]
        assert first["prompt_progress"]["processed"] == 0
        assert (first["timings"]["prompt_n"], first["timings"]["prompt_ms"]) == (0, 0.0)
        assert (first["timings"]["predicted_n"], first["timings"]["predicted_ms"]) == (0, 0.0)
        last = progress[-1]
        assert last["timings"]["prompt_n"] == last["prompt_progress"]["processed"] > 0
        assert [c["timings"]["prompt_ms"] for c in progress] == sorted(
            c["timings"]["prompt_ms"] for c in progress
        )


class TestModels:
    async def test_aliases_and_tags(self, settings, make_runtime) -> None:
        """Each /v1/models entry lists the model's names (its --alias list, as llama-server) and --tags."""
        runtime = attrs.evolve(make_runtime(), aliases=("alt",), tags=("local", "small"))
        app = create_app(settings, load=lambda _s, _p: runtime, on_load_failure=lambda: None)
        async with app.test_app() as test_app:
            await wait_until_ready(app)
            body = await (await test_app.test_client().get("/v1/models")).get_json()
        assert [m["id"] for m in body["data"]] == ["smollm2-135m-instruct-q4-1", "alt", "bubo"]
        assert {tuple(m["aliases"]) for m in body["data"]} == {("smollm2-135m-instruct-q4-1", "alt")}
        assert {tuple(m["tags"]) for m in body["data"]} == {("local", "small")}


class TestCors:
    @pytest.mark.parametrize("bare_app", [{"cors_origins": ("localhost",)}], indirect=True)
    @pytest.mark.parametrize(
        ("origin", "allowed"),
        [
            ("http://localhost:5173", True),
            ("http://127.0.0.1:8080", True),
            ("https://127.3.2.1", True),
            ("http://[::1]:3000", True),
            ("http://localhost.evil.example", False),
            ("http://192.168.1.2:5173", False),
            ("https://example.com", False),
        ],
    )
    async def test_localhost_means_any_loopback_origin(self, bare_app, origin, allowed) -> None:
        """--cors-origins localhost answers pages from this machine, on any port, and no other."""
        response = await bare_app.test_client().options(
            "/v1/models", headers={"Origin": origin, "Access-Control-Request-Method": "GET"}
        )
        assert (response.headers.get("Access-Control-Allow-Origin") == origin) is allowed
