"""What a load-balancing gateway reads of a worker (smg, SGLang's router), over the fake engine.

``/server_info`` and ``/model_info`` register the worker (its model, names and limits), ``/v1/loads``
is polled for its load, and ``/metrics`` carries the Gateway API Inference Extension's gauges.
The real gateway in front of a real ``bubo serve``: tests/e2e/test_gateway_worker.py.
"""

from __future__ import annotations

import datetime as dt

import attrs
import pytest
import trio
from dirty_equals import IsStr
from tests.conftest import wait_until_ready

from bubo.config import load_settings
from bubo.domain.sampling import GenerationDefaults
from bubo.engine import EngineStatistics
from bubo.engine.fake import FakeEngine, FakeScript
from bubo.engine.lora import LoraAdapter
from bubo.server import create_app, package_version
from bubo.service.runtime import Runtime

from .test_cancellation import wait_for

MODEL = "smollm2-135m-instruct-q4-1"
CHAT = "/v1/chat/completions"


def chat(words: int) -> dict[str, object]:
    """A chat request whose prompt grows with *words*."""
    return {"model": "bubo", "messages": [{"role": "user", "content": "word " * words}], "max_tokens": 8}


@pytest.fixture(name="fake_engine")
def _fake_engine(script: FakeScript) -> FakeEngine:
    return FakeEngine(script=script, n_slots=2)


@pytest.fixture(name="make_runtime")
def _make_runtime(fake_engine: FakeEngine, tokenizer, template):
    def make() -> Runtime:
        return Runtime(
            model_id=MODEL,
            created=1_800_000_000,
            engine=fake_engine,
            tokenizer=tokenizer,
            template=template,
            defaults=GenerationDefaults(),
            aliases=("small",),
            max_queue=16,
        )

    return make


async def ask(client, words: int) -> None:
    assert (await client.post(CHAT, json=chat(words))).status_code == 200


async def loads(client) -> dict:
    response = await client.get("/v1/loads")
    assert response.status_code == 200
    [load] = (await response.get_json())["loads"]
    return load


class TestRegistration:
    @pytest.mark.parametrize("path", ["/server_info", "/get_server_info"])
    async def test_server_info_names_the_model_and_the_limits(self, app, path) -> None:
        """The served id is what the gateway registers; the other names, the slots and the queue go with it."""
        response = await app.test_client().get(path)
        assert response.status_code == 200
        assert await response.get_json() == {
            "model_id": MODEL,
            "served_model_name": MODEL,
            "served_model_names": [MODEL, "small", "bubo"],
            "model_path": "/fake/model.gguf",
            "context_length": 2048,
            "max_total_tokens": 2048,
            "max_running_requests": 2,
            "max_queued_requests": 16,
            "is_embedding": False,
            "tp_size": 1,
            "dp_size": 1,
            "version": package_version(),
        }

    async def test_an_unbounded_queue_is_left_out(self, settings, make_runtime) -> None:
        """Without a bound on the queue there is none to report: the field is absent, not null."""
        runtime = attrs.evolve(make_runtime(), max_queue=None)
        app = create_app(settings, load=lambda _s, _p: runtime, on_load_failure=lambda: None)
        async with app.test_app() as test_app:
            await wait_until_ready(app)
            body = await (await test_app.test_client().get("/server_info")).get_json()
        assert "max_queued_requests" not in body
        assert body["max_running_requests"] == 2

    @pytest.mark.parametrize("path", ["/model_info", "/get_model_info"])
    async def test_model_info_says_what_kind_of_model(self, app, path) -> None:
        """A text model that generates, read from a GGUF of its architecture, without images or audio."""
        response = await app.test_client().get(path)
        assert await response.get_json() == {
            "model_path": "/fake/model.gguf",
            "model_type": "fake",
            "is_generation": True,
            "has_image_understanding": False,
            "has_audio_understanding": False,
        }

    async def test_while_the_model_loads_the_gateway_gets_503(self, make_runtime) -> None:
        """Before the model is loaded there is nothing to register or weigh: 503 not_ready, which smg retries."""
        release, loading = trio.Event(), trio.Event()

        def slow_load(_settings, _progress):
            trio.from_thread.run_sync(loading.set)
            trio.from_thread.run(release.wait)
            return make_runtime()

        app = create_app(load_settings({}, environ={}), load=slow_load, on_load_failure=lambda: None)
        async with app.test_app() as test_app:
            client = test_app.test_client()
            await loading.wait()
            for path in ("/server_info", "/model_info", "/v1/loads"):
                response = await client.get(path)
                assert response.status_code == 503
                assert (await response.get_json())["error"]["code"] == "not_ready"
            release.set()
            await wait_until_ready(app)
            assert (await client.get("/v1/loads")).status_code == 200

    async def test_the_api_key_guards_them_as_every_route(self, make_runtime) -> None:
        """With --api-key a gateway sends the key (smg: the worker's api_key) or gets 401."""
        settings = load_settings({"server__api_key": "s3cret"}, environ={})
        app = create_app(settings, load=lambda _s, _p: make_runtime(), on_load_failure=lambda: None)
        async with app.test_app() as test_app:
            await wait_until_ready(app)
            client = test_app.test_client()
            assert (await client.get("/v1/loads")).status_code == 401
            keyed = await client.get("/v1/loads", headers={"Authorization": "Bearer s3cret"})
            assert keyed.status_code == 200


