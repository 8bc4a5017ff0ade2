"""The repack probe: a child that crashes or hangs costs the server nothing but repacking.

The faults are real: ``BUBO_PROBE_FAULT`` makes the child that repacks raise
SIGSEGV on itself or never return, as llama.cpp's AMX path does on some CPUs.
"""

from __future__ import annotations

import json
from pathlib import Path

import attrs
import pytest

from bubo.engine import EngineFailure, RepackDecision
from bubo.engine import probe as probe_module
from bubo.engine.llama import LlamaOptions
from bubo.engine.probe import (
    FAULT_VARIABLE,
    Ending,
    ProbeResult,
    VerdictCache,
    decide_repack,
    run_probe,
    verdict_key,
)

from .._llama_options import engine_options

pytestmark = pytest.mark.llama

TIMEOUT_S = 60.0


@pytest.fixture(name="options")
def _options(model_path: Path) -> LlamaOptions:
    return engine_options(model_path=model_path, n_threads=2)


@pytest.fixture(name="cache")
def _cache(tmp_path: Path) -> VerdictCache:
    return VerdictCache(tmp_path / "repack")


def no_probe(*_args: object, **_kwargs: object) -> ProbeResult:
    raise AssertionError("no probe child may run here")


class TestOnThisMachine:
    def test_the_probe_passes_and_repacking_stays_on(self, options, cache) -> None:
        """Nothing crashes here: auto keeps llama.cpp's repacking, and says the probe passed."""
        decision = decide_repack("auto", options, timeout_s=TIMEOUT_S, cache=cache)
        assert decision == RepackDecision(enabled=True, reason="the probe decode with repacking passed")

    def test_a_later_start_reads_the_verdict_instead_of_probing(self, options, cache, monkeypatch) -> None:
        decide_repack("auto", options, timeout_s=TIMEOUT_S, cache=cache)
        monkeypatch.setattr(probe_module, "run_probe", no_probe)
        again = decide_repack("auto", options, timeout_s=TIMEOUT_S, cache=cache)
        assert again.enabled
        assert again.reason == f"the probe decode with repacking passed (verdict cached in {cache.directory})"

    def test_both_children_pass_without_faults(self, options) -> None:
        for repack in (True, False):
            result = run_probe(options, repack=repack, timeout_s=TIMEOUT_S)
            assert result.passed, result.detail
            assert result.detail.startswith("passed in ")


