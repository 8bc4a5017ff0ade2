"""Router mode end to end: `bubo serve --models-dir DIR` over two real GGUFs, real child `bubo serve`s.

One router for the module (SmolLM2 and Gemma 3 270M, -c 512 -np 1), one more
for --models-max 1 and shutdown.  Children are found by PID under the router's
(/proc); every wait is bounded.
"""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest

from bubo.config import default_model_path

from .._models import gemma3_path
from .conftest import (
    Server,
    anthropic_client,
    bubo_command,
    free_port,
    openai_client,
    start_server,
    stop_server,
)

pytestmark = [pytest.mark.e2e, pytest.mark.llama]

MODELS = ("gemma3", "smollm2")
WAIT_S = 120  # a child loads its model (seconds on this machine; bounded generously)


def models_dir(folder: Path) -> Path:
    folder.mkdir()
    (folder / "smollm2.gguf").symlink_to(default_model_path())
    (folder / "gemma3.gguf").symlink_to(gemma3_path())
    return folder


def start_router(tmp: Path, *flags: str) -> Server:
    port = free_port()
    command = [bubo_command(), "serve", "--models-dir", str(models_dir(tmp / "models")), "--port", str(port)]
    command += ["-c", "512", "-np", "1", "-t", "1", *flags]
    return start_server(command, port, tmp / "router.log")


@pytest.fixture(name="router", scope="module")
def _router(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = start_router(tmp_path_factory.mktemp("router"))
    yield server
    assert stop_server(server) == 0


def statuses(server: Server) -> dict[str, dict[str, Any]]:
    data = httpx.get(f"{server.base_url}/models", timeout=10).json()["data"]
    return {m["id"]: m["status"] for m in data}


def wait_for(
    server: Server, condition: Callable[[dict[str, dict[str, Any]]], bool]
) -> dict[str, dict[str, Any]]:
    """/models until *condition* holds (bounded)."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        current = statuses(server)
        if condition(current):
            return current
        time.sleep(0.2)
    raise AssertionError(f"/models never reached the state: {statuses(server)}\n{server.output()[-3000:]}")


def children(server: Server) -> dict[str, int]:
    """The router's child processes: model name -> PID (from /proc)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        names = [
            a.removeprefix(b"--served-model-name=") for a in argv if a.startswith(b"--served-model-name=")
        ]
        if parent == server.process.pid and names:
            found[names[0].decode()] = int(entry.name)
    return found


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_models_go_through_unloaded_loading_loaded_unloaded(router: Server) -> None:
    """POST /models/load and /models/unload move a model through llama-server's statuses."""
    assert statuses(router) == {name: {"value": "unloaded"} for name in MODELS}
    loading = httpx.post(f"{router.base_url}/models/load", json={"model": "smollm2"}, timeout=10)
    assert loading.json() == {"success": True}
    loaded = wait_for(router, lambda s: s["smollm2"]["value"] == "loaded")["smollm2"]
    assert "--served-model-name=smollm2" in loaded["args"]
    assert "--ctx-size=512" in loaded["args"]
    pid = children(router)["smollm2"]
    httpx.post(f"{router.base_url}/models/unload", json={"model": "smollm2"}, timeout=10).raise_for_status()
    unloaded = wait_for(router, lambda s: s["smollm2"]["value"] == "unloaded")["smollm2"]
    assert "failed" not in unloaded
    assert gone(pid)


@pytest.mark.parametrize("model", MODELS)
def test_each_model_answers_in_every_dialect_from_its_own_child(router: Server, model: str) -> None:
    """OpenAI chat (plain and streamed), Anthropic messages and /completion reach the named model."""
    with ExitStack() as stack:
        openai = stack.enter_context(openai_client(router))
        anthropic = stack.enter_context(anthropic_client(router))
        messages = [{"role": "user", "content": "Say hi."}]
        chat = openai.chat.completions.create(model=model, messages=messages, max_tokens=4)  # type: ignore[arg-type]
        assert chat.model == model
        stream = openai.chat.completions.create(model=model, messages=messages, max_tokens=4, stream=True)  # type: ignore[arg-type]
        chunks = list(stream)
        assert {c.model for c in chunks} == {model}
        assert chunks[-1].choices[0].finish_reason is not None
        message = anthropic.messages.create(model=model, messages=messages, max_tokens=4)  # type: ignore[arg-type]
        assert message.model == model
    completion = httpx.post(
        f"{router.base_url}/completion", json={"model": model, "prompt": "Hi", "n_predict": 3}, timeout=60
    ).json()
    assert completion["model"] == model
    props = httpx.get(f"{router.base_url}/props", params={"model": model}, timeout=10).json()
    assert props["model_path"].endswith(f"{model}.gguf")
    metrics = httpx.get(f"{router.base_url}/metrics", params={"model": model}, timeout=10)
    assert "llamacpp:prompt_tokens_total" in metrics.text  # each model's own metrics