class TestLoads:
    async def test_an_idle_worker(self, app) -> None:
        """Nothing runs or waits; the capacity is the KV cache's and the slots'; one rank, stamped in UTC."""
        response = await app.test_client().get("/v1/loads?include=core,disagg,queues,memory")
        body = await response.get_json()
        assert body == {
            "timestamp": IsStr,
            "version": package_version(),
            "dp_rank_count": 1,
            "loads": [
                {
                    "dp_rank": 0,
                    "num_running_reqs": 0,
                    "num_waiting_reqs": 0,
                    "num_total_reqs": 0,
                    "num_waiting_uncached_tokens": 0,
                    "num_used_tokens": 0,
                    "num_total_tokens": 0,
                    "max_total_num_tokens": 2048,
                    "max_running_requests": 2,
                    "token_usage": 0.0,
                    "gen_throughput": 0.0,
                    "cache_hit_rate": 0.0,
                }
            ],
        }
        stamped = dt.datetime.fromisoformat(body["timestamp"])
        assert stamped.utcoffset() == dt.timedelta(0)

    async def test_running_and_waiting_requests_and_their_tokens(
        self, app, script: FakeScript, fake_engine: FakeEngine
    ) -> None:
        """Two requests hold the slots, a third waits with its whole prompt; then all is back to idle."""
        script.piece_delay = 0.05
        script.reply = "word " * 20
        client = app.test_client()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(ask, client, 10)
            nursery.start_soon(ask, client, 20)
            await wait_for(fake_engine, lambda s: s.requests_processing == 2)
            nursery.start_soon(ask, client, 30)
            await wait_for(fake_engine, lambda s: s.requests_deferred == 1)
            statistics = fake_engine.statistics()
            load = await loads(client)
            assert statistics.prompt_tokens_waiting > 30  # the third prompt, whole
            assert (load["num_running_reqs"], load["num_waiting_reqs"], load["num_total_reqs"]) == (2, 1, 3)
            running_cells = sum(s.n_prompt_tokens for s in statistics.slots if s.is_processing)
            assert load["num_used_tokens"] == running_cells > 0
            assert load["num_waiting_uncached_tokens"] == statistics.prompt_tokens_waiting
            assert load["num_total_tokens"] == running_cells + statistics.prompt_tokens_waiting
            assert load["token_usage"] == running_cells / 2048
        await fake_engine.wait_idle()
        load = await loads(client)
        assert (load["num_running_reqs"], load["num_waiting_reqs"], load["num_used_tokens"]) == (0, 0, 0)
        assert load["num_waiting_uncached_tokens"] == 0
        assert load["gen_throughput"] > 0  # 3 x 20 pieces were generated

    async def test_idle_slots_cached_prefixes_are_not_load(self, app, fake_engine: FakeEngine) -> None:
        """A finished conversation's cache stays (llamacpp:kv_cache_tokens) but pins nothing: usage is 0."""
        client = app.test_client()
        assert (await client.post(CHAT, json=chat(40))).status_code == 200
        statistics = fake_engine.statistics()
        assert statistics.kv_cache_tokens > 40
        load = await loads(client)
        assert (load["num_used_tokens"], load["token_usage"]) == (0, 0.0)
        assert load["cache_hit_rate"] == statistics.prompt_cache_hit_ratio == 0.0
        assert (await client.post(CHAT, json=chat(40))).status_code == 200  # the same prompt again
        assert (await loads(client))["cache_hit_rate"] > 0


