"""Speculative decoding with a draft model through a real `bubo serve`: SmolLM2 drafting for itself.

``--draft-policy always`` drafts on every step a request is alone (as llama-server does); a model
drafting for itself never pays on a CPU, and the measured default would not run it.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from .._models import gemma3_path
from .conftest import Server, bubo_command, free_port, serving

pytestmark = [pytest.mark.e2e, pytest.mark.llama]

PROMPT = "<|im_start|>user\nWrite two sentences about the sea.<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(name="drafting_server", scope="module")
def _drafting_server(tmp_path_factory: pytest.TempPathFactory, model_path: Path) -> Iterator[Server]:
    flags = (
        "-c",
        "1024",
        "-np",
        "1",
        "-md",
        str(model_path),
        "--draft-policy",
        "always",
        "--draft-max",
        "12",
    )
    with serving(tmp_path_factory.mktemp("draft") / "serve.log", *flags) as server:
        yield server


@pytest.fixture(name="client")
def _client(drafting_server: Server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=drafting_server.base_url, timeout=600) as client:
        yield client


def complete(client: httpx.Client, **fields: object) -> dict:
    response = client.post(
        "/completion",
        json={"prompt": PROMPT, "n_predict": 32, "temperature": 0, "cache_prompt": False, **fields},
    )
    assert response.status_code == 200, response.text
    return response.json()


def test_drafted_tokens_are_counted_and_change_nothing(client: httpx.Client) -> None:
    plain = complete(client, **{"speculative.n_max": 0})
    drafted = complete(client, **{"speculative.n_max": 8, "speculative.n_min": 1, "speculative.p_min": 0.5})
    assert drafted["content"] == plain["content"]
    assert "draft_n" not in plain["timings"]  # as llama-server: only when drafting ran
    timings = drafted["timings"]
    assert timings["draft_n"] > 0
    assert timings["draft_n_accepted"] == timings["draft_n"]
    settings = drafted["generation_settings"]
    assert (settings["speculative.n_max"], settings["speculative.n_min"], settings["speculative.p_min"]) == (
        8,
        1,
        0.5,
    )


def test_the_defaults_come_from_the_flags(client: httpx.Client) -> None:
    settings = complete(client, n_predict=1)["generation_settings"]
    assert (settings["speculative.n_max"], settings["speculative.n_min"], settings["speculative.p_min"]) == (
        12,
        0,
        0.75,
    )
    more = complete(client, n_predict=1, **{"speculative.n_max": 100, "speculative.n_min": 200})
    assert (
        more["generation_settings"]["speculative.n_max"],
        more["generation_settings"]["speculative.n_min"],
    ) == (12, 12)


def test_slots_and_metrics_report_drafting(client: httpx.Client) -> None:
    complete(client)
    assert client.get("/slots").json()[0]["speculative"] is True
    metrics = client.get("/metrics").text
    accepted = next(
        line
        for line in metrics.splitlines()
        if line.startswith("llamacpp:spec_decode_num_accepted_tokens_total")
    )
    assert float(accepted.split()[-1]) > 0


def test_a_probability_out_of_range_is_a_400_naming_the_field(client: httpx.Client) -> None:
    response = client.post("/completion", json={"prompt": PROMPT, "n_predict": 4, "speculative.p_min": 1.5})
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "speculative.p_min"
    response = client.post("/completion", json={"prompt": PROMPT, "n_predict": 4, "speculative.n_max": "8"})
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "speculative.n_max"


def test_a_draft_model_with_another_vocabulary_stops_the_server_with_the_reason(model_path: Path) -> None:
    port = free_port()
    command = [bubo_command(), "serve", "--port", str(port), "-c", "512", "-md", str(gemma3_path())]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode != 0
    assert "cannot draft for this model" in done.stdout + done.stderr
