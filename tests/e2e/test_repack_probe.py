"""`bubo serve` on a CPU where repacked weights crash llama.cpp: it serves anyway, with repacking off.

The probe child really dies (SIGSEGV raised on itself) or really hangs, through
the test-only ``BUBO_PROBE_FAULT`` hook; everything else is the real server.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import httpx
import pytest

from .conftest import Server, openai_client, serving

pytestmark = [pytest.mark.e2e, pytest.mark.llama]


def serve(
    log: Path, cache_dir: Path, env: dict[str, str], *flags: str
) -> contextlib.AbstractContextManager[Server]:
    return serving(log, "--cache-dir", str(cache_dir), "-c", "1024", *flags, env=env)


def assert_serves_with_repacking_off(server: Server, reason: str) -> None:
    info = httpx.get(f"{server.base_url}/props", timeout=10).json()["model_info"]
    assert info["repack"] is False
    assert info["repack_reason"].startswith(reason)
    with openai_client(server) as client:
        answer = client.chat.completions.create(
            model="bubo",
            messages=[{"role": "user", "content": "What is the capital of France?"}],
            max_tokens=8,
            temperature=0,
        )
    assert answer.choices[0].message.content


@pytest.mark.parametrize(
    ("fault", "extra_env", "reason"),
    [
        ("segv", {}, "the probe child with repacking was killed by SIGSEGV"),
        ("hang", {"BUBO_REPACK_PROBE_TIMEOUT": "5"}, "the probe child with repacking timed out after 5 s"),
    ],
)
def test_a_crashing_or_hanging_probe_means_serving_without_repacking(
    fault: str, extra_env: dict[str, str], reason: str, tmp_path: Path
) -> None:
    with serve(
        tmp_path / "serve.log", tmp_path / "cache", {"BUBO_PROBE_FAULT": fault, **extra_env}
    ) as server:
        assert_serves_with_repacking_off(server, reason)
    warnings = [line for line in server.output().splitlines() if "WARNING" in line and "repacking" in line]
    assert len(warnings) == 1
    assert warnings[0].endswith(f"weight repacking is off: {reason}")
    assert f"weight repacking off: {reason})" in server.output()  # the start-up line


def test_the_next_start_reads_the_verdict(tmp_path: Path) -> None:
    """The second start pays no probe: the kept verdict says off, even with the fault hook gone."""
    cache_dir = tmp_path / "cache"
    with serve(tmp_path / "first.log", cache_dir, {"BUBO_PROBE_FAULT": "segv"}):
        pass
    with serve(tmp_path / "second.log", cache_dir, {}) as second:
        assert_serves_with_repacking_off(second, "the probe child with repacking was killed by SIGSEGV")
    assert "repack probe:" not in second.output()
    assert f"(verdict cached in {cache_dir / 'repack'})" in second.output()


def test_no_repack_flag_skips_the_probe(tmp_path: Path) -> None:
    """llama-server's -nr is accepted: repacking off, no probe child."""
    with serve(tmp_path / "serve.log", tmp_path, {"BUBO_PROBE_FAULT": "segv"}, "-nr") as server:
        assert_serves_with_repacking_off(server, "forced off (--repack off)")
    assert "repack probe:" not in server.output()