def samples(text: str, name: str) -> list[str]:
    """The sample lines of family *name* (its name, labels and value)."""
    return [line for line in text.splitlines() if line.startswith((f"{name} ", f"{name}{{"))]


class TestInferenceExtensionGauges:
    async def test_the_three_gauges_and_the_cache_layout(
        self, app, script: FakeScript, fake_engine: FakeEngine
    ) -> None:
        """Queued and running requests and the running requests' KV usage, as gauges; blocks of one token."""
        script.piece_delay = 0.2  # the two running requests are far from their ends while the gauges are read
        script.reply = "word " * 20
        client = app.test_client()
        text = (await (await client.get("/metrics")).get_data()).decode()
        for name in ("bubo:num_requests_waiting", "bubo:num_requests_running", "bubo:kv_cache_usage_perc"):
            assert f"# TYPE {name} gauge" in text
            assert samples(text, name) == [f"{name} 0.0"]
        assert samples(text, "bubo:cache_config_info") == [
            'bubo:cache_config_info{block_size="1",num_gpu_blocks="2048"} 1.0'
        ]
        assert "bubo:lora_requests_info" not in text  # no adapters loaded
        async with trio.open_nursery() as nursery:
            for _ in range(3):
                nursery.start_soon(ask, client, 10)
            await wait_for(fake_engine, lambda s: s.requests_deferred == 1 and s.kv_cache_tokens_running > 0)
            before: EngineStatistics = fake_engine.statistics()
            text = (await (await client.get("/metrics")).get_data()).decode()
            after: EngineStatistics = fake_engine.statistics()  # the running requests' cells only grow here
            assert samples(text, "bubo:num_requests_waiting") == ["bubo:num_requests_waiting 1.0"]
            assert samples(text, "bubo:num_requests_running") == ["bubo:num_requests_running 2.0"]
            [usage] = samples(text, "bubo:kv_cache_usage_perc")
            ratio = float(usage.split(" ")[1])
            assert 0 < before.kv_cache_running_ratio <= ratio <= after.kv_cache_running_ratio

    async def test_lora_adapters_while_loaded(self, settings, make_runtime, script: FakeScript) -> None:
        """Every adapter is loaded at start and serves any request: all running, none waiting, since loading."""
        adapters = [
            LoraAdapter(id=0, path="/models/tone.gguf", scale=1.0),
            LoraAdapter(id=1, path="/models/style.gguf", scale=0.0),
        ]
        runtime = attrs.evolve(make_runtime(), engine=FakeEngine(script=script, lora=adapters))
        app = create_app(settings, load=lambda _s, _p: runtime, on_load_failure=lambda: None)
        async with app.test_app() as test_app:
            await wait_until_ready(app)
            text = (await (await test_app.test_client().get("/metrics")).get_data()).decode()
        assert "# TYPE bubo:lora_requests_info gauge" in text
        labels = 'max_lora="2",running_lora_adapters="tone,style",waiting_lora_adapters=""'
        assert samples(text, "bubo:lora_requests_info") == [f"bubo:lora_requests_info{{{labels}}} 1.8e+09"]