class TestFaultsTurnRepackingOff:
    def test_a_child_killed_by_sigsegv(self, options, cache, monkeypatch, caplog) -> None:
        monkeypatch.setenv(FAULT_VARIABLE, "segv")
        decision = decide_repack("auto", options, timeout_s=TIMEOUT_S, cache=cache)
        assert decision == RepackDecision(
            enabled=False, reason="the probe child with repacking was killed by SIGSEGV"
        )
        warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
        assert warnings == ["weight repacking is off: the probe child with repacking was killed by SIGSEGV"]

    def test_the_crash_verdict_is_kept(self, options, cache, monkeypatch) -> None:
        monkeypatch.setenv(FAULT_VARIABLE, "segv")
        decide_repack("auto", options, timeout_s=TIMEOUT_S, cache=cache)
        monkeypatch.setattr(probe_module, "run_probe", no_probe)
        assert not decide_repack("auto", options, timeout_s=TIMEOUT_S, cache=cache).enabled

    def test_a_child_that_hangs_is_killed_at_the_time_limit(self, options, cache, monkeypatch) -> None:
        monkeypatch.setenv(FAULT_VARIABLE, "hang")
        decision = decide_repack("auto", options, timeout_s=8.0, cache=cache)
        assert decision == RepackDecision(
            enabled=False, reason="the probe child with repacking timed out after 8 s"
        )
        assert not list(cache.directory.glob("*.json"))  # a cold disk is not a bad CPU: probe again

    def test_a_child_stopped_by_a_shutdown_signal_is_no_verdict(self, options, cache, monkeypatch) -> None:
        """SIGTERM from a shutdown (or SIGKILL from the OOM killer) says nothing about the CPU."""
        endings = iter(
            [
                ProbeResult(ending=Ending.STOPPED, detail="was killed by SIGTERM"),
                ProbeResult(ending=Ending.PASSED, detail="passed in 1.0 s"),
            ]
        )
        monkeypatch.setattr(probe_module, "run_probe", lambda *_a, **_k: next(endings))
        assert not decide_repack("auto", options, timeout_s=TIMEOUT_S, cache=cache).enabled
        assert not list(cache.directory.glob("*.json"))

    def test_a_model_that_crashes_even_without_repacking_is_refused(
        self, options, cache, monkeypatch
    ) -> None:
        """A clear error at start beats a server that dies on its first request."""
        crashed = ProbeResult(ending=Ending.CRASHED, detail="was killed by SIGBUS")
        monkeypatch.setattr(probe_module, "run_probe", lambda *_a, **_k: crashed)
        with pytest.raises(EngineFailure, match="crashes on this model and CPU even with repacking off"):
            decide_repack("auto", options, timeout_s=TIMEOUT_S, cache=cache)
        assert not list(cache.directory.glob("*.json"))

    def test_an_uncertain_verdict_is_not_kept(self, options, cache, monkeypatch) -> None:
        """Both children timing out may mean a slow disk, not a bad CPU: probe again next time."""
        slow = ProbeResult(ending=Ending.TIMED_OUT, detail="timed out after 1 s")
        monkeypatch.setattr(probe_module, "run_probe", lambda *_a, **_k: slow)
        assert not decide_repack("auto", options, timeout_s=1, cache=cache).enabled
        assert not list(cache.directory.glob("*.json"))


class TestForcedModes:
    @pytest.mark.parametrize(("mode", "enabled"), [("on", True), ("off", False)])
    def test_never_probe(self, mode, enabled, options, cache, monkeypatch) -> None:
        monkeypatch.setattr(probe_module, "run_probe", no_probe)
        decision = decide_repack(mode, options, timeout_s=TIMEOUT_S, cache=cache)
        assert decision == RepackDecision(enabled=enabled, reason=f"forced {mode} (--repack {mode})")


class TestVerdictCache:
    def test_the_key_follows_the_settings_the_child_loads_with(self, options) -> None:
        assert verdict_key(options) == verdict_key(attrs.evolve(options, n_ctx=4096))  # not probed
        assert verdict_key(options) != verdict_key(attrs.evolve(options, flash_attn="off"))
        assert verdict_key(options) != verdict_key(attrs.evolve(options, n_ubatch=64))

    def test_the_key_follows_the_model_file(self, options, tmp_path) -> None:
        copy = tmp_path / "copy.gguf"
        copy.symlink_to(options.model_path)
        assert verdict_key(attrs.evolve(options, model_path=copy)) == verdict_key(options)  # same file
        other = tmp_path / "other.gguf"
        other.write_bytes(b"GGUF")
        assert verdict_key(attrs.evolve(options, model_path=other)) != verdict_key(options)

    def test_an_unreadable_entry_is_no_verdict(self, cache) -> None:
        cache.directory.mkdir(parents=True)
        (cache.directory / "k.json").write_text("{not json")
        (cache.directory / "j.json").write_text(json.dumps({"enabled": True}))
        assert cache.load("k") is None
        assert cache.load("j") is None
        assert cache.load("missing") is None

    def test_an_unwritable_directory_costs_only_the_cache(self, tmp_path) -> None:
        blocker = tmp_path / "file"
        blocker.write_text("")
        cache = VerdictCache(blocker / "repack")  # a directory under a file cannot exist
        cache.store("k", RepackDecision(enabled=True, reason="r"), cpu="cpu")
        assert cache.load("k") is None
