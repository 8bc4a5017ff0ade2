"""llama-server endpoints, every error code, and disconnects, over httpx against a real server."""

from __future__ import annotations

import json
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from .._sse import payloads

pytestmark = [pytest.mark.e2e, pytest.mark.llama]

USER = [{"role": "user", "content": "hi"}]


def wait_idle(http: httpx.Client, seconds: float) -> float:
    """Poll /slots until every slot is idle; return how long it took."""
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        if not any(slot["is_processing"] for slot in http.get("/slots").json()):
            return time.monotonic() - started
        time.sleep(0.02)
    raise AssertionError(f"a slot was still busy after {seconds} s")


class TestEndpoints:
    def test_completion(self, http: httpx.Client) -> None:
        """/completion continues a prompt with llama-server's fields."""
        body = http.post(
            "/completion", json={"prompt": "The capital of France is", "n_predict": 8, "temperature": 0}
        ).json()
        assert body["content"]
        assert body["tokens_predicted"] <= 8
        assert body["stop_type"] in ("eos", "limit")
        assert body["timings"]["predicted_n"] == body["tokens_predicted"]

    def test_completion_stream(self, http: httpx.Client) -> None:
        """Streamed /completion chunks end with stop: true."""
        with http.stream(
            "POST", "/completion", json={"prompt": "Hello", "n_predict": 6, "stream": True}
        ) as response:
            events = payloads(response.iter_lines())
        assert events[-1]["stop"] is True
        assert all(not e["stop"] for e in events[:-1])

    def test_tokenize_detokenize(self, http: httpx.Client) -> None:
        """Tokenize and detokenize round-trip."""
        tokens = http.post("/tokenize", json={"content": "Hello world"}).json()["tokens"]
        assert http.post("/detokenize", json={"tokens": tokens}).json() == {"content": "Hello world"}

    def test_apply_template_then_completion_matches_chat(self, http: httpx.Client) -> None:
        """/apply-template's prompt through /completion gives the same greedy text as chat."""
        messages = [{"role": "user", "content": "What is the capital of France?"}]
        prompt = http.post("/apply-template", json={"messages": messages}).json()["prompt"]
        raw = http.post("/completion", json={"prompt": prompt, "n_predict": 16, "temperature": 0}).json()
        chat = http.post(
            "/v1/chat/completions",
            json={"model": "bubo", "messages": messages, "max_tokens": 16, "temperature": 0},
        ).json()
        assert raw["content"] == chat["choices"][0]["message"]["content"]
        assert raw["tokens_evaluated"] == chat["usage"]["prompt_tokens"]

    def test_props_slots_metrics(self, http: httpx.Client) -> None:
        """/props, /slots and /metrics answer, with llama-server's slot fields and metric types."""
        assert http.get("/props").json()["model_alias"] == "bubo"
        slots = http.get("/slots").json()
        assert slots[0]["n_ctx"] == 2048
        # a slot shows its task's fields once it has run one, and none before
        assert all(len({"id_task", "params", "next_token"} & slot.keys()) in (0, 3) for slot in slots)
        metrics = http.get("/metrics").text
        assert "llamacpp:prompt_tokens_total" in metrics
        assert "llamacpp:requests_deferred 0.0" in metrics
        lines = metrics.splitlines()
        assert {"# TYPE llamacpp:n_tokens_max counter", "# TYPE llamacpp:requests_processing gauge"} <= set(
            lines
        )
        assert any(line.startswith("llamacpp:n_tokens_max ") for line in lines)

    def test_latency_histograms(self, http: httpx.Client) -> None:
        """A real streamed request adds one first token, its gaps, one queue wait and one finished request."""

        def counts() -> dict[str, float]:
            families = text_string_to_metric_families(http.get("/metrics").text)
            return {
                sample.name + "".join(f"{{{v}}}" for v in sample.labels.values()): sample.value
                for family in families
                if family.name.startswith("bubo:") and family.type == "histogram"
                for sample in family.samples
                if sample.name.endswith("_count")
            }

        before = counts()
        with http.stream(
            "POST",
            "/completion",
            json={"prompt": "Once upon a time", "n_predict": 8, "ignore_eos": True, "stream": True},
        ) as response:
            events = payloads(response.iter_lines())
        assert events[-1]["tokens_predicted"] == 8
        after = counts()
        added = {name: after[name] - before[name] for name in after}
        assert added == {
            "bubo:time_to_first_token_seconds_count": 1,
            "bubo:inter_token_latency_seconds_count": 7,
            "bubo:queue_wait_seconds_count": 1,
            "bubo:request_duration_seconds_count{finished}": 1,
            "bubo:request_duration_seconds_count{cancelled}": 0,
            "bubo:request_duration_seconds_count{failed}": 0,
        }

    def test_health_and_ready(self, http: httpx.Client) -> None:
        """Health and readiness with their aliases."""
        for path in ("/health", "/v1/health", "/healthz"):
            assert http.get(path).json() == {"status": "ok"}
        for path in ("/ready", "/v1/ready", "/readyz"):
            assert http.get(path).json() == {"status": "ready", "model": "smollm2-135m-instruct-q4-1"}


