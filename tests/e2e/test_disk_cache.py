"""The prompt cache's disk tier through real ``bubo serve`` processes and the OpenAI SDK.

An agent's first turn on one server, a restart, its second turn on the next
server: the prefix comes back from disk (only the new turn is read), and the
answer is the one a server without any cache gives.  ``GET /cache`` lists the
file, behind the API key like every route.
"""

from __future__ import annotations

import contextlib
import os
import stat
import time
from pathlib import Path

import httpx
import openai
import pytest

from .conftest import Server, serving

pytestmark = [pytest.mark.e2e, pytest.mark.llama]

KEY = "disk-tier-key"
SYSTEM = "You are a terse assistant. " + " ".join(
    f"Rule {n}: answer in one short sentence and never invent a number." for n in range(6)
)


def serving_keyed(tmp_path: Path, name: str, *flags: str) -> contextlib.AbstractContextManager[Server]:
    return serving(tmp_path / f"{name}.log", "--api-key", KEY, "-c", "1024", "-np", "1", *flags, api_key=KEY)


def ask(server: Server, messages: list[dict[str, str]]) -> openai.types.chat.ChatCompletion:
    with openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=KEY, max_retries=0, timeout=120) as client:
        return client.chat.completions.create(model="bubo", messages=messages, max_tokens=8, temperature=0)  # type: ignore[arg-type]


def test_an_agent_turn_after_a_restart_reads_only_its_new_message(tmp_path: Path) -> None:
    """Turn 1, restart, turn 2: the prefix is restored from disk; the answer equals a cold server's."""
    cache_dir = tmp_path / "cache"
    disk = ("--cache-dir", str(cache_dir), "--cache-disk-mib", "64")
    turn1 = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Name a large ocean."}]
    with serving_keyed(tmp_path, "day1", *disk) as server:
        first = ask(server, turn1)
    turn2 = [
        *turn1,
        {"role": "assistant", "content": first.choices[0].message.content or ""},
        {"role": "user", "content": "And a small sea?"},
    ]
    files = list(cache_dir.rglob("*.kvc"))
    assert len(files) == 1
    assert stat.S_IMODE((cache_dir / "prompts").stat().st_mode) == 0o700

    with serving_keyed(tmp_path, "day2", *disk) as server:
        assert httpx.get(f"{server.base_url}/cache", timeout=10).status_code == 401
        listing = httpx.get(
            f"{server.base_url}/cache", headers={"Authorization": f"Bearer {KEY}"}, timeout=10
        )
        assert listing.status_code == 200
        body = listing.json()
        assert body["tiers"]["disk"]["enabled"] is True
        assert body["tiers"]["disk"]["budget_bytes"] == 64 << 20
        assert body["tiers"]["disk"]["n_entries"] == 1
        (entry,) = [e for e in body["entries"] if e["tier"] == "disk"]
        assert entry["n_tokens"] > first.usage.prompt_tokens  # type: ignore[union-attr]
        assert entry["size_bytes"] == files[0].stat().st_size
        restored = ask(server, turn2)

    usage = restored.usage
    assert usage is not None
    cached = usage.prompt_tokens_details.cached_tokens  # type: ignore[union-attr]
    assert cached >= first.usage.prompt_tokens - 1  # type: ignore[union-attr]
    assert usage.model_extra["gufo"]["cache_restored_bytes"] > 0  # type: ignore[index]
    timings = restored.model_extra["timings"]  # type: ignore[index]
    assert timings["prompt_n"] == usage.prompt_tokens - cached  # only the new turn was read
    assert timings["prompt_n"] < usage.prompt_tokens // 3

    with serving_keyed(tmp_path, "cold", "--cache-ram", "0") as server:
        cold = ask(server, turn2)
    assert cold.usage.prompt_tokens_details.cached_tokens == 0  # type: ignore[union-attr]
    assert restored.choices[0].message.content == cold.choices[0].message.content


def test_a_kv_type_change_shares_the_budget_and_leaves_no_directory_behind(tmp_path: Path) -> None:
    """f16, then ``-ctk q8_0``, then f16 again: one budget over both directories, the unused one pruned."""
    cache_dir = tmp_path / "cache"
    prompts = cache_dir / "prompts"
    turn = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Name a large ocean."}]
    with serving_keyed(tmp_path, "f16", "--cache-dir", str(cache_dir), "--cache-disk-mib", "64") as server:
        ask(server, turn)
    (f16,) = prompts.iterdir()
    (f16_file,) = f16.glob("*.kvc")
    f16_bytes = f16_file.stat().st_size

    two_days_ago = time.time() - 2 * 86400
    for path in (f16_file, f16):
        os.utime(path, (two_days_ago, two_days_ago))
    q8 = ("--cache-dir", str(cache_dir), "--cache-disk-mib", "64", "-ctk", "q8_0")
    with serving_keyed(tmp_path, "q8_0", *q8, "--cache-disk-max-age-days", "1") as server:
        assert not f16.exists()  # pruned at start: unused for two days
        ask(server, turn)
    (q8_dir,) = prompts.iterdir()
    (q8_file,) = q8_dir.glob("*.kvc")
    q8_bytes = q8_file.stat().st_size
    assert q8_bytes < f16_bytes

    budget_mib = -(-f16_bytes // (1 << 20))  # the f16 file fits alone, not beside the q8_0 one
    assert f16_bytes + q8_bytes > budget_mib << 20
    with serving_keyed(
        tmp_path, "f16-again", "--cache-dir", str(cache_dir), "--cache-disk-mib", str(budget_mib)
    ) as server:
        ask(server, turn)
    assert not q8_file.exists()  # the tree's least recently used file, though another identity's
    assert len(list(f16.glob("*.kvc"))) == 1  # the f16 identity's directory again, made anew