def test_a_killed_child_marks_its_model_failed_and_the_next_request_reloads_it(router: Server) -> None:
    """SIGKILL: unloaded, failed, exit_code 137 (as llama-server reports it); then a fresh child serves."""
    httpx.post(f"{router.base_url}/models/load", json={"model": "gemma3"}, timeout=10)
    wait_for(router, lambda s: s["gemma3"]["value"] == "loaded")
    pid = children(router)["gemma3"]
    os.kill(pid, signal.SIGKILL)
    failed = wait_for(router, lambda s: s["gemma3"]["value"] == "unloaded")["gemma3"]
    assert (failed["failed"], failed["exit_code"]) == (True, 137)
    answer = httpx.post(
        f"{router.base_url}/v1/chat/completions",
        json={"model": "gemma3", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3},
        timeout=WAIT_S,
    )
    assert answer.status_code == 200
    assert answer.json()["model"] == "gemma3"
    assert statuses(router)["gemma3"]["value"] == "loaded"
    assert children(router)["gemma3"] != pid


def test_models_max_unloads_the_lru_model_and_shutdown_leaves_no_child(tmp_path: Path) -> None:
    """--models-max 1: using gemma3 unloads smollm2; SIGTERM to the router ends every child."""
    router = start_router(tmp_path, "--models-max", "1")
    try:
        for model in ("smollm2", "gemma3"):
            answer = httpx.post(
                f"{router.base_url}/completion",
                json={"model": model, "prompt": "Hi", "n_predict": 2},
                timeout=WAIT_S,
            )
            assert answer.json()["model"] == model
        current = wait_for(router, lambda s: s["smollm2"]["value"] == "unloaded")
        assert current["gemma3"]["value"] == "loaded"
        assert "failed" not in current["smollm2"]
        pids = children(router)
        assert list(pids) == ["gemma3"]
    finally:
        code = stop_server(router)
    assert code == 0
    assert all(gone(pid) for pid in pids.values())


def left(server: Server, request: str) -> None:
    """Wait (bounded) until the access log says the client of *request* (``"POST /path``) left."""
    line = re.compile(rf"^.*{re.escape(request)} 1\.1\" .* client_left$", re.MULTILINE)
    deadline = time.monotonic() + WAIT_S
    while not line.search(server.output()):
        assert time.monotonic() < deadline, f"never logged {request!r} left:\n{server.output()[-3000:]}"
        time.sleep(0.1)


def test_a_client_that_leaves_the_load_queue_costs_the_busy_model_nothing(tmp_path: Path) -> None:
    """llama.cpp's ``test_router_queue_client_disconnect_keeps_model``, with real children.

    --models-max 1, smollm2 busy (a generation held open, as llama-server's fake timing holds its
    /tokenize); a /tokenize for gemma3 queues and its client leaves after 1 s; then the busy request
    ends.  Nobody waits any more: smollm2 stays, the same process, and gemma3 never loads.
    """
    router = start_router(tmp_path, "--models-max", "1", "-c", "2048")
    try:
        httpx.post(f"{router.base_url}/models/load", json={"model": "smollm2"}, timeout=10).raise_for_status()
        wait_for(router, lambda s: s["smollm2"]["value"] == "loaded")
        pid = children(router)["smollm2"]
        busy = {"model": "smollm2", "prompt": "Once", "n_predict": -1, "ignore_eos": True, "stream": True}
        with (
            httpx.Client(base_url=router.base_url, timeout=WAIT_S) as http,
            http.stream("POST", "/completion", json=busy) as generating,
        ):
            lines = generating.iter_lines()  # held: a dropped iterator closes the stream
            assert next(line for line in lines if line.startswith("data: "))
            with pytest.raises(httpx.TimeoutException):
                http.post("/tokenize", json={"model": "gemma3", "content": "hello world"}, timeout=1)
            left(router, '"POST /tokenize')  # the router saw that client leave
        left(router, '"POST /completion')  # and the busy one: its lease is given back
        assert {name: status["value"] for name, status in statuses(router).items()} == {
            "smollm2": "loaded",
            "gemma3": "unloaded",
        }
        assert "reached: unloading" not in router.output()
        answer = httpx.post(
            f"{router.base_url}/tokenize", json={"model": "smollm2", "content": "hi"}, timeout=60
        )
        assert answer.status_code == 200
        assert children(router) == {"smollm2": pid}
    finally:
        assert stop_server(router) == 0