class TestErrors:
    @pytest.mark.parametrize(
        ("method", "path", "body", "status", "code"),
        [
            ("POST", "/v1/chat/completions", b"{not json", 400, "parse_error"),
            ("POST", "/v1/chat/completions", {"model": "bubo", "messages": USER, "max_tokens": "x"}, 400, "parse_error"),
            ("POST", "/v1/chat/completions", {"messages": USER}, 400, "missing_model"),
            ("POST", "/v1/chat/completions", {"model": "bubo"}, 400, "missing_messages"),
            ("POST", "/v1/chat/completions", {"model": "bubo", "messages": USER, "n": 2}, 400, "unsupported_n"),
            ("POST", "/v1/chat/completions", {"model": "nope", "messages": USER}, 404, "model_not_found"),
            ("POST", "/v1/chat/completions", {"model": "bubo", "messages": [{"role": "user", "content": "w " * 5000}]}, 400, "context_length_exceeded"),
            ("GET", "/no/such/path", None, 404, "not_found"),
            ("POST", "/v1/embeddings", {}, 501, "not_implemented"),
            ("POST", "/infill", {"input_prefix": "a", "input_suffix": "b"}, 501, "not_implemented"),
        ],
    )  # fmt: skip
    def test_error(self, http: httpx.Client, method, path, body, status, code) -> None:
        """Each documented error has its status and code in the reference envelope."""
        if isinstance(body, bytes):
            response = http.request(method, path, content=body)
        else:
            response = http.request(method, path, json=body)
        assert response.status_code == status
        error = response.json()["error"]
        assert error["code"] == code
        assert set(error) >= {"message", "type", "code"}


class TestDisconnect:
    def test_abandoned_stream_frees_the_slot(self, http: httpx.Client, server) -> None:
        """A streaming client that leaves mid-way: the slot is idle long before its 2,000 tokens, and the next is served."""
        body = {
            "model": "bubo",
            "messages": [{"role": "user", "content": "Write a very long story."}],
            "max_tokens": 2000,
            "stream": True,
        }
        with (
            httpx.Client(base_url=server.base_url, timeout=60) as streaming,
            streaming.stream("POST", "/v1/chat/completions", json=body) as response,
        ):
            lines = response.iter_lines()
            received = 0
            for line in lines:
                if line.startswith("data: "):
                    received += 1
                if received == 5:
                    break
            assert any(slot["is_processing"] for slot in http.get("/slots").json())
        assert wait_idle(http, 10.0) < 10.0  # a slot left generating would be busy for a minute or more
        answer = http.post(
            "/v1/chat/completions", json={"model": "bubo", "messages": USER, "max_tokens": 8}
        ).json()
        assert answer["choices"][0]["message"]["content"]


class TestOutputConstraints:
    """llama-server's grammar fields reach llama.cpp: the answer obeys them, a bad grammar is a 400."""

    def test_grammar(self, http: httpx.Client) -> None:
        body = {"prompt": "Is the sky blue? Answer:", "n_predict": 8, "grammar": 'root ::= " yes" | " no"'}
        response = http.post("/completion", json=body)
        assert response.status_code == 200
        assert response.json()["content"] in (" yes", " no")

    def test_json_schema(self, http: httpx.Client) -> None:
        schema = {
            "type": "object",
            "properties": {"sky": {"type": "string", "maxLength": 12}},
            "required": ["sky"],
        }
        body = {
            "prompt": "Describe the sky as JSON:",
            "n_predict": 96,
            "json_schema": schema,
            "temperature": 0,
        }
        answer = json.loads(http.post("/completion", json=body).json()["content"])
        assert set(answer) == {"sky"}
        assert len(answer["sky"]) <= 12

    def test_chat_response_format_schema(self, http: httpx.Client) -> None:
        schema = {"type": "object", "properties": {"blue": {"type": "boolean"}}, "required": ["blue"]}
        body = {
            "model": "bubo",
            "messages": [{"role": "user", "content": "Is the sky blue? Answer in JSON."}],
            "max_tokens": 96,
            "temperature": 0,
            "response_format": {"type": "json_object", "schema": schema},
        }
        content = http.post("/v1/chat/completions", json=body).json()["choices"][0]["message"]["content"]
        assert isinstance(json.loads(content)["blue"], bool)

    def test_a_grammar_llama_cpp_cannot_parse(self, http: httpx.Client) -> None:
        response = http.post("/completion", json={"prompt": "x", "n_predict": 2, "grammar": "root ::= ("})
        assert response.status_code == 400
        assert response.json()["error"]["param"] == "grammar"
