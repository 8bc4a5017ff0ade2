"""Ollama's ``keep_alive``: Go durations read in linear time, and the operator's ``--ollama-keep-alive``.

The fake engine "frees its model" by forgetting its slots' prompts (as in
tests/api/test_sleep.py); the flag through a real ``bubo serve`` is in
tests/e2e/test_hostile_input.py.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from quart_trio import QuartTrio

from bubo.api.ollama.duration import MAX_DURATION_CHARS, _nanoseconds, duration_seconds
from bubo.api.ollama.options import FOREVER_S, keep_alive_seconds
from bubo.domain.modes import KeepAlivePolicy
from bubo.engine.fake import FakeEngine
from bubo.errors import InvalidRequest
from bubo.service.idle import IdleSleeper

from .._linear import assert_linear
from ..conftest import RuntimeFactory, serving_app

MODEL = "smollm2-135m-instruct-q4-1"
FROZE_MAIN = "11s" * 28 + " x"  # issue 36: the duration regex backtracked on this for minutes
UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


class TestGoDurations:
    @pytest.mark.parametrize(
        ("text", "seconds"),
        [("0", 0.0), ("+0", 0.0), ("-0", 0.0), ("5m", 300.0), ("1h30m", 5400.0), ("250ms", 0.25),
         ("1.5h", 5400.0), (".5s", 0.5), ("1.s", 1.0), ("+.5h", 1800.0), ("3m.5s", 180.5), ("1µs", 1e-6),
         ("1μs", 1e-6), ("1us", 1e-6), ("10ns", 1e-8), ("-5m", -300.0), ("007s", 7.0),
         ("2562047h47m16.854775807s", (2**63 - 1) / 1e9), ("-2562047h47m16.854775808s", -(2**63) / 1e9)],
    )  # fmt: skip
    def test_what_go_reads(self, text: str, seconds: float) -> None:
        """Go's time.ParseDuration grammar: a sign, numbers with units in sequence, "0" alone."""
        assert duration_seconds(text) == pytest.approx(seconds, rel=1e-12, abs=1e-15)

    @pytest.mark.parametrize(
        "text",
        ["", "+", "-", "1", "-1", "s", ".s", "1e3s", "1s x", "1 s", " 1s", "1s ", "1sm", "1d", "1S", "1.2.3s",
         "1s.", "2562047h47m16.854775808s", "99999999999h", FROZE_MAIN, "11s" * 30 + " x",
         "1s" * (MAX_DURATION_CHARS // 2 + 1)],
    )  # fmt: skip
    def test_what_go_refuses(self, text: str) -> None:
        """Missing or unknown units, stray characters, beyond Go's largest Duration, longer than the bound."""
        assert duration_seconds(text) is None

    @given(st.lists(st.tuples(st.integers(0, 999), st.integers(0, 999), st.sampled_from(sorted(UNITS))),
                    min_size=1, max_size=4))  # fmt: skip
    def test_a_duration_is_the_sum_of_its_parts(self, parts: list[tuple[int, int, str]]) -> None:
        """Each number+unit adds its own length of time, whatever comes before or after it.

        As in Go, each part is counted in whole nanoseconds (its fraction of one is dropped).
        """
        texts = [f"{whole}.{fraction:03d}{unit}" for whole, fraction, unit in parts]
        expected = sum((whole + fraction / 1000) * UNITS[unit] for whole, fraction, unit in parts)
        dropped = len(parts) * 1e-9
        assert duration_seconds("".join(texts)) == pytest.approx(expected, rel=1e-9, abs=dropped)
        assert duration_seconds("-" + "".join(texts)) == pytest.approx(-expected, rel=1e-9, abs=dropped)

    @settings(max_examples=15)
    @given(st.lists(st.sampled_from(["1", "11", ".", "1.", "s", "ms", "µ", "h", "x", " ", "+", "-", "0"]),
                    min_size=1, max_size=6))  # fmt: skip
    def test_the_scan_is_linear_in_the_length(self, unit: list[str]) -> None:
        """Any text repeated to 4n characters costs at most about 4 times what n does (the regex: 2^n)."""
        piece = "".join(unit)
        assert_linear(lambda n: piece * (n // len(piece) + 1) + " x", _nanoseconds, 20_000)


class TestKeepAliveValues:
    @pytest.mark.parametrize(
        ("value", "seconds"),
        [(0, 0.0), (2.5, 2.5), ("0", 0.0), ("5m", 300.0), (-1, FOREVER_S), ("-1h", FOREVER_S), (None, None)],
    )  # fmt: skip
    def test_numbers_and_durations(self, value: object, seconds: float | None) -> None:
        assert keep_alive_seconds(value) == seconds

    @pytest.mark.parametrize(
        ("value", "shown"),
        [(FROZE_MAIN, "a text of 86 characters"), ("x" * 1_000_000, "a text of 1000000 characters"),
         ("soon", "'soon'"), (True, "a boolean"), ([1], "an array"), ({"m": 5}, "an object")],
    )  # fmt: skip
    def test_anything_else_is_a_400_naming_keep_alive(self, value: object, shown: str) -> None:
        """The 400 names the field and says what came, never echoing a long text back."""
        with pytest.raises(InvalidRequest) as caught:
            keep_alive_seconds(value)
        assert caught.value.param == "keep_alive"
        assert caught.value.message.endswith(f"got {shown}")
        assert len(caught.value.message) < 200

    @pytest.mark.parametrize("path", ["/api/chat", "/api/generate", "/api/embed", "/api/embeddings"])
    async def test_the_payload_that_froze_the_server_is_a_400(self, app: QuartTrio, path: str) -> None:
        response = await app.test_client().post(path, json={"model": MODEL, "keep_alive": FROZE_MAIN})
        assert response.status_code == 400
        assert "keep_alive" in (await response.get_json())["error"]


@pytest.fixture(name="policy_app")
async def _policy_app(
    settings, make_runtime: RuntimeFactory, request: pytest.FixtureRequest
) -> AsyncIterator[QuartTrio]:
    """The app over the fake engine with ``--sleep-idle-seconds`` and ``--ollama-keep-alive`` as the param."""
    idle_s, policy = request.param
    runtime = attrs.evolve(make_runtime(), sleeper=IdleSleeper(idle_s=idle_s, policy=policy))
    async with serving_app(settings, runtime) as test_app:
        yield test_app


class TestOperatorPolicy:
    @pytest.mark.parametrize(
        ("policy", "idle_s", "sent", "admitted"),
        [("obey", None, 0.0, 0.0), ("obey", 60.0, 5.0, 5.0), ("obey", 60.0, None, None),
         ("extend", 60.0, 0.0, 60.0), ("extend", 60.0, 5.0, 60.0), ("extend", 60.0, 600.0, 600.0),
         ("extend", 60.0, math.inf, math.inf), ("extend", None, 0.0, math.inf), ("extend", 60.0, None, None),
         ("ignore", 60.0, 0.0, None), ("ignore", None, 600.0, None), ("ignore", 60.0, math.inf, None)],
    )  # fmt: skip
    def test_what_each_policy_admits(
        self, policy: KeepAlivePolicy, idle_s: float | None, sent: float | None, admitted: float | None
    ) -> None:
        """obey: what the client sent; extend: never shorter than the server's own; ignore: the server's."""
        sleeper = IdleSleeper(idle_s=idle_s, policy=policy)
        assert sleeper.keep_alive(sent) == admitted
        assert sleeper.timeout_s == (
            idle_s if admitted is None else None if math.isinf(admitted) else admitted
        )

    @pytest.mark.parametrize("policy_app", [(None, "obey")], indirect=True)
    async def test_obey_is_ollamas_keep_alive_0_unloads(self, policy_app, fake_engine: FakeEngine) -> None:
        body = await (
            await policy_app.test_client().post("/api/chat", json={"model": MODEL, "keep_alive": 0})
        ).get_json()
        assert body["done_reason"] == "unload"
        assert fake_engine.sleeping

    @pytest.mark.parametrize(
        "policy_app", [(None, "ignore"), (30.0, "extend"), (None, "extend")], indirect=True
    )
    @pytest.mark.parametrize("path", ["/api/chat", "/api/generate"])
    async def test_no_client_can_unload_the_model(
        self, policy_app, fake_engine: FakeEngine, path: str
    ) -> None:
        """keep_alive 0 on an empty request loads the model, as any other empty request: nothing is freed."""
        client = policy_app.test_client()
        for keep_alive in (0, "0", "0s", "-0"):
            response = await client.post(path, json={"model": MODEL, "keep_alive": keep_alive})
            assert response.status_code == 200
            assert (await response.get_json())["done_reason"] == "load"
        assert not fake_engine.sleeping
        assert fake_engine.loads == 1  # never freed, so never loaded again
        assert (await (await client.get("/api/ps")).get_json())["models"]  # still loaded

    @pytest.mark.parametrize("policy_app", [(None, "ignore")], indirect=True)
    async def test_a_bad_keep_alive_is_still_a_400_whatever_the_policy(self, policy_app) -> None:
        response = await policy_app.test_client().post(
            "/api/chat", json={"model": MODEL, "keep_alive": FROZE_MAIN}
        )
        assert response.status_code == 400
