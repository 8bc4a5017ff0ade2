"""llama-server endpoints over the fake engine: /completion, /tokenize, /detokenize, /props, /slots, /metrics."""

from __future__ import annotations

import json

import pytest
from dirty_equals import IsInt, IsNumber, IsStr

from bubo.domain.sampling import BANNED
from bubo.engine.fake import FakeEngine, FakeScript


class TestCompletion:
    async def test_response_fields(self, app, script: FakeScript) -> None:
        """/completion needs no model and answers llama-server's fields plus usage."""
        script.reply = " one two"
        response = await app.test_client().post("/completion", json={"prompt": "Count:", "n_predict": 16})
        assert response.status_code == 200
        body = await response.get_json()
        assert body == {
            "index": 0,
            "content": " one two",
            "tokens": [],
            "id_slot": 0,
            "stop": True,
            "model": "smollm2-135m-instruct-q4-1",
            "tokens_predicted": 2,
            "tokens_evaluated": IsInt,
            "generation_settings": {
                "n_ctx": 2048, "n_predict": 16, "model": "smollm2-135m-instruct-q4-1", "temperature": 0.8,
                "dynatemp_range": 0.0, "dynatemp_exponent": 1.0,
                "top_k": 40, "top_p": 0.95, "min_p": 0.05, "top_n_sigma": -1.0,
                "xtc_probability": 0.0, "xtc_threshold": 0.1, "typical_p": 1.0,
                "repeat_penalty": 1.0, "repeat_last_n": 64,
                "presence_penalty": 0.0, "frequency_penalty": 0.0,
                "dry_multiplier": 0.0, "dry_base": 1.75, "dry_allowed_length": 2, "dry_penalty_last_n": -1,
                "dry_sequence_breakers": ["\n", ":", '"', "*"],
                "mirostat": 0, "mirostat_tau": 5.0, "mirostat_eta": 0.1, "seed": 4294967295,
                "samplers": ["penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc",
                             "temperature"],
                "stop": [], "n_probs": 0, "ignore_eos": False, "stream": False,
                "n_keep": 0, "n_indent": 0, "cache_prompt": True,
                "speculative.n_max": 16, "speculative.n_min": 0, "speculative.p_min": 0.75, "logit_bias": [],
            },
            "prompt": "Count:",
            "has_new_line": False,
            "truncated": False,
            "stop_type": "eos",
            "stopping_word": "",
            "tokens_cached": IsInt,
            "timings": {
                "cache_n": 0, "shared_tokens": 0, "prompt_n": IsInt, "prompt_ms": IsNumber, "prompt_per_token_ms": IsNumber,
                "prompt_per_second": IsNumber, "predicted_n": 2, "predicted_ms": IsNumber,
                "predicted_per_token_ms": IsNumber, "predicted_per_second": IsNumber,
            },
            "usage": {
                "prompt_tokens": IsInt, "completion_tokens": 2, "total_tokens": IsInt,
                "prompt_tokens_details": {"cached_tokens": 0, "shared_tokens": 0},
                "completion_tokens_details": {
                    "reasoning_tokens": 0, "accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0,
                },
                "prompt_tokens_per_second": IsNumber, "completion_tokens_per_second": IsNumber,
                "draft_tokens": 0, "draft_tokens_accepted": 0,
                "gufo": {"cache_hit": False, "cache_miss_reason": "cold", "cached_tokens": 0,
                         "cache_snapshots_skipped": 0, "cache_restored_bytes": 0},
            },
        }  # fmt: skip

    @pytest.mark.parametrize(
        ("fields", "stop_type", "word"),
        [({"n_predict": 1}, "limit", ""), ({"stop": [" two"]}, "word", " two"), ({}, "eos", "")],
    )
    async def test_stop_type(self, app, script: FakeScript, fields, stop_type, word) -> None:
        """stop_type says why generation ended: eos, limit or word."""
        script.reply = " one two three"
        body = await (await app.test_client().post("/completion", json={"prompt": "x", **fields})).get_json()
        assert (body["stop_type"], body["stopping_word"]) == (stop_type, word)

    async def test_max_tokens_alias_and_logit_bias_forms(
        self, app, fake_engine: FakeEngine, tokenizer
    ) -> None:
        """max_tokens aliases n_predict; logit_bias takes pairs with ids, texts and false."""
        await app.test_client().post(
            "/completion",
            json={"prompt": "x", "max_tokens": 3, "logit_bias": [[15, -1.5], [16, False], ["Hello", 2]]},
        )
        request = fake_engine.requests[-1]
        assert request.max_new_tokens == 3
        bias = dict(request.sampling.logit_bias)
        assert bias[15] == -1.5
        assert bias[16] == BANNED
        assert all(bias[t] == 2 for t in tokenizer.encode("Hello"))

    async def test_speculative_limits_are_taken_clamped_and_shown(self, app, fake_engine: FakeEngine) -> None:
        """llama-server's flat ``speculative.*`` keys: n_max at most --draft-max, n_min at most n_max."""
        fields = {"speculative.n_max": 40, "speculative.n_min": 50, "speculative.p_min": 0.5}
        response = await app.test_client().post(
            "/completion", json={"prompt": "Hi", "n_predict": 2, **fields}
        )
        assert response.status_code == 200
        settings = (await response.get_json())["generation_settings"]
        assert (
            settings["speculative.n_max"],
            settings["speculative.n_min"],
            settings["speculative.p_min"],
        ) == (
            16,
            16,
            0.5,
        )
        limits = fake_engine.requests[-1].speculative
        assert (limits.n_max, limits.n_min, limits.p_min) == (16, 16, 0.5)

    @pytest.mark.parametrize(
        ("field", "value"),
        [("speculative.p_min", 1.5), ("speculative.p_min", -0.1), ("speculative.n_max", "8")],
    )
    async def test_a_bad_speculative_limit_is_a_400_naming_it(self, app, field: str, value: object) -> None:
        response = await app.test_client().post("/completion", json={"prompt": "Hi", field: value})
        assert response.status_code == 400
        assert (await response.get_json())["error"]["param"] == field

    async def test_the_chat_routes_take_the_speculative_limits_too(
        self, app, fake_engine: FakeEngine
    ) -> None:
        body = {"model": "bubo", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
        body["speculative.n_max"] = 3
        response = await app.test_client().post("/v1/chat/completions", json=body)
        assert response.status_code == 200
        assert fake_engine.requests[-1].speculative.n_max == 3

    async def test_n_predict_zero_generates_nothing(self, app, script: FakeScript) -> None:
        """n_predict 0 evaluates the prompt and generates nothing."""
        script.reply = "anything"
        body = await (
            await app.test_client().post("/completion", json={"prompt": "x", "n_predict": 0})
        ).get_json()
        assert (body["content"], body["tokens_predicted"], body["stop_type"]) == ("", 0, "limit")

    async def test_streaming(self, app, script: FakeScript) -> None:
        """Streamed chunks carry content; the last is the full result with stop: true; no [DONE]."""
        script.reply = " one two"
        response = await app.test_client().post("/completion", json={"prompt": "x", "stream": True})
        events = [e.removeprefix("data: ") for e in (await response.get_data()).decode().split("\n\n") if e]
        chunks = [json.loads(e) for e in events]
        assert "[DONE]" not in events
        assert [c["content"] for c in chunks[:-1]] == [" one", " two"]
        assert [c["stop"] for c in chunks] == [False, False, True]
        assert chunks[-1]["stop_type"] == "eos"
        assert chunks[-1]["timings"]["predicted_n"] == 2

    async def test_return_progress(self, app) -> None:
        """return_progress streams prompt_progress before the tokens."""
        response = await app.test_client().post(
            "/completion", json={"prompt": "x y z", "stream": True, "return_progress": True}
        )
        first = json.loads((await response.get_data()).decode().split("\n\n")[0].removeprefix("data: "))
        assert first["prompt_progress"] == {
            "total": IsInt,
            "cache": 0,
            "processed": IsInt,
            "time_ms": IsNumber,
        }

    @pytest.mark.parametrize(
        ("body", "param"),
        [
            ({}, "prompt"),
            ({"prompt": "x", "n_predict": -5}, "n_predict"),
            ({"prompt": "x", "n_probs": 1000}, "n_probs"),
            ({"prompt": "x", "logit_bias": [[1]]}, "logit_bias[0]"),
            ({"prompt": "x", "logit_bias": [[1, "high"]]}, "logit_bias[0][1]"),
            ({"prompt": "x", "id_slot": 3}, "id_slot"),
            ({"prompt": 12}, "prompt"),
        ],
    )
    async def test_errors(self, app, body, param) -> None:
        """Bad /completion requests are 400s naming the field."""
        response = await app.test_client().post("/completion", json=body)
        assert response.status_code == 400
        assert (await response.get_json())["error"]["param"] == param


class TestTokenize:
    async def test_round_trip(self, app, tokenizer) -> None:
        """/tokenize gives the tokenizer's ids; /detokenize gives the text back."""
        client = app.test_client()
        text = "Hello, world! <|im_start|>"
        tokens = (await (await client.post("/tokenize", json={"content": text})).get_json())["tokens"]
        assert tokens == tokenizer.encode(text)
        assert tokens[-1] == 1  # <|im_start|> parsed as the special token
        content = (await (await client.post("/detokenize", json={"tokens": tokens})).get_json())["content"]
        assert content == text

    async def test_parse_special_false(self, app) -> None:
        """parse_special: false tokenizes special-token markup as plain text."""
        body = await (
            await app.test_client().post(
                "/tokenize", json={"content": "<|im_start|>", "parse_special": False}
            )
        ).get_json()
        assert 1 not in body["tokens"]
        assert len(body["tokens"]) > 1

    async def test_with_pieces(self, app) -> None:
        """with_pieces returns id/piece objects; invalid UTF-8 pieces come as byte lists."""
        body = await (
            await app.test_client().post("/tokenize", json={"content": "hi é🚀", "with_pieces": True})
        ).get_json()
        pieces = body["tokens"]
        assert pieces[0] == {"id": IsInt, "piece": "hi"}
        rebuilt = b"".join(
            p["piece"].encode() if isinstance(p["piece"], str) else bytes(p["piece"]) for p in pieces
        )
        assert rebuilt.decode() == "hi é🚀"

    @pytest.mark.parametrize(
        ("path", "field"),
        [("/tokenize", "content"), ("/completion", "prompt"), ("/v1/completions", "prompt")],
    )
    async def test_an_id_outside_the_vocabulary_is_named_by_its_index(
        self, app, path: str, field: str
    ) -> None:
        """Every raw prompt names the bad id's JSON path, even in a one-item array."""
        response = await app.test_client().post(path, json={field: [10**9], "model": "bubo"})
        assert response.status_code == 400
        error = (await response.get_json())["error"]
        assert error["param"] == f"{field}[0]"
        assert "0..49151" in error["message"]

    async def test_detokenize_out_of_range(self, app) -> None:
        """An id outside the vocabulary is a 400 naming its index."""
        response = await app.test_client().post("/detokenize", json={"tokens": [1, 10**9]})
        assert response.status_code == 400
        assert (await response.get_json())["error"]["param"] == "tokens[1]"


class TestIntrospection:
    async def test_props(self, app) -> None:
        """/props names the model, the template and the default settings."""
        body = await (await app.test_client().get("/props")).get_json()
        assert body["model"] == "smollm2-135m-instruct-q4-1"
        assert body["model_alias"] == "bubo"
        assert "<|im_start|>" in body["template"]
        assert body["chat_template"] == body["template"]
        assert body["model_info"]["n_vocab"] == 49152
        assert body["model_info"]["repack"] is False  # whether llama.cpp repacks the weights, and why
        assert body["model_info"]["repack_reason"] == "a fake engine has no weights"
        assert body["default_generation_settings"]["params"]["temperature"] == 0.8
        assert body["default_generation_settings"]["n_ctx"] == 2048
        assert body["total_slots"] == 1

    async def test_props_model_query(self, app) -> None:
        """?model= must name a served model."""
        client = app.test_client()
        assert (await client.get("/props?model=bubo")).status_code == 200
        response = await client.get("/props?model=other")
        assert response.status_code == 404
        assert (await response.get_json())["error"]["code"] == "model_not_found"

    @pytest.mark.parametrize("path", ["/slots", "/v1/slots"])
    async def test_slots(self, app, path) -> None:
        """/slots describes the one session slot; before its first task, without its task's fields (llama-server's)."""
        body = await (await app.test_client().get(path)).get_json()
        assert body == [
            {
                "id": 0, "n_ctx": 2048, "speculative": False, "is_processing": False,
                "is_sleeping": False, "state": "idle", "n_prompt_tokens": 0, "n_prompt_tokens_processed": 0,
                "n_prompt_tokens_cache": 0, "shared_tokens": 0,
            }
        ]  # fmt: skip

    async def test_slot_shows_its_last_task(self, app, script: FakeScript) -> None:
        """After a task, the slot shows it: id_task, params.lora and next_token beside the prompt counts."""
        script.reply = "one two"
        client = app.test_client()
        await client.post("/completion", json={"prompt": "x"})
        [entry] = await (await client.get("/slots")).get_json()
        assert entry["id_task"] >= 0
        assert entry["n_prompt_tokens_processed"] + entry["n_prompt_tokens_cache"] >= 1
        assert entry["params"] == {"lora": []}
        assert entry["next_token"] == [{"has_next_token": False, "n_decoded": 0, "n_remain": -1}]
        assert {"n_prompt_tokens", "shared_tokens"} <= entry.keys()

    @pytest.mark.parametrize("path", ["/metrics", "/v1/metrics"])
    async def test_metrics(self, app, script: FakeScript, path) -> None:
        """/metrics is Prometheus text with every llamacpp: name the reference lists."""
        script.reply = "one"
        client = app.test_client()
        await client.post("/completion", json={"prompt": "x"})
        response = await client.get(path)
        assert response.status_code == 200
        assert response.headers["Content-Type"].startswith("text/plain")
        text = (await response.get_data()).decode()
        for name in (
            "llamacpp:prompt_tokens_total",
            "llamacpp:tokens_predicted_total",
            "llamacpp:prompt_tokens_seconds",
            "llamacpp:predicted_tokens_seconds",
            "llamacpp:spec_decode_num_draft_tokens_total",
            "llamacpp:spec_decode_num_accepted_tokens_total",
            "llamacpp:requests_processing",
            "llamacpp:requests_deferred",
            "llamacpp:kv_cache_usage_ratio",
            "llamacpp:prompt_tokens_cached_total",
        ):
            assert f"\n{name} " in text or text.startswith(f"{name} ") or f"# TYPE {name} " in text
        assert "llamacpp:tokens_predicted_total 1.0" in text

    async def test_llama_server_types(self, app, script: FakeScript) -> None:
        """Each llamacpp: family has llama-server's type, and its one sample llama-server's name."""
        script.reply = "one two"
        client = app.test_client()
        await client.post("/completion", json={"prompt": "x"})
        text = (await (await client.get("/metrics")).get_data()).decode()
        types = dict(
            line.removeprefix("# TYPE ").split(" ")
            for line in text.splitlines()
            if line.startswith("# TYPE llamacpp:")
        )
        counters = {
            "prompt_tokens_total", "prompt_tokens_cached_total", "prompt_seconds_total", "tokens_predicted_total",
            "tokens_predicted_seconds_total", "n_decode_total", "n_tokens_max",
            "spec_decode_num_draft_tokens_total", "spec_decode_num_accepted_tokens_total",
            "spec_decode_num_drafts_total",
        }  # fmt: skip
        gauges = {
            "prompt_tokens_seconds", "predicted_tokens_seconds", "requests_processing", "requests_deferred",
            "n_busy_slots_per_decode", "kv_cache_usage_ratio", "kv_cache_tokens", "prompt_cache_hit_ratio",
        }  # fmt: skip
        assert types == {f"llamacpp:{name}": "counter" for name in counters} | {
            f"llamacpp:{name}": "gauge" for name in gauges
        }
        samples = [line.split(" ")[0] for line in text.splitlines() if line.startswith("llamacpp:")]
        assert sorted(samples) == sorted(types)
        [longest] = [line for line in text.splitlines() if line.startswith("llamacpp:n_tokens_max ")]
        assert float(longest.split(" ")[1]) >= 1  # the request is counted (0 before it)


class TestOps:
    @pytest.mark.parametrize("path", ["/health", "/v1/health", "/healthz"])
    async def test_health(self, app, path) -> None:
        """Liveness answers ok."""
        response = await app.test_client().get(path)
        assert (response.status_code, await response.get_json()) == (200, {"status": "ok"})

    @pytest.mark.parametrize("path", ["/ready", "/v1/ready", "/readyz"])
    async def test_ready(self, app, path) -> None:
        """Readiness names the model."""
        response = await app.test_client().get(path)
        assert await response.get_json() == {"status": "ready", "model": "smollm2-135m-instruct-q4-1"}

    @pytest.mark.parametrize("path", ["/v1/models", "/models"])
    async def test_models(self, app, path) -> None:
        """The served id and the alias bubo, each listing the model's names, and context sizes."""
        body = await (await app.test_client().get(path)).get_json()
        assert body["object"] == "list"
        assert [m["id"] for m in body["data"]] == ["smollm2-135m-instruct-q4-1", "bubo"]
        assert body["data"][0] == {
            "id": "smollm2-135m-instruct-q4-1", "aliases": ["smollm2-135m-instruct-q4-1"], "tags": [],
            "object": "model", "created": 1_800_000_000, "owned_by": "bubo",
            "context_length": 2048, "max_model_len": 2048,
            "meta": {"n_ctx": 2048, "n_ctx_train": 2048, "n_vocab": 49152, "n_embd": 64, "n_params": 1_000_000,
                     "size": 1_000_000, "vocab_type": 2},
            "architecture": {"input_modalities": ["text"]},
        }  # fmt: skip
        # llama-server's list beside OpenAI's, which its web UI and suite read for capabilities
        assert body["models"] == [
            {"name": name, "model": name, "type": "model", "capabilities": ["completion"],
             "details": {"format": "gguf"}}
            for name in ("smollm2-135m-instruct-q4-1", "bubo")
        ]  # fmt: skip

    async def test_apply_template(self, app) -> None:
        """/apply-template renders the chat body without a model and ignores stream."""
        response = await app.test_client().post(
            "/apply-template", json={"messages": [{"role": "user", "content": "Hi"}], "stream": True}
        )
        assert await response.get_json() == {
            "prompt": IsStr(
                regex=r"(?s)<\|im_start\|>system\n.*<\|im_start\|>user\nHi<\|im_end\|>\n<\|im_start\|>assistant\n"
            )
        }
