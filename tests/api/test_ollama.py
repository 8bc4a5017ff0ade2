"""Ollama's native API over the fake engine: shapes (tests/fixtures/ollama_shapes.json), semantics, errors."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from bubo.api.ollama.names import resolve
from bubo.api.ollama.options import FOREVER_S, generation_options, keep_alive_seconds
from bubo.config import load_settings
from bubo.engine import FimTokens
from bubo.engine.fake import FakeEmbedder, FakeEngine, FakeScript, fake_model_info
from bubo.errors import InvalidRequest
from bubo.server import create_app

from .._asgi import exchange
from ..conftest import wait_until_ready

SHAPES = json.loads((Path(__file__).parent.parent / "fixtures" / "ollama_shapes.json").read_text())
MODEL_ID = "smollm2-135m-instruct-q4-1"
HI = [{"role": "user", "content": "Say hi."}]
CALL_TEXT = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}  # fmt: skip
_RFC3339 = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z")


def matches(value: Any, shape: Any, path: str = "$") -> None:
    """Assert *value* has *shape* (see the fixture's _about)."""
    if isinstance(shape, str) and shape.startswith("<") and shape.endswith(">"):
        kind = shape[1:-1]
        checks = {
            "str": lambda v: isinstance(v, str),
            "int": lambda v: type(v) is int and v >= 0,
            "ns": lambda v: type(v) is int and v >= 0,
            "rfc3339": lambda v: isinstance(v, str) and _RFC3339.fullmatch(v),
            "hex64": lambda v: isinstance(v, str) and re.fullmatch(r"[0-9a-f]{64}", v),
            "tokens": lambda v: isinstance(v, list) and v and all(type(t) is int for t in v),
            "floats": lambda v: isinstance(v, list) and v and all(isinstance(x, float) for x in v),
            "any": lambda v: True,
        }
        assert checks[kind](value), f"{path}: {value!r} is not {shape}"
    elif isinstance(shape, dict):
        assert isinstance(value, dict), f"{path}: {value!r} is not an object"
        assert list(value) == list(shape), f"{path}: keys {list(value)} != {list(shape)}"
        for key, inner in shape.items():
            matches(value[key], inner, f"{path}.{key}")
    elif isinstance(shape, list):
        assert isinstance(value, list), f"{path}: {value!r} is not an array"
        assert len(value) == len(shape), f"{path}: {value!r}"
        for index, (item, inner) in enumerate(zip(value, shape, strict=True)):
            matches(item, inner, f"{path}[{index}]")
    else:
        assert type(value) is type(shape), f"{path}: {value!r} != {shape!r}"
        assert value == shape, f"{path}: {value!r} != {shape!r}"


def ndjson(body: bytes) -> list[dict[str, Any]]:
    """The lines of an NDJSON body: each a JSON object, each ending in a newline."""
    assert body.endswith(b"\n")
    return [json.loads(line) for line in body.decode().split("\n")[:-1]]


async def post(app, path: str, body: dict[str, Any], **kwargs: Any):
    return await app.test_client().post(path, json=body, **kwargs)


async def lines_of(app, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    response = await post(app, path, body)
    assert response.status_code == 200, await response.get_data()
    assert response.headers["Content-Type"] == "application/x-ndjson"
    return ndjson(await response.get_data())


class TestInformation:
    async def test_version(self, app) -> None:
        """A numeric x.y.z, at least the 0.6.4 clients require."""
        response = await app.test_client().get("/api/version")
        matches(await response.get_json(), SHAPES["version"])

    async def test_tags_and_ps_list_each_name_as_latest(self, app) -> None:
        """Every served name, as NAME:latest, name equal to model, one digest for the file."""
        client = app.test_client()
        tags = (await (await client.get("/api/tags")).get_json())["models"]
        ps = (await (await client.get("/api/ps")).get_json())["models"]
        assert [t["name"] for t in tags] == [p["name"] for p in ps] == [f"{MODEL_ID}:latest", "bubo:latest"]
        for entry in tags:
            matches(entry, SHAPES["tags_entry"])
            assert entry["name"] == entry["model"]
        for entry in ps:
            matches(entry, SHAPES["ps_entry"])
            assert entry["context_length"] == 2048
        assert len({t["digest"] for t in tags + ps}) == 1

    async def test_head_answers_without_a_body(self, app) -> None:
        for path in ("/api/tags", "/api/version", "/api/ps"):
            response = await app.test_client().head(path)  # (Hypercorn drops HEAD bodies: the e2e tests)
            assert response.status_code == 200
            assert response.headers["Content-Type"] == "application/json"

    async def test_show(self, app) -> None:
        """model_info has the served context; parameters use Ollama's 30-column layout."""
        body = await (await post(app, "/api/show", {"model": "bubo"})).get_json()
        matches(body, SHAPES["show"])
        assert body["model_info"]["llama.context_length"] == 2048  # served, not the trained 8192
        assert body["model_info"]["llama.embedding_length"] == 576
        assert body["model_info"]["general.architecture"] == "llama"
        assert "tokenizer.chat_template" not in body["model_info"]
        assert body["model_info"]["tokenizer.ggml.tokens"] == []  # long arrays empty, as Ollama shows them
        assert body["parameters"].splitlines()[0] == "num_ctx" + " " * 24 + "2048"
        assert "temperature                    0.8" in body["parameters"]
        assert body["modelfile"].startswith('# Modelfile generated by "ollama show"')
        assert "# FROM bubo:latest" in body["modelfile"]
        assert "<|im_start|>" in body["template"]

    async def test_show_takes_name_and_answers_copilot_with_its_name(self, app) -> None:
        """The older `name` field works; Copilot gets the requested name as general.basename."""
        plain = await (await post(app, "/api/show", {"name": "BUBO"})).get_json()
        assert plain["model_info"]["general.basename"] == "smollm2"
        copilot = await post(
            app, "/api/show", {"model": "bubo:latest"}, headers={"User-Agent": "GitHubCopilotChat/0.30"}
        )
        assert (await copilot.get_json())["model_info"]["general.basename"] == "bubo:latest"

    async def test_show_capabilities_follow_the_model(self, thinking_app) -> None:
        body = await (await post(thinking_app, "/api/show", {"model": "bubo"})).get_json()
        assert body["capabilities"] == ["completion", "tools", "thinking"]


class TestRoot:
    @pytest.mark.parametrize(("webui", "accept"), [("on", "*/*"), ("on", None), ("off", "text/html")])
    async def test_ollama_is_running(self, make_runtime, webui, accept) -> None:
        """What is not a browser (or any client when the page is off) reads Ollama's sentence."""
        app = create_app(
            load_settings({"server__webui": webui}, environ={}),
            load=lambda _s, _p: make_runtime(),
            on_load_failure=lambda: None,
        )
        async with app.test_app() as test_app:
            await wait_until_ready(app)
            headers = {"Accept": accept} if accept else {}
            for method in ("GET", "HEAD"):
                response = await test_app.test_client().open("/", method=method, headers=headers)
                assert response.status_code == 200
                assert response.headers["Content-Type"] == "text/plain; charset=utf-8"
                if method == "GET":
                    assert await response.get_data() == b"Ollama is running"

    async def test_a_browser_gets_the_page(self, app) -> None:
        response = await app.test_client().get("/", headers={"Accept": "text/html,*/*;q=0.8"})
        assert "text/html" in response.headers["Content-Type"]


class TestNames:
    @pytest.mark.parametrize(
        ("requested", "found"),
        [("bubo", "bubo"), ("bubo:latest", "bubo"), ("BuBo:LATEST", "bubo"), (f"{MODEL_ID.upper()}", MODEL_ID),
         ("bubo:7b", None), ("bub", None), ("library/bubo", None)],
    )  # fmt: skip
    def test_resolution(self, requested, found) -> None:
        assert resolve(requested, (MODEL_ID, "bubo")) == found

    async def test_unknown_and_missing_models(self, app) -> None:
        """404 with Ollama's message; 400 'model is required' without a model."""
        unknown = await post(app, "/api/chat", {"model": "llama3.2", "messages": HI})
        assert unknown.status_code == 404
        assert await unknown.get_json() == {"error": "model 'llama3.2' not found"}
        missing = await post(app, "/api/generate", {"prompt": "x"})
        assert (missing.status_code, await missing.get_json()) == (400, {"error": "model is required"})

    async def test_any_name_with_model_names_any(self, make_runtime, settings) -> None:
        """--model-names any: every name is the served model here too (aider's ``ollama_chat/qwen2.5-coder``)."""
        runtime = attrs.evolve(make_runtime(), any_model_name=True)
        any_app = create_app(settings, load=lambda _s, _p: runtime, on_load_failure=lambda: None)
        async with any_app.test_app() as test_app:
            await wait_until_ready(any_app)
            shown = await post(test_app, "/api/show", {"model": "qwen2.5-coder"})
            chat = await post(
                test_app, "/api/chat", {"model": "qwen2.5-coder", "messages": HI, "stream": False}
            )
            pulled = await post(test_app, "/api/pull", {"model": "llama3.2", "stream": False})
            missing = await post(test_app, "/api/chat", {"messages": HI})
        assert shown.status_code == 200
        assert (await shown.get_json())["model_info"]["general.architecture"] == "llama"
        assert chat.status_code == 200
        assert (await chat.get_json())["model"] == "qwen2.5-coder"
        assert (pulled.status_code, await pulled.get_json()) == (200, {"status": "success"})
        assert (missing.status_code, await missing.get_json()) == (400, {"error": "model is required"})

    async def test_each_chunk_echoes_the_name_as_sent(self, app) -> None:
        lines = await lines_of(app, "/api/chat", {"model": "Bubo:Latest", "messages": HI})
        assert {line["model"] for line in lines} == {"Bubo:Latest"}


class TestChat:
    async def test_streams_by_default_a_line_per_token(self, app, script: FakeScript) -> None:
        """No `stream`: NDJSON, one chunk per token, then the final chunk with integer nanoseconds."""
        script.reply = "Hi there friend"
        lines = await lines_of(app, "/api/chat", {"model": "bubo", "messages": HI})
        *chunks, final = lines
        assert [c["message"]["content"] for c in chunks] == ["Hi", " there", " friend"]
        for chunk in chunks:
            matches(chunk, SHAPES["chat_chunk"])
        matches(final, SHAPES["chat_final"])
        assert final["eval_count"] == 3
        assert final["total_duration"] >= final["load_duration"]

    async def test_each_line_is_sent_as_it_is_made(self, app, script: FakeScript) -> None:
        """The first line arrives while the rest is still being generated (flushed per token)."""
        script.reply = "one two three four"
        script.piece_delay = 0.05
        body = json.dumps({"model": "bubo", "messages": HI}).encode()
        async with exchange(app.app, "/api/chat", body) as ex:
            first = await ex.receive_chunk()
            assert json.loads(first)["message"]["content"] == "one"
            assert first.count(b"\n") == 1
            rest = await ex.read_all()
        assert json.loads(rest.decode().split("\n")[-2])["done"] is True

    async def test_not_streamed(self, app, script: FakeScript) -> None:
        script.reply = "Hi there"
        response = await post(app, "/api/chat", {"model": "bubo", "messages": HI, "stream": False})
        assert response.headers["Content-Type"] == "application/json"
        body = await response.get_json()
        matches(body, SHAPES["chat_whole"])
        assert body["message"]["content"] == "Hi there"

    async def test_length(self, app, script: FakeScript) -> None:
        script.reply = "a b c d e f"
        body = {"model": "bubo", "messages": HI, "stream": False, "options": {"num_predict": 2}}
        answer = await (await post(app, "/api/chat", body)).get_json()
        assert (answer["done_reason"], answer["eval_count"]) == ("length", 2)

    async def test_tool_call_round_trip(self, thinking_app, fake_engine, tokenizer) -> None:
        """A call arrives whole, arguments an object, done_reason stop; its result goes back as a tool message."""
        fake_engine.script.reply = CALL_TEXT
        body = {"model": "bubo", "messages": [{"role": "user", "content": "Weather in Paris?"}],
                "tools": [WEATHER], "think": False}  # fmt: skip
        *chunks, final = await lines_of(thinking_app, "/api/chat", body)
        calls = [c for c in chunks if c["message"].get("tool_calls")]
        assert len(calls) == 1
        matches(calls[0], SHAPES["chat_tool_call_chunk"])
        assert final["done_reason"] == "stop"
        call = calls[0]["message"]["tool_calls"][0]
        fake_engine.script.reply = "It is sunny."
        history = [*body["messages"], {"role": "assistant", "content": "", "tool_calls": [call]},
                   {"role": "tool", "tool_name": "get_weather", "content": "sunny, 24 C"}]  # fmt: skip
        whole = await (
            await post(thinking_app, "/api/chat", {**body, "messages": history, "stream": False})
        ).get_json()
        assert whole["message"]["content"] == "It is sunny."
        prompt = tokenizer.decode(fake_engine.requests[-1].prompt_tokens)
        assert '"name": "get_weather", "arguments": {"city": "Paris"}' in prompt
        assert "<tool_response>\nsunny, 24 C\n</tool_response>" in prompt

    async def test_thinking(self, thinking_app, fake_engine) -> None:
        """think on a thinking template: thinking in its own field, streamed and folded."""
        fake_engine.script.reply = "<think>\nA greeting.\n</think>\n\nHi!"
        *chunks, _final = await lines_of(
            thinking_app, "/api/chat", {"model": "bubo", "messages": HI, "think": "high"}
        )
        thinking = [c for c in chunks if "thinking" in c["message"]]
        matches(thinking[0], SHAPES["chat_thinking_chunk"])
        assert "".join(c["message"]["content"] for c in chunks).strip() == "Hi!"
        whole = await (
            await post(thinking_app, "/api/chat", {"model": "bubo", "messages": HI, "stream": False})
        ).get_json()
        assert (whole["message"]["thinking"].strip(), whole["message"]["content"].strip()) == (
            "A greeting.",
            "Hi!",
        )

    async def test_think_false_turns_the_template_s_thinking_off(
        self, thinking_app, fake_engine, tokenizer
    ) -> None:
        await post(
            thinking_app, "/api/chat", {"model": "bubo", "messages": HI, "think": False, "stream": False}
        )
        assert tokenizer.decode(fake_engine.requests[-1].prompt_tokens).endswith("<think>\n\n</think>\n\n")

    async def test_think_on_a_model_that_does_not_think(self, app) -> None:
        response = await post(app, "/api/chat", {"model": "bubo", "messages": HI, "think": True})
        assert (response.status_code, await response.get_json()) == (
            400,
            {"error": '"bubo" does not support thinking'},
        )

    async def test_format_schema_is_enforced_by_a_grammar(self, app, fake_engine) -> None:
        schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
        fake_engine.script.reply = '{"n": 3}'
        body = {"model": "bubo", "messages": HI, "format": schema, "stream": False}
        answer = await (await post(app, "/api/chat", body)).get_json()
        assert json.loads(answer["message"]["content"]) == {"n": 3}
        assert "output-n-kv" in fake_engine.compiled[-1][1]  # the schema's grammar, built for this request

    @pytest.mark.parametrize("value", ["yaml", 3, ["json"]])
    async def test_a_bad_format(self, app, value) -> None:
        response = await post(app, "/api/chat", {"model": "bubo", "messages": HI, "format": value})
        assert response.status_code == 400

    async def test_images_on_a_text_model(self, app) -> None:
        messages = [{"role": "user", "content": "What is this?", "images": ["aGVsbG8="]}]
        response = await post(app, "/api/chat", {"model": "bubo", "messages": messages})
        assert response.status_code == 400
        assert "image" in (await response.get_json())["error"]

    async def test_logprobs(self, app) -> None:
        body = {"model": "bubo", "messages": HI, "stream": False, "logprobs": True, "top_logprobs": 2}
        answer = await (await post(app, "/api/chat", body)).get_json()
        assert len(answer["logprobs"]) == answer["eval_count"]
        first = answer["logprobs"][0]
        assert set(first) == {"token", "logprob", "bytes", "top_logprobs"}
        assert len(first["top_logprobs"]) == 2

    async def test_roles_are_read_in_any_case(self, app) -> None:
        messages = [{"role": "SYSTEM", "content": "Be brief."}, {"role": "User", "content": "Hi"}]
        assert (await post(app, "/api/chat", {"model": "bubo", "messages": messages})).status_code == 200
        bad = await post(app, "/api/chat", {"model": "bubo", "messages": [{"role": "robot", "content": "x"}]})
        assert bad.status_code == 400

    async def test_an_error_mid_stream_is_a_last_error_line(self, app, script: FakeScript) -> None:
        script.reply = "a b c d e"
        script.fail_after = 2
        *chunks, last = await lines_of(app, "/api/chat", {"model": "bubo", "messages": HI})
        assert [c["done"] for c in chunks] == [False, False]
        matches(last, SHAPES["error"])

    async def test_a_client_that_leaves_frees_the_slot(self, app, script: FakeScript, fake_engine) -> None:
        script.reply = "word " * 400
        script.piece_delay = 0.01
        body = json.dumps({"model": "bubo", "messages": HI}).encode()
        async with exchange(app.app, "/api/chat", body) as ex:
            await ex.receive_chunk()
            await ex.disconnect()
        with trio.fail_after(5):
            while fake_engine.statistics().requests_processing:
                await trio.sleep(0.01)
        assert fake_engine.cancelled == 1
        assert fake_engine.statistics().slots[0].n_decoded < 400

    async def test_empty_messages_load_and_keep_alive_0_unloads(self, app, fake_engine) -> None:
        """Load and unload answers; the model keeps serving (single-model mode)."""
        load = await (await post(app, "/api/chat", {"model": "bubo", "messages": []})).get_json()
        matches(load, SHAPES["chat_load"])
        unload = await (await post(app, "/api/chat", {"model": "bubo", "keep_alive": 0})).get_json()
        matches(unload, SHAPES["chat_unload"])
        assert not fake_engine.requests
        assert (
            await post(app, "/api/chat", {"model": "bubo", "messages": HI, "stream": False})
        ).status_code == 200


class TestOptions:
    async def test_options_reach_the_samplers(self, app, fake_engine) -> None:
        options = {"temperature": 0.2, "top_k": 7, "top_p": 0.5, "min_p": 0.1, "typical_p": 0.9, "seed": 42,
                   "repeat_penalty": 1.1, "repeat_last_n": 16, "presence_penalty": 0.5, "frequency_penalty": 0.25,
                   "num_predict": 3, "stop": ["xyz"], "num_keep": 5,
                   "num_ctx": 99999, "num_thread": 64, "num_gpu": 99, "use_mmap": False, "brand_new": 1}  # fmt: skip
        await post(app, "/api/chat", {"model": "bubo", "messages": HI, "options": options, "stream": False})
        sent = fake_engine.requests[-1]
        sampling = sent.sampling
        assert (sampling.temperature, sampling.top_k, sampling.top_p, sampling.min_p) == (0.2, 7, 0.5, 0.1)
        assert (sampling.typical_p, sampling.seed, sampling.repeat_penalty, sampling.repeat_last_n) == (
            0.9,
            42,
            1.1,
            16,
        )
        assert (sampling.presence_penalty, sampling.frequency_penalty) == (0.5, 0.25)
        assert (sent.max_new_tokens, sent.stop, sent.n_keep) == (3, ("xyz",), 5)

    @pytest.mark.parametrize(
        ("options", "message"),
        [({"temperature": "hot"}, "option 'temperature' must be a number"),
         ({"top_k": 1.5}, "option 'top_k' must be an integer"),
         ({"num_ctx": True}, "option 'num_ctx' must be an integer"),
         ({"stop": "x"}, "option 'stop' must be an array of strings"),
         ({"top_p": 2}, "top_p must be at least 0 and at most 1, got 2")],
    )  # fmt: skip
    async def test_a_known_option_of_the_wrong_type(self, app, options, message) -> None:
        response = await post(app, "/api/chat", {"model": "bubo", "messages": HI, "options": options})
        assert response.status_code == 400
        assert (await response.get_json())["error"] == message

    def test_unlimited_and_null(self) -> None:
        assert generation_options({"num_predict": -1}).max_tokens == -1
        assert generation_options({"num_predict": -2}).max_tokens == -1
        assert generation_options({"seed": -1, "temperature": None}).sampling.seed is None
        with pytest.raises(InvalidRequest):
            generation_options({"num_predict": -3})

    @pytest.mark.parametrize(
        ("value", "seconds"),
        [(0, 0.0), ("0", 0.0), (300, 300.0), (1.5, 1.5), ("5m", 300.0), ("1h30m", 5400.0), ("250ms", 0.25),
         ("-1", None), (-1, FOREVER_S), ("-5m", FOREVER_S), (None, None)],
    )  # fmt: skip
    def test_keep_alive(self, value, seconds) -> None:
        if value == "-1":  # Go's ParseDuration wants a unit: Ollama refuses it too
            with pytest.raises(InvalidRequest):
                keep_alive_seconds(value)
            return
        assert keep_alive_seconds(value) == seconds

    async def test_a_bad_keep_alive(self, app) -> None:
        response = await post(app, "/api/chat", {"model": "bubo", "messages": HI, "keep_alive": "soon"})
        assert response.status_code == 400


FIM = FimTokens(pre=10, suf=11, mid=12, rep=13, sep=14)


class TestGenerate:
    async def test_streams_with_context(self, app, fake_engine, script: FakeScript) -> None:
        """Through the chat template; the final chunk's context is the prompt's tokens and the answer's."""
        script.reply = "Hello world"
        *chunks, final = await lines_of(
            app, "/api/generate", {"model": "bubo", "prompt": "Hi", "system": "Be kind."}
        )
        for chunk in chunks:
            matches(chunk, SHAPES["generate_chunk"])
        matches(final, SHAPES["generate_final"])
        prompt = list(fake_engine.requests[-1].prompt_tokens)
        assert final["context"][: len(prompt)] == prompt
        assert len(final["context"]) == len(prompt) + 2

    async def test_context_goes_before_the_next_prompt(self, app, fake_engine) -> None:
        first = await (
            await post(app, "/api/generate", {"model": "bubo", "prompt": "Hi", "stream": False})
        ).get_json()
        await post(
            app,
            "/api/generate",
            {"model": "bubo", "prompt": "More", "context": first["context"], "stream": False},
        )
        sent = list(fake_engine.requests[-1].prompt_tokens)
        assert sent[: len(first["context"])] == first["context"]
        bad = await post(app, "/api/generate", {"model": "bubo", "prompt": "x", "context": [1, 10**9]})
        assert bad.status_code == 400

    async def test_raw(self, app, fake_engine, tokenizer, script: FakeScript) -> None:
        """raw: the prompt as it is, no context in the answer."""
        script.reply = "a b c"
        body = {
            "model": "bubo",
            "prompt": "The sky is",
            "raw": True,
            "stream": False,
            "options": {"num_predict": 2},
        }
        answer = await (await post(app, "/api/generate", body)).get_json()
        matches(answer, {**SHAPES["generate_raw_final"], "response": "<str>"})
        assert tokenizer.decode(fake_engine.requests[-1].prompt_tokens) == "The sky is"

    @pytest.mark.parametrize("extra", [{"system": "x"}, {"context": [1]}, {"template": "{{ .Prompt }}"}])
    async def test_raw_refuses_what_a_template_would_use(self, app, extra) -> None:
        response = await post(app, "/api/generate", {"model": "bubo", "prompt": "x", "raw": True, **extra})
        assert response.status_code == 400

    async def test_template_is_refused(self, app) -> None:
        response = await post(
            app, "/api/generate", {"model": "bubo", "prompt": "x", "template": "{{ .Prompt }}"}
        )
        assert response.status_code == 400
        assert "template" in (await response.get_json())["error"]

    async def test_suffix_goes_through_fill_in_the_middle(self, settings, make_runtime, tokenizer) -> None:
        engine = FakeEngine(
            info=attrs.evolve(fake_model_info(), fim=FIM, n_batch=64), script=FakeScript(reply="a + b")
        )
        runtime = attrs.evolve(make_runtime(), engine=engine)
        app = create_app(settings, load=lambda _s, _p: runtime, on_load_failure=lambda: None)
        async with app.test_app() as test_app:
            await wait_until_ready(app)
            body = {"model": "bubo", "prompt": "def add(a, b):\n    return ", "suffix": "\n", "stream": False}
            answer = await (await post(test_app, "/api/generate", body)).get_json()
        assert answer["response"] == "a + b"
        tokens = list(engine.requests[-1].prompt_tokens)
        assert tokens[-1] == FIM.mid
        assert FIM.pre in tokens
        assert FIM.suf in tokens

    async def test_suffix_on_a_model_without_fim(self, app) -> None:
        response = await post(app, "/api/generate", {"model": "bubo", "prompt": "x", "suffix": "y"})
        assert response.status_code == 400
        assert "does not support insert" in (await response.get_json())["error"]

    async def test_empty_prompt_loads_and_unloads(self, app) -> None:
        load = await (await post(app, "/api/generate", {"model": "bubo"})).get_json()
        unload = await (await post(app, "/api/generate", {"model": "bubo", "keep_alive": "0"})).get_json()
        assert (load["done_reason"], unload["done_reason"], unload["response"]) == ("load", "unload", "")


class TestEmbeddings:
    @pytest.fixture(name="embed_app")
    async def _embed_app(self, settings, make_runtime, script):
        engine = FakeEngine(script=script, embedder=FakeEmbedder(n_tokens=16))
        runtime = attrs.evolve(make_runtime(), engine=engine)
        app = create_app(settings, load=lambda _s, _p: runtime, on_load_failure=lambda: None)
        async with app.test_app() as test_app:
            await wait_until_ready(app)
            yield test_app

    async def test_embed(self, embed_app) -> None:
        body = await (
            await post(embed_app, "/api/embed", {"model": "bubo", "input": ["cat", "dog"]})
        ).get_json()
        matches(body, SHAPES["embed"])
        for vector in body["embeddings"]:
            assert math.fsum(x * x for x in vector) == pytest.approx(1.0, abs=1e-5)

    async def test_dimensions_and_truncate(self, embed_app) -> None:
        short = await (
            await post(embed_app, "/api/embed", {"model": "bubo", "input": "cat", "dimensions": 8})
        ).get_json()
        assert len(short["embeddings"][0]) == 8
        assert math.fsum(x * x for x in short["embeddings"][0]) == pytest.approx(1.0, abs=1e-5)
        long_text = "word " * 100
        cut = await post(embed_app, "/api/embed", {"model": "bubo", "input": long_text})
        assert cut.status_code == 200  # truncated to what one embedding may hold (the default)
        refused = await post(
            embed_app, "/api/embed", {"model": "bubo", "input": long_text, "truncate": False}
        )
        assert refused.status_code == 400

    async def test_empty_and_bad_input(self, embed_app) -> None:
        empty = await (await post(embed_app, "/api/embed", {"model": "bubo", "input": []})).get_json()
        assert empty == {"model": "bubo", "embeddings": []}
        bad = await post(embed_app, "/api/embed", {"model": "bubo", "input": ["x", 3]})
        assert bad.status_code == 400

    async def test_legacy_embeddings(self, embed_app) -> None:
        body = await (await post(embed_app, "/api/embeddings", {"model": "bubo", "prompt": "cat"})).get_json()
        matches(body, SHAPES["embeddings"])
        empty = await (await post(embed_app, "/api/embeddings", {"model": "bubo", "prompt": ""})).get_json()
        assert empty == {"embedding": []}

    async def test_without_embeddings(self, app) -> None:
        response = await post(app, "/api/embed", {"model": "bubo", "input": "x"})
        assert response.status_code == 501
        matches(await response.get_json(), SHAPES["error"])
        shown = await (await post(app, "/api/show", {"model": "bubo"})).get_json()
        assert "embedding" not in shown["capabilities"]

    async def test_a_generative_models_embedding_is_its_last_tokens(
        self, settings, make_runtime, script, tokenizer
    ) -> None:
        """Pooling none (SmolLM2's own): /api/embed and /api/embeddings pool as Ollama does, by the last token."""
        embedder = FakeEmbedder(pooling="none", n_tokens=16)
        runtime = attrs.evolve(make_runtime(), engine=FakeEngine(script=script, embedder=embedder))
        app = create_app(settings, load=lambda _s, _p: runtime, on_load_failure=lambda: None)
        async with app.test_app() as test_app:
            await wait_until_ready(app)
            shown = await (await post(test_app, "/api/show", {"model": "bubo"})).get_json()
            embedded = await post(test_app, "/api/embed", {"model": "bubo", "input": ["cat sat", "dog"]})
            legacy = await post(test_app, "/api/embeddings", {"model": "bubo", "prompt": "cat sat"})
        assert "embedding" in shown["capabilities"]
        assert (embedded.status_code, legacy.status_code) == (200, 200)
        vectors = (await embedded.get_json())["embeddings"]
        for vector, text in zip(vectors, ("cat sat", "dog"), strict=True):
            last = embedder.embed(tokenizer.encode(text, add_special=True))[-1]
            assert vector == pytest.approx(last / math.sqrt(math.fsum(x * x for x in last)), abs=1e-5)
        assert (await legacy.get_json())["embedding"] == pytest.approx(vectors[0], abs=1e-6)


class TestManagement:
    async def test_pull_of_a_served_model(self, app) -> None:
        streamed = await post(app, "/api/pull", {"model": "bubo:latest"})
        matches(ndjson(await streamed.get_data()), SHAPES["pull"])
        whole = await post(app, "/api/pull", {"name": "bubo", "stream": False})
        assert await whole.get_json() == {"status": "success"}
        other = await post(app, "/api/pull", {"model": "llama3.2"})
        assert (other.status_code, await other.get_json()) == (404, {"error": "model 'llama3.2' not found"})

    @pytest.mark.parametrize(
        ("method", "path"),
        [("POST", "/api/push"), ("POST", "/api/create"), ("POST", "/api/copy"), ("DELETE", "/api/delete"),
         ("POST", "/api/blobs/sha256:abc")],
    )  # fmt: skip
    async def test_management_is_501(self, app, method, path) -> None:
        response = await app.test_client().open(path, method=method, json={"model": "bubo"})
        assert response.status_code == 501
        matches(await response.get_json(), SHAPES["error"])


class TestErrors:
    async def test_bad_json_and_bad_fields(self, app) -> None:
        broken = await app.test_client().post(
            "/api/chat", data=b"{nope", headers={"Content-Type": "application/json"}
        )
        assert broken.status_code == 400
        matches(await broken.get_json(), SHAPES["error"])
        wrong = await post(app, "/api/chat", {"model": "bubo", "messages": "hi"})
        assert wrong.status_code == 400
        assert "$.messages" in (await wrong.get_json())["error"]

    async def test_unknown_paths_and_methods(self, app) -> None:
        assert (await app.test_client().get("/api/nothing")).status_code == 404
        wrong = await app.test_client().get("/api/chat")
        assert wrong.status_code == 405
        matches(await wrong.get_json(), SHAPES["error"])

    async def test_the_api_key_protects_the_routes(self, make_runtime) -> None:
        app = create_app(
            load_settings({"server__api_key": "k"}, environ={}), load=lambda _s, _p: make_runtime(),
            on_load_failure=lambda: None,
        )  # fmt: skip
        async with app.test_app() as test_app:
            await wait_until_ready(app)
            client = test_app.test_client()
            refused = await client.get("/api/tags")
            assert refused.status_code == 401
            matches(await refused.get_json(), SHAPES["error"])
            assert (await client.get("/api/tags", headers={"Authorization": "Bearer k"})).status_code == 200

    async def test_a_full_queue_is_503_with_retry_after(
        self, settings, make_runtime, script: FakeScript
    ) -> None:
        script.reply = "word " * 50
        script.piece_delay = 0.02
        runtime = attrs.evolve(make_runtime(), max_queue=0)
        app = create_app(settings, load=lambda _s, _p: runtime, on_load_failure=lambda: None)
        async with app.test_app() as test_app:
            await wait_until_ready(app)
            body = json.dumps({"model": "bubo", "messages": HI}).encode()
            async with exchange(test_app.app, "/api/chat", body) as ex:
                await ex.receive_chunk()
                refused = await post(test_app, "/api/chat", {"model": "bubo", "messages": HI})
                assert refused.status_code == 503
                assert refused.headers["Retry-After"]
                matches(await refused.get_json(), SHAPES["error"])
                await ex.disconnect()