def test_children_stop_when_the_router_is_killed(tmp_path: Path) -> None:
    """SIGKILL gives the router no chance to stop its children: they see its end (their stdin) and stop."""
    router = start_router(tmp_path)
    try:
        httpx.post(f"{router.base_url}/models/load", json={"model": "smollm2"}, timeout=10)
        wait_for(router, lambda s: s["smollm2"]["value"] == "loaded")
        pid = children(router)["smollm2"]
    finally:
        router.process.kill()
        router.process.wait(timeout=10)
    deadline = time.monotonic() + WAIT_S
    while not gone(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    outlived = not gone(pid)
    if outlived:
        os.kill(pid, signal.SIGKILL)  # leave nothing behind, then fail
    assert not outlived, "the child outlived its router"


LLAMA_31 = (
    Path(__file__).parent.parent
    / "fixtures"
    / "llama_cpp_templates"
    / "meta-llama-Llama-3.1-8B-Instruct.jinja"
)


def test_a_preset_file_names_configures_and_preloads_a_model(tmp_path: Path) -> None:
    """--models-preset alone: a model of its own with an alias, tags, flags (a Llama 3.1 template) and
    load-on-startup, loaded within the suite's 60 s, answering under its alias through the OpenAI SDK."""
    preset = tmp_path / "models.ini"
    preset.write_text(
        "version = 1\n[*]\nc = 512\n\n"
        f"[small]\nmodel = {default_model_path()}\nalias = tiny\ntags = local, test\n"
        f"chat-template-file = {LLAMA_31}\nload-on-startup = true\n"
    )
    port = free_port()
    started = time.monotonic()
    router = start_server(
        [bubo_command(), "serve", "--models-preset", str(preset), "--port", str(port), "-np", "1", "-t", "1"],
        port,
        tmp_path / "router.log",
    )
    try:
        loaded = wait_for(router, lambda s: s["small"]["value"] == "loaded")["small"]
        assert time.monotonic() - started < 60  # llama.cpp's router tests wait 60 s for a load
        assert "--served-model-name=small,tiny" in loaded["args"]
        listed = httpx.get(f"{router.base_url}/models", timeout=10).json()["data"][0]
        assert (listed["aliases"], listed["tags"]) == (["tiny"], ["local", "test"])
        props = httpx.get(f"{router.base_url}/props", params={"model": "tiny"}, timeout=10).json()
        assert props["default_generation_settings"]["n_ctx"] == 512
        rendered = httpx.post(
            f"{router.base_url}/apply-template",
            json={"model": "tiny", "messages": [{"role": "user", "content": "Hi"}]},
            timeout=30,
        ).json()["prompt"]
        assert f"Today Date: {time.strftime('%d %b %Y')}" in rendered
        with openai_client(router) as client:
            chat = client.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": "Say hi."}], max_tokens=4
            )
        assert chat.model == "tiny"
        counted = httpx.post(
            f"{router.base_url}/v1/chat/completions/input_tokens",
            json={"model": "tiny", "messages": [{"role": "user", "content": "Say hi."}]},
            timeout=30,
        ).json()
        assert counted["input_tokens"] == chat.usage.prompt_tokens  # type: ignore[union-attr]
    finally:
        assert stop_server(router) == 0


def test_extra_args_load_tuning_flags_and_never_a_file(tmp_path: Path) -> None:
    """--models-allow-extra-args: a template file named in extra_args is a 400 and loads nothing (its
    content never reaches /props); a context within the model's trained one reaches the real child."""
    secret = tmp_path / "secret.jinja"
    secret.write_text("{{ 'the secret in this file' }}")
    router = start_router(tmp_path, "--models-allow-extra-args")
    try:
        refused = httpx.post(
            f"{router.base_url}/models/load",
            json={"model": "smollm2", "extra_args": ["-c", "256", f"--chat-template-file={secret}"]},
            timeout=10,
        )
        assert refused.status_code == 400
        error = refused.json()["error"]
        assert error["param"] == "extra_args[2]"
        assert "--chat-template-file" in error["message"]
        assert statuses(router)["smollm2"] == {"value": "unloaded"}
        loaded = httpx.post(
            f"{router.base_url}/models/load",
            json={"model": "smollm2", "extra_args": ["-c", "256"]},
            timeout=10,
        )
        assert loaded.json() == {"success": True}
        wait_for(router, lambda s: s["smollm2"]["value"] == "loaded")
        props = httpx.get(f"{router.base_url}/props", params={"model": "smollm2"}, timeout=10).json()
        assert props["default_generation_settings"]["n_ctx"] == 256
        assert "the secret in this file" not in props["chat_template"]
    finally:
        assert stop_server(router) == 0
