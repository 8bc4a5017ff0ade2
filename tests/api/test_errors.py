"""Every documented error: status, envelope, code and the JSON path of the bad field."""

from __future__ import annotations

import re

import attrs
import pytest
from dirty_equals import IsStr

from bubo.config import load_settings
from bubo.server import create_app
from bubo.templates import ChatTemplate

from ..conftest import wait_until_ready

CHAT = "/v1/chat/completions"
USER = [{"role": "user", "content": "hi"}]


def envelope(code: str, type_: str = "invalid_request_error", param: object = None) -> dict[str, object]:
    return {"error": {"message": IsStr, "type": type_, "param": param, "code": code}}


class TestParseErrors:
    @pytest.mark.parametrize(
        ("body", "param"),
        [
            ({"model": "bubo", "messages": USER, "max_tokens": "5"}, "max_tokens"),
            ({"model": "bubo", "messages": USER, "max_tokens": True}, "max_tokens"),
            ({"model": "bubo", "messages": USER, "temperature": "hot"}, "temperature"),
            ({"model": "bubo", "messages": USER, "stream": "yes"}, "stream"),
            ({"model": "bubo", "messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
            ({"model": "bubo", "messages": [{"content": "x"}]}, "messages[0].role"),
            ({"model": "bubo", "messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
            ({"model": "bubo", "messages": [{"role": "user", "content": [{"type": "text"}]}]},
             "messages[0].content[0].text"),
            ({"model": "bubo", "messages": "hello"}, "messages"),
            ({"model": "bubo", "messages": USER, "stop": ["a", 1]}, "stop[1]"),
            ({"model": 7, "messages": USER}, "model"),
            ({"model": "bubo", "messages": USER, "stream_options": {"include_usage": 1}}, "stream_options.include_usage"),
        ],
    )  # fmt: skip
    async def test_wrong_type_names_the_field(self, app, body, param) -> None:
        """A wrong type is a 400 parse_error whose param is the field's JSON path."""
        response = await app.test_client().post(CHAT, json=body)
        assert response.status_code == 400
        payload = await response.get_json()
        assert payload == envelope("parse_error", param=param)
        assert f"@ $.{param}" in payload["error"]["message"]

    @pytest.mark.parametrize("data", [b"", b"{", b"[1, 2]", b'"text"', b'{"max_tokens": NaN}', b"\xff\xfe"])
    async def test_invalid_json_body(self, app, data: bytes) -> None:
        """A body that is not a JSON object is a 400 parse_error."""
        response = await app.test_client().post(CHAT, data=data, headers={"Content-Type": "application/json"})
        assert response.status_code == 400
        assert await response.get_json() == envelope("parse_error")

    async def test_content_type_is_not_required(self, app) -> None:
        """JSON is accepted whatever the content type says (curl -d sends form encoding)."""
        response = await app.test_client().post(
            CHAT,
            data=b'{"model":"bubo","messages":[{"role":"user","content":"hi"}]}',
            headers={"Content-Type": "application/x-www-form-urlencoded"},
        )
        assert response.status_code == 200


class TestSemanticErrors:
    async def test_missing_model(self, app) -> None:
        """No model is 400 missing_model."""
        response = await app.test_client().post(CHAT, json={"messages": USER})
        assert response.status_code == 400
        assert await response.get_json() == envelope("missing_model", param="model")

    async def test_unknown_model_names_the_served_id(self, app) -> None:
        """An unknown model is 404 model_not_found naming the served id."""
        response = await app.test_client().post(CHAT, json={"model": "gpt-4o", "messages": USER})
        assert response.status_code == 404
        body = await response.get_json()
        assert body == envelope("model_not_found", param="model")
        assert "smollm2-135m-instruct-q4-1" in body["error"]["message"]

    @pytest.mark.parametrize("path", [CHAT, "/v1/messages", "/v1/responses"])
    async def test_any_model_name_with_model_names_any(self, make_runtime, settings, path) -> None:
        """--model-names any: the names agents ask for (claude-haiku-…, gpt-5-codex) are the served model."""
        runtime = attrs.evolve(make_runtime(), any_model_name=True)
        app = create_app(settings, load=lambda _s, _p: runtime, on_load_failure=lambda: None)
        body = {"model": "claude-haiku-4-5", "max_tokens": 4, "messages": USER, "input": "Hi"}
        async with app.test_app() as test_app:
            await wait_until_ready(app)
            response = await test_app.test_client().post(path, json=body)
            missing = await test_app.test_client().post(path, json={**body, "model": None})
        assert response.status_code == 200
        assert (await response.get_json())["model"] == "claude-haiku-4-5"
        assert missing.status_code == 400  # a name is still required

    @pytest.mark.parametrize("messages", [None, []])
    async def test_missing_messages(self, app, messages) -> None:
        """Absent or empty messages is 400 missing_messages."""
        body = {"model": "bubo"} if messages is None else {"model": "bubo", "messages": messages}
        response = await app.test_client().post(CHAT, json=body)
        assert response.status_code == 400
        assert await response.get_json() == envelope("missing_messages", param="messages")

    @pytest.mark.parametrize("n", [0, 2, 5])
    async def test_n_other_than_one(self, app, n) -> None:
        """Only n = 1 is served."""
        response = await app.test_client().post(CHAT, json={"model": "bubo", "messages": USER, "n": n})
        assert response.status_code == 400
        assert await response.get_json() == envelope("unsupported_n", param="n")

    @pytest.mark.parametrize("value", [0, -2, -100])
    async def test_max_tokens_must_be_positive(self, app, value) -> None:
        """max_tokens other than -1/null must be a positive integer."""
        response = await app.test_client().post(
            CHAT, json={"model": "bubo", "messages": USER, "max_tokens": value}
        )
        assert response.status_code == 400
        assert await response.get_json() == envelope("invalid_request", param="max_tokens")

    async def test_prompt_longer_than_the_context(self, app) -> None:
        """A prompt that does not fit is a 400 with both token counts, before any decoding."""
        long = "word " * 3000
        response = await app.test_client().post(
            CHAT, json={"model": "bubo", "messages": [{"role": "user", "content": long}]}
        )
        assert response.status_code == 400
        body = await response.get_json()
        assert body["error"]["code"] == "context_length_exceeded"
        assert body["error"]["n_ctx"] == 2048
        assert body["error"]["n_prompt_tokens"] > 2048

    @pytest.mark.parametrize(
        ("path", "body", "kind", "pattern"),
        [
            (CHAT, {"model": "bubo", "messages": [{"role": "user", "content": "word " * 3000}]}, "invalid_request_error",
             r"^This model's maximum context length is 2048 tokens\. However, your messages resulted in (\d+) tokens\."),
            ("/v1/responses", {"model": "bubo", "input": "word " * 3000}, "invalid_request_error",
             r"^This model's maximum context length is 2048 tokens\. However, your messages resulted in (\d+) tokens\."),
            ("/v1/messages", {"model": "bubo", "max_tokens": 8, "messages": [{"role": "user", "content": "word " * 3000}]},
             "invalid_request_error", r"^prompt is too long: (\d+) tokens > 2048 maximum$"),
            ("/completion", {"prompt": "word " * 3000}, "exceed_context_size_error",
             r"^This model's maximum context length is 2048 tokens\. However, your messages resulted in (\d+) tokens\."),
        ],
        ids=["chat", "responses", "anthropic", "llama-server"],
    )  # fmt: skip
    async def test_overflow_in_the_words_agents_compact_on(self, app, path, body, kind, pattern) -> None:
        """Each dialect words an overflow as its agents match it, with the prompt's real token count."""
        response = await app.test_client().post(path, json=body)
        assert response.status_code == 400
        error = (await response.get_json())["error"]
        assert (error["type"], error["code"]) == (kind, "context_length_exceeded")
        match = re.match(pattern, error["message"])
        assert match is not None, error["message"]
        assert int(match.group(1)) > 2048
        if path != "/v1/messages":
            assert (error["n_ctx"], error["n_prompt_tokens"]) == (2048, int(match.group(1)))

    async def test_images_are_rejected_on_a_text_model(self, app) -> None:
        """An image part is a clear 400 naming the part."""
        parts = [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]
        response = await app.test_client().post(
            CHAT, json={"model": "bubo", "messages": [{"role": "user", "content": parts}]}
        )
        assert response.status_code == 400
        assert await response.get_json() == envelope("unsupported_content", param="messages[0].content[0]")

    async def test_top_logprobs_needs_logprobs(self, app) -> None:
        """top_logprobs without logprobs: true is a 400."""
        response = await app.test_client().post(
            CHAT, json={"model": "bubo", "messages": USER, "top_logprobs": 3}
        )
        assert response.status_code == 400

    async def test_template_rejection_is_a_400(self, make_runtime, tokenizer) -> None:
        """A conversation the template rejects (raise_exception) is a 400, never a 500."""
        source = "{% if messages[0].role != 'system' %}{{ raise_exception('a system turn must come first') }}{% endif %}"
        template = ChatTemplate(source, bos_token="", eos_token="", origin="test")
        runtime = attrs.evolve(make_runtime(), template=template)
        app = create_app(
            load_settings({}, environ={}), load=lambda _s, _p: runtime, on_load_failure=lambda: None
        )
        async with app.test_app() as test_app:
            await wait_until_ready(app)
            response = await test_app.test_client().post(CHAT, json={"model": "bubo", "messages": USER})
        assert response.status_code == 400
        body = await response.get_json()
        assert body == envelope("template_error", param="messages")
        assert "a system turn must come first" in body["error"]["message"]

    @pytest.mark.parametrize("role", ["user", "system", "tool"])
    async def test_null_content_is_only_for_assistants(self, app, role) -> None:
        """content: null is accepted for assistant turns only."""
        response = await app.test_client().post(
            CHAT, json={"model": "bubo", "messages": [{"role": role, "content": None}]}
        )
        assert response.status_code == 400
        assert (await response.get_json())["error"]["param"] == "messages[0].content"


class TestRoutingErrors:
    async def test_unknown_path(self, app) -> None:
        """Any unknown path is 404 not_found."""
        response = await app.test_client().get("/v2/whatever")
        assert response.status_code == 404
        assert await response.get_json() == envelope("not_found")

    async def test_wrong_method(self, app) -> None:
        """A known path with the wrong method is 405 with Allow."""
        response = await app.test_client().get(CHAT)
        assert response.status_code == 405
        assert "POST" in response.headers["Allow"]

    @pytest.mark.parametrize(
        "path", ["/v1/embeddings", "/v1/rerank", "/v1/reranking", "/rerank", "/sdapi/v1/txt2img"]
    )
    async def test_not_implemented_paths(self, app, path) -> None:
        """Endpoints a text model does not serve answer 501 not_implemented."""
        response = await app.test_client().post(path, json={})
        assert response.status_code == 501
        assert await response.get_json() == envelope("not_implemented", type_="server_error")


class TestApiKey:
    @pytest.fixture(name="keyed_app")
    async def _keyed_app(self, make_runtime):
        settings = load_settings({"server__api_key": "s3cret"}, environ={})
        app = create_app(settings, load=lambda _s, _p: make_runtime(), on_load_failure=lambda: None)
        async with app.test_app() as test_app:
            await wait_until_ready(app)
            yield test_app

    @pytest.mark.parametrize(
        "path", ["/health", "/ready", "/v1/models", "/props", "/metrics", "/cache", "/nope"]
    )
    @pytest.mark.parametrize("header", [None, "Bearer wrong", "s3cret", "Basic s3cret"])
    async def test_missing_or_wrong_key(self, keyed_app, path, header) -> None:
        """Every route, health included, needs the key: 401 with WWW-Authenticate."""
        headers = {} if header is None else {"Authorization": header}
        response = await keyed_app.test_client().get(path, headers=headers)
        assert response.status_code == 401
        assert response.headers["WWW-Authenticate"] == "Bearer"
        assert await response.get_json() == envelope("invalid_api_key", type_="authentication_error")

    async def test_right_key(self, keyed_app) -> None:
        """The right bearer token passes."""
        response = await keyed_app.test_client().get("/health", headers={"Authorization": "Bearer s3cret"})
        assert response.status_code == 200


class TestNotReady:
    async def test_while_draining_ready_is_503_and_requests_are_still_served(self, make_runtime) -> None:
        """--drain-delay: after the signal /ready turns 503 "stopping" first, and only the drain refuses work."""
        from bubo.server import drain, start_draining

        app = create_app(
            load_settings({}, environ={}), load=lambda _s, _p: make_runtime(), on_load_failure=lambda: None
        )
        async with app.test_app() as test_app:
            client = test_app.test_client()
            await wait_until_ready(app)
            start_draining(app)
            ready = await client.get("/ready")
            assert ready.status_code == 503
            assert (await ready.get_json())["status"] == "stopping"
            assert (await ready.get_json())["error"]["code"] == "not_ready"
            assert (await client.get("/health")).status_code == 200
            assert (await client.post(CHAT, json={"model": "bubo", "messages": USER})).status_code == 200
            await drain(app, 1.0)
            refused = await client.post(CHAT, json={"model": "bubo", "messages": USER})
            assert refused.status_code == 503
            assert await refused.get_json() == envelope("not_ready", type_="server_error")

    async def test_requests_while_loading(self, make_runtime) -> None:
        """While the model loads, /ready and POSTs are 503 not_ready; /health is 200."""
        import trio

        release, loading = trio.Event(), trio.Event()
        loaded = []

        def slow_load(_settings, progress):
            progress(0.5)
            trio.from_thread.run_sync(loading.set)
            trio.from_thread.run(release.wait)
            loaded.append(True)
            return make_runtime()

        app = create_app(load_settings({}, environ={}), load=slow_load, on_load_failure=lambda: None)
        async with app.test_app() as test_app:
            client = test_app.test_client()
            await loading.wait()
            ready = await client.get("/ready")
            assert ready.status_code == 503
            assert (await ready.get_json())["error"]["code"] == "not_ready"
            assert (await client.get("/health")).status_code == 200
            chat = await client.post(CHAT, json={"model": "bubo", "messages": USER})
            assert chat.status_code == 503
            assert await chat.get_json() == envelope("not_ready", type_="server_error")
            release.set()
            await wait_until_ready(app)
            assert (await client.get("/ready")).status_code == 200
