"""Decide whether llama.cpp may repack the weights on this CPU, without betting the server on it.

llama.cpp's CPU backend can move weights into "extra buffer types" (AMX tiles,
CPU_REPACK layouts) that speed up prefill.  On some CPUs and builds the first
decode with repacked weights dies with SIGSEGV, and a native crash takes the
whole server down without a word.  So, in ``auto`` mode, a child process loads
the model with repacking on and decodes a prompt and one token with the
server's own threads, batch sizes, flash attention and GPU layers (in a small
context: the probe needs 65 tokens).  A child killed by a signal, timing out or
failing means repacking goes off; a second probe with it off then tells a model
that crashes llama.cpp anyway (refused with a clear error) from one that only
crashes when repacked.  A verdict that blames repacking (its child crashed or
failed, the other passed) is kept in the user's cache directory, keyed by CPU,
llama.cpp build, model file and context settings, so later starts do not pay
for the probe; after a time-out or a stray signal the next start probes again.
"""

from __future__ import annotations

import contextlib
import enum
import hashlib
import json
import logging
import os
import platform
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import attrs
import llama_cpp

from bubo.domain.modes import RepackMode

from .errors import EngineFailure
from .llama import LlamaOptions
from .values import RepackDecision

__all__ = [
    "FAULT_VARIABLE",
    "Ending",
    "ProbeResult",
    "VerdictCache",
    "decide_repack",
    "probe_payload",
    "run_probe",
    "verdict_key",
]

logger = logging.getLogger(__name__)

# Test-only: "segv" or "hang" makes a probe child that repacks fault that way (see _probe_child).
FAULT_VARIABLE = "BUBO_PROBE_FAULT"
PROBE_CONTEXT = 256  # tokens: the probe decodes at most 65, and a small KV keeps the child light
VERDICT_VERSION = 1  # bump when the probe changes what it checks


class Ending(enum.Enum):
    """How a probe child ended."""

    PASSED = "passed"
    CRASHED = "crashed"  # a native crash: SIGSEGV, SIGBUS, SIGILL, SIGFPE or SIGABRT
    FAILED = "failed"  # exited with an error (llama.cpp refused the load, logits not finite, …)
    STOPPED = "stopped"  # another signal (a shutdown, the OOM killer): says nothing of the CPU
    TIMED_OUT = "timed out"  # a slow disk or a hang: says nothing certain either


# signals a native crash ends with (SIGABRT: llama.cpp's GGML_ASSERT)
_CRASH_SIGNALS = frozenset({signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE, signal.SIGABRT})


@attrs.frozen(kw_only=True)
class ProbeResult:
    """How a probe child ended, and a phrase for the log (e.g. "was killed by SIGSEGV")."""

    ending: Ending
    detail: str

    @property
    def passed(self) -> bool:
        """Whether the child loaded and decoded."""
        return self.ending is Ending.PASSED


def probe_payload(options: LlamaOptions, *, repack: bool) -> dict[str, Any]:
    """What the child needs to load the model as the server will (JSON-ready)."""
    return {
        "model_path": str(options.model_path),
        "n_threads": options.n_threads,
        "n_threads_batch": options.n_threads_batch,
        "n_batch": options.n_batch,
        "n_ubatch": options.n_ubatch,
        "flash_attn": options.flash_attn,
        "cache_type_k": options.cache_type_k,
        "cache_type_v": options.cache_type_v,
        "n_gpu_layers": options.n_gpu_layers,
        "use_mmap": options.use_mmap,
        "repack": repack,
    }


def run_probe(options: LlamaOptions, *, repack: bool, timeout_s: float) -> ProbeResult:
    """Load and decode in a child process, bounded by *timeout_s*; blocking."""
    started = time.perf_counter()
    try:
        completed = subprocess.run(  # our own interpreter and module, no shell
            [sys.executable, "-m", "bubo.engine._probe_child"],
            input=json.dumps(probe_payload(options, repack=repack)),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
            start_new_session=True,  # a Ctrl-C at the terminal is the server's to handle, not the probe's
        )
    except subprocess.TimeoutExpired:  # subprocess.run killed the child
        return ProbeResult(ending=Ending.TIMED_OUT, detail=f"timed out after {timeout_s:g} s")
    elapsed = time.perf_counter() - started
    status = completed.returncode
    if status == 0:
        return ProbeResult(ending=Ending.PASSED, detail=f"passed in {elapsed:.1f} s")
    if status < 0:
        ending = Ending.CRASHED if -status in _CRASH_SIGNALS else Ending.STOPPED
        return ProbeResult(ending=ending, detail=f"was killed by {_signal_name(-status)}")
    last_line = next((line for line in reversed(completed.stderr.splitlines()) if line.strip()), "")
    return ProbeResult(ending=Ending.FAILED, detail=f"exited with status {status}: {last_line}")


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def verdict_key(options: LlamaOptions) -> str:
    """What a verdict depends on: the CPU, the llama.cpp build, the model file and the context settings."""
    model = Path(options.model_path).resolve()
    stat = model.stat()
    identity = {
        "version": VERDICT_VERSION,
        "cpu": _cpu_identity(),
        "llama_cpp": _build_identity(),
        "model": [str(model), stat.st_size, stat.st_mtime_ns],
        "settings": {k: v for k, v in probe_payload(options, repack=True).items() if k != "model_path"},
    }
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:32]


