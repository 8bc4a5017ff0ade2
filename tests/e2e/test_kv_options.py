"""KV cache types, ``--cache-reuse`` and ``--keep`` through a real server, over httpx.

The server quantizes its KV cache to q8_0, moves cached runs of 16 tokens or more after a
changed middle, and keeps 4 prompt tokens at a context shift unless a request says.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from .conftest import Server, bubo_command, free_port, start_server, stop_server

pytestmark = [pytest.mark.e2e, pytest.mark.llama]

HEAD = "<|im_start|>system\nYou are a careful assistant who answers in one short sentence.<|im_end|>\n"
OLD_TURN = "<|im_start|>user\nRemember the number seven.<|im_end|>\n<|im_start|>assistant\nNoted.<|im_end|>\n"
TAIL = (
    "<|im_start|>user\nHere is a list of rivers: the Seine, the Loire, the Rhone, the Garonne, the "
    "Dordogne, the Marne and the Somme. Which of them flows through Paris?<|im_end|>\n<|im_start|>assistant\n"
)


@pytest.fixture(name="http", scope="module")
def _http(tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    port = free_port()
    log: Path = tmp_path_factory.mktemp("kv") / "bubo.log"
    command = [
        *(bubo_command(), "serve", "--port", str(port), "-c", "1024", "-np", "1"),
        *("-ctk", "q8_0", "-ctv", "q8_0", "--cache-reuse", "16", "--keep", "4"),
    ]
    server: Server = start_server(command, port, log)
    try:
        with httpx.Client(base_url=server.base_url, timeout=120) as client:
            yield client
    finally:
        stop_server(server)


def test_props_report_the_quantized_cache_and_what_it_saves(http: httpx.Client) -> None:
    props = http.get("/props").json()
    kv = props["kv_cache"]
    assert (kv["type_k"], kv["type_v"], kv["n_ctx"]) == ("q8_0", "q8_0", 1024)
    assert kv["size_bytes"] == 1024 * 30 * 2 * 204  # SmolLM2: 30 layers, K and V rows of 3 x 64 in q8_0
    assert kv["f16_bytes"] == 1024 * 30 * 2 * 384
    assert kv["saved_bytes"] == kv["f16_bytes"] - kv["size_bytes"]
    assert kv["saved_share"] == pytest.approx(1 - 204 / 384, abs=1e-4)
    assert props["default_generation_settings"]["params"]["n_keep"] == 4


def test_a_dropped_middle_turn_costs_one_evaluated_token(http: httpx.Client) -> None:
    first = http.post(
        "/completion", json={"prompt": HEAD + OLD_TURN + TAIL, "n_predict": 2, "temperature": 0}
    )
    assert first.status_code == 200, first.text
    second = http.post("/completion", json={"prompt": HEAD + TAIL, "n_predict": 8, "temperature": 0})
    assert second.status_code == 200, second.text
    body = second.json()
    assert body["timings"]["prompt_n"] == 1
    assert body["timings"]["cache_n"] == body["tokens_evaluated"] - 1
    assert body["tokens_cached"] == body["tokens_evaluated"] + body["tokens_predicted"]
    assert body["content"].strip()
    assert body["generation_settings"]["n_keep"] == 4  # --keep, as the request set none


def test_a_requests_n_keep_overrides_keep(http: httpx.Client) -> None:
    body = http.post("/completion", json={"prompt": "Hello", "n_predict": 1, "n_keep": -1}).json()
    assert body["generation_settings"]["n_keep"] == -1
