"""Slot files through real ``bubo serve`` processes: a restart, a tampered file, another model, adapters, the quota.

A slot saved by one server is restored by the next one and its prefix reused;
a file cut short or altered on disk, one saved by a "fine-tune" of the same
base (the default model with one weight byte changed: llama.cpp would load its
state, since the shapes match), and one computed under another LoRA adapter
set are each a 400 naming ``filename``, and the server serves on.  A save past
``--slot-save-max-files`` is a 507.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from bubo.engine._disk_cache import kv_identity

from ..engine._lora import write_lora
from .conftest import Server, bubo_command, free_port, start_server, stop_server

pytestmark = [pytest.mark.e2e, pytest.mark.llama]

PROMPT = "The lighthouse keeper climbed the stairs every evening to trim the wick and polish the lens, and"
GREEDY = {"temperature": 0, "seed": 1}


@contextlib.contextmanager
def serving(log_dir: Path, name: str, slot_dir: Path, *flags: str) -> Iterator[httpx.Client]:
    port = free_port()
    command = [bubo_command(), "serve", "--port", str(port), "-c", "1024", "-np", "1", "--slot-save-path"]
    server: Server = start_server([*command, str(slot_dir), *flags], port, log_dir / f"{name}.log")
    try:
        with httpx.Client(base_url=server.base_url, timeout=120) as http:
            yield http
    finally:
        assert stop_server(server) == 0, server.output()


def complete(http: httpx.Client, prompt: str = PROMPT) -> dict:
    response = http.post("/completion", json={"prompt": prompt, "n_predict": 8, "id_slot": 0, **GREEDY})
    assert response.status_code == 200, response.text
    return dict(response.json())


def save(http: httpx.Client, name: str) -> httpx.Response:
    return http.post("/slots/0?action=save", json={"filename": name})


def restore(http: httpx.Client, name: str) -> httpx.Response:
    return http.post("/slots/0?action=restore", json={"filename": name})


def refused(response: httpx.Response, code: str) -> str:
    """The message of a 400 with *code* naming ``filename``."""
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["code"], error["param"]) == (code, "filename")
    return str(error["message"])


def slot_tokens(http: httpx.Client) -> int:
    return int(http.get("/slots").json()[0]["n_prompt_tokens"])


@pytest.fixture(name="saved")
def _saved(tmp_path: Path) -> tuple[Path, dict, dict]:
    """A slot file a first server saved (the directory, the save's answer, the completion before it)."""
    slot_dir = tmp_path / "slots"
    with serving(tmp_path, "first", slot_dir) as http:
        first = complete(http)
        response = save(http, "keeper.bin")
        assert response.status_code == 200, response.text
    return slot_dir, response.json(), first


def test_a_slot_saved_before_a_restart_is_restored_after_it(tmp_path: Path, saved) -> None:
    """Save, restart, restore: the prefix comes back from the file; a second name past the file quota is 507."""
    slot_dir, answer, first = saved
    assert sorted(p.name for p in slot_dir.iterdir()) == ["keeper.bin", "keeper.bin.bubo.json"]
    with serving(tmp_path, "second", slot_dir, "--slot-save-max-files", "1") as http:
        restored = restore(http, "keeper.bin")
        assert restored.status_code == 200, restored.text
        assert restored.json()["n_restored"] == answer["n_saved"]
        again = complete(http)
        assert again["content"] == first["content"]
        n_prompt = first["timings"]["prompt_n"] + first["timings"]["cache_n"]
        assert again["timings"]["cache_n"] == n_prompt - 1  # all but the last prompt token came from the file
        over = save(http, "another.bin")
        assert over.status_code == 507, over.text
        assert over.json()["error"]["code"] == "slot_quota_exceeded"
        assert save(http, "keeper.bin").status_code == 200  # the same name replaces its file
    assert sorted(p.name for p in slot_dir.iterdir()) == ["keeper.bin", "keeper.bin.bubo.json"]


@pytest.mark.parametrize("spoil", ["truncate", "flip"])
def test_a_tampered_file_is_refused_and_the_server_serves_on(tmp_path: Path, saved, spoil: str) -> None:
    """A state file cut short or with one byte changed is 400 slot_file_corrupt; llama.cpp never reads it."""
    slot_dir, _answer, first = saved
    state = slot_dir / "keeper.bin"
    data = bytearray(state.read_bytes())
    if spoil == "truncate":
        del data[len(data) // 2 :]
    else:
        data[len(data) // 2] ^= 0x01
    state.write_bytes(data)
    with serving(tmp_path, "second", slot_dir) as http:
        refused(restore(http, "keeper.bin"), "slot_file_corrupt")
        assert slot_tokens(http) == 0
        assert http.get("/health").status_code == 200
        assert complete(http)["content"] == first["content"]


def test_a_file_of_another_model_of_the_same_shape_is_refused(
    tmp_path: Path, saved, model_path: Path
) -> None:
    """A "fine-tune" (one weight byte changed, same shapes, which llama.cpp would load) has another fingerprint.

    The byte lies where the prompt cache's sampled identity does not read: the slot record's fingerprint
    covers the whole file.
    """
    slot_dir, _answer, _first = saved
    tuned = tmp_path / "tuned.gguf"
    shutil.copyfile(model_path, tuned)
    with tuned.open("r+b") as file:  # inside the tensor data, between the samples the disk tier reads
        file.seek(tuned.stat().st_size // 8 + (2 << 20))
        byte = file.read(1)
        file.seek(-1, 1)
        file.write(bytes([byte[0] ^ 0x01]))
    assert kv_identity(tuned, {}) == kv_identity(model_path, {})  # the sampled identity cannot tell them
    with serving(tmp_path, "tuned", slot_dir, "-m", str(tuned)) as http:
        message = refused(restore(http, "keeper.bin"), "slot_file_model_mismatch")
        assert "another model" in message
        assert slot_tokens(http) == 0


def test_a_file_computed_under_another_adapter_set_is_refused(tmp_path: Path, model_path: Path) -> None:
    """Saved with the adapter at scale 1: refused while it is at 0.5, restored once it is at 1 again."""
    adapter = write_lora(tmp_path / "style.gguf", model_path)
    slot_dir = tmp_path / "slots"
    with serving(tmp_path, "lora", slot_dir, "--lora", str(adapter)) as http:
        complete(http)
        assert save(http, "styled.bin").status_code == 200
        assert http.post("/lora-adapters", json=[{"id": 0, "scale": 0.5}]).status_code == 200
        message = refused(restore(http, "styled.bin"), "slot_file_adapter_mismatch")
        assert "adapter 0 at 1" in message
        assert http.post("/lora-adapters", json=[{"id": 0, "scale": 1.0}]).status_code == 200
        restored = restore(http, "styled.bin")
        assert restored.status_code == 200, restored.text