def _build_identity() -> list[Any]:
    """The binding's version and its native libraries' sizes and times: a rebuild is another build.

    Read from the files, not by calling into llama.cpp: nothing native runs here before the probe.
    """
    libraries = Path(llama_cpp.__file__).parent / "lib"
    files = sorted(p for p in libraries.glob("*") if p.is_file()) if libraries.is_dir() else []
    return [llama_cpp.__version__, [[p.name, p.stat().st_size, p.stat().st_mtime_ns] for p in files]]


def _cpu_identity() -> str:
    """The CPU's model and feature flags (Linux: the first processor of /proc/cpuinfo)."""
    wanted = ("vendor_id", "model name", "flags", "features", "cpu implementer", "cpu part", "isa")
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return f"{platform.machine()} {platform.processor()}"
    first = text.split("\n\n", 1)[0]
    lines = [line for line in first.splitlines() if line.split(":", 1)[0].strip().lower() in wanted]
    return "\n".join(lines) or f"{platform.machine()} {platform.processor()}"


@attrs.frozen
class VerdictCache:
    """Probe verdicts, one small JSON file each, in *directory* (``rm -r`` it to probe again)."""

    directory: Path

    def load(self, key: str) -> RepackDecision | None:
        """The verdict kept for *key*, if any (an unreadable file counts as none)."""
        try:
            data = json.loads((self.directory / f"{key}.json").read_text(encoding="utf-8"))
            return RepackDecision(enabled=bool(data["enabled"]), reason=str(data["reason"]))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def store(self, key: str, decision: RepackDecision, cpu: str) -> None:
        """Keep *decision* for *key*; a directory we cannot write only costs the next start a probe."""
        record = {"enabled": decision.enabled, "reason": decision.reason, "cpu": cpu, "time": time.time()}
        path = self.directory / f"{key}.json"
        partial = path.with_suffix(f".{os.getpid()}.tmp")
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            partial.write_text(json.dumps(record), encoding="utf-8")
            partial.replace(path)  # atomic: a concurrent start reads the old file or the new one
        except OSError as error:
            logger.debug("cannot keep the repack verdict in %s: %s", self.directory, error)
            with contextlib.suppress(OSError):
                partial.unlink()


def decide_repack(
    mode: RepackMode, options: LlamaOptions, *, timeout_s: float, cache: VerdictCache | None
) -> RepackDecision:
    """Repacking on or off for *mode* (``auto``, ``on``, ``off``); ``auto`` probes, or reads the cache.

    Blocking (a probe takes seconds): call it from the loading thread.

    Raises:
        EngineFailure: the model crashes llama.cpp on this CPU even with repacking off.

    """
    if mode != "auto":
        return RepackDecision(enabled=mode == "on", reason=f"forced {mode} (--repack {mode})")
    key = verdict_key(options)
    if cache is not None and (kept := cache.load(key)) is not None:
        decision = attrs.evolve(kept, reason=f"{kept.reason} (verdict cached in {cache.directory})")
        _report(decision)
        return decision
    decision, definite = _probe(options, timeout_s)
    if cache is not None and definite:
        cache.store(key, decision, _cpu_identity())
    _report(decision)
    return decision


def _probe(options: LlamaOptions, timeout_s: float) -> tuple[RepackDecision, bool]:
    """The decision, and whether it is definite enough to keep."""
    repacked = run_probe(options, repack=True, timeout_s=timeout_s)
    logger.info("repack probe: the child with repacking on %s", repacked.detail)
    if repacked.passed:
        return RepackDecision(enabled=True, reason="the probe decode with repacking passed"), True
    plain = run_probe(options, repack=False, timeout_s=timeout_s)
    logger.info("repack probe: the child with repacking off %s", plain.detail)
    if plain.ending is Ending.CRASHED:
        raise EngineFailure(
            f"llama.cpp crashes on this model and CPU even with repacking off: the probe child "
            f"{plain.detail} (with repacking on it {repacked.detail})"
        )
    # kept only when repacking itself is to blame: a time-out or a shutdown's signal says nothing certain
    definite = plain.passed and repacked.ending in (Ending.CRASHED, Ending.FAILED)
    return RepackDecision(enabled=False, reason=f"the probe child with repacking {repacked.detail}"), definite


def _report(decision: RepackDecision) -> None:
    if not decision.enabled:
        logger.warning("weight repacking is off: %s", decision.reason)
