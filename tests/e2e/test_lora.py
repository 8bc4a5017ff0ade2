"""LoRA adapters through a real Hypercorn server, the OpenAI SDK and plain HTTP, as llama-server has them."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from ..engine._lora import write_lora
from .conftest import (
    Server,
    bubo_command,
    free_port,
    hypercorn_command,
    openai_client,
    serving,
)

pytestmark = [pytest.mark.e2e, pytest.mark.llama]

QUESTION = [{"role": "user", "content": "Name a red fruit."}]


@pytest.fixture(name="adapter", scope="module")
def _adapter(tmp_path_factory: pytest.TempPathFactory, model_path: Path) -> Path:
    return write_lora(tmp_path_factory.mktemp("lora") / "fruit.gguf", model_path)


@pytest.fixture(name="lora_server", scope="module")
def _lora_server(tmp_path_factory: pytest.TempPathFactory, adapter: Path) -> Iterator[Server]:
    """Hypercorn with the adapter loaded at scale 0 (``--lora-init-without-apply`` as variables)."""
    log = tmp_path_factory.mktemp("lora-server") / "hypercorn.log"
    env = {"BUBO_LORA": str(adapter), "BUBO_LORA_INIT_WITHOUT_APPLY": "on", "BUBO_PARALLEL": "2"}
    with serving(log, env=env, command=hypercorn_command) as server:
        yield server


def ask(server: Server, **extra: object) -> str:
    with contextlib.closing(openai_client(server)) as client:
        completion = client.chat.completions.create(
            model="bubo", messages=QUESTION, max_tokens=12, temperature=0, extra_body=extra or None
        )
    return completion.choices[0].message.content or ""


def test_the_sdk_switches_adapters_per_request_and_globally(lora_server: Server, adapter: Path) -> None:
    base = ask(lora_server)
    adapted = ask(lora_server, lora=[{"id": 0, "scale": 1.0}])
    assert adapted != base
    assert ask(lora_server, lora=[{"id": 0, "scale": 1.0}]) == adapted
    with httpx.Client(base_url=lora_server.base_url, timeout=60) as http:
        assert http.get("/lora-adapters").json() == [{"id": 0, "path": str(adapter), "scale": 0.0}]
        assert http.post("/lora-adapters", json=[{"id": 0, "scale": 1.0}]).json() == {"success": True}
        try:
            assert ask(lora_server) == adapted  # the global scale now applies it
            assert ask(lora_server, lora=[]) == base  # a request's own list overrides it
            props = http.get("/props").json()
            assert props["default_generation_settings"]["params"]["lora"] == [{"id": 0, "scale": 1.0}]
            slots = http.get("/slots").json()
            assert [{"id": 0, "scale": 0.0}] in [slot["params"]["lora"] for slot in slots]
            refused = http.post("/lora-adapters", json=[{"id": 1, "scale": 1.0}])
            assert refused.status_code == 400
            assert refused.json()["error"]["param"] == "[0].id"
            completion = http.post(
                "/completion", json={"prompt": "Hello", "n_predict": 2, "lora": [{"id": 3, "scale": 1}]}
            )
            assert completion.status_code == 400
            assert completion.json()["error"]["param"] == "lora[0].id"
        finally:
            http.post("/lora-adapters", json=[{"id": 0, "scale": 0.0}])


def test_an_adapter_for_another_model_stops_the_start_with_its_reason(
    tmp_path: Path, model_path: Path
) -> None:
    bad = write_lora(tmp_path / "other.gguf", model_path, edit=lambda name, data: data[:, :-1])
    command = [bubo_command(), "serve", "--port", str(free_port()), "--lora", str(bad)]
    finished = subprocess.run(command, capture_output=True, timeout=120, check=False)
    output = finished.stdout.decode(errors="replace") + finished.stderr.decode(errors="replace")
    assert finished.returncode == 1, output
    assert "do not fit the model's" in output
    assert "Traceback" not in output
