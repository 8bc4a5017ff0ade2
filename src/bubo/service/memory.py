"""The memory guard: refuse a generation the machine has no memory for, before it starts.

It also admits a request's working memory before heavy work on it starts
(parsing a large body, rendering and tokenizing its prompt: see
:mod:`bubo.service.work`), counting what the jobs already running hold.

A request's need is estimated from the model: the KV state of its tokens
(prompt and new tokens, at the model's bytes per token: what the host-RAM
snapshot of the conversation holds once it leaves the slot; the slot's own KV
cache is allocated with the context, at load) plus the working buffers of one
decode step (logits for every drafted position), a fixed margin, and the
log-probabilities its answer may carry (``n_probs`` alternatives for every
token it may generate: a non-streaming answer holds them all until it is sent).  What the machine
can give is read from the system: ``MemAvailable`` in ``/proc/meminfo``,
bounded by a cgroup memory limit when the process runs under one (containers),
whose usage counts only what cannot be reclaimed.

- need > what the machine could ever give (total RAM or the cgroup limit)
  → 507 ``insufficient_memory_permanent`` (no ``Retry-After``: retrying cannot help);
- available < the low-water mark → 503 ``memory_pressure``;
- need > available → 503 ``insufficient_memory``; both 503s carry ``Retry-After: 5``.

Tests inject a :class:`MemoryProbe`; nothing here exhausts the machine.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

import attrs

from bubo.errors import InsufficientMemory, InsufficientMemoryPermanent, MemoryPressure

__all__ = ["MemoryGuard", "MemoryProbe", "MemoryReading", "SystemMemory"]

MIB = 1024 * 1024
# Per generation, besides the KV state and logits: sampler, token lists, response text.
WORKING_MARGIN_BYTES = 16 * MIB


@attrs.frozen(kw_only=True)
class MemoryReading:
    """What the machine can give now, and at most."""

    available_bytes: int
    limit_bytes: int


class MemoryProbe(Protocol):
    """Reads the memory the process may still use."""

    def read(self) -> MemoryReading:
        """The current reading."""
        ...


@attrs.frozen
class SystemMemory:
    """``/proc/meminfo``, bounded by the cgroup (v2, else v1) limit when there is one."""

    root: Path = Path("/")

    def read(self) -> MemoryReading:
        """MemAvailable and MemTotal, each at most what the cgroup still allows."""
        meminfo = self._meminfo()
        available, total = meminfo.get("MemAvailable", 0), meminfo.get("MemTotal", 0)
        limit, usage = self._cgroup()
        if limit is not None:
            total = min(total, limit) if total else limit
            if usage is not None:
                available = min(available, max(0, limit - usage)) if available else max(0, limit - usage)
        return MemoryReading(available_bytes=available, limit_bytes=total)

    def _meminfo(self) -> dict[str, int]:
        values: dict[str, int] = {}
        try:
            lines = (self.root / "proc/meminfo").read_text().splitlines()
        except OSError:
            return values
        for line in lines:
            name, _, rest = line.partition(":")
            fields = rest.split()
            if fields and fields[0].isdigit():
                values[name] = int(fields[0]) * (1024 if fields[1:] == ["kB"] else 1)
        return values

    def _cgroup(self) -> tuple[int | None, int | None]:
        """The cgroup's limit and the part of its usage that cannot be reclaimed.

        Usage counts the page cache, the mmapped model file included; its
        inactive part is reclaimed under pressure (as the kernel and
        ``docker stats`` reckon it), so it is not counted as used.
        """
        for directory, limit_file, usage_file, inactive_key in (
            ("sys/fs/cgroup", "memory.max", "memory.current", "inactive_file"),
            ("sys/fs/cgroup/memory", "memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file"),
        ):
            limit = _read_int(self.root / directory / limit_file)
            if limit is not None and limit < 1 << 60:  # v1 writes a huge number for "no limit"
                usage = _read_int(self.root / directory / usage_file)
                if usage is not None:
                    usage = max(0, usage - self._stat(self.root / directory / "memory.stat", inactive_key))
                return limit, usage
        return None, None

    @staticmethod
    def _stat(path: Path, key: str) -> int:
        try:
            lines = path.read_text().splitlines()
        except OSError:
            return 0
        for line in lines:
            name, _, value = line.partition(" ")
            if name == key and value.strip().isdigit():
                return int(value)
        return 0


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # "max": no limit


@attrs.frozen(kw_only=True)
class MemoryGuard:
    """Admits a generation of ``n_tokens`` or raises the error that says why not."""

    probe: MemoryProbe
    kv_bytes_per_token: int
    step_bytes: int  # logits and buffers of one decode step
    low_water_bytes: int

    def need_bytes(self, n_tokens: int) -> int:
        """The estimated memory one generation of *n_tokens* (prompt and output) needs."""
        return n_tokens * self.kv_bytes_per_token + self.step_bytes + WORKING_MARGIN_BYTES

    def admit(self, n_tokens: int, *, output_bytes: int = 0, image_bytes: int = 0) -> None:
        """Check a generation of *n_tokens* against what the machine can give.

        *output_bytes* is what its answer may hold besides the text (its
        log-probabilities); *image_bytes* what encoding its images needs (the
        projector's working memory: one image is encoded at a time).

        Raises:
            InsufficientMemoryPermanent: it needs more than the machine could ever give.
            MemoryPressure: available memory is below the low-water mark.
            InsufficientMemory: it needs more than is available now.

        """
        parts = [f"{n_tokens} tokens of state"]
        advice = ["shorten the prompt or max_tokens"]
        if output_bytes:
            parts.append(f"{_mib(output_bytes)} MiB of log-probabilities")
            advice.append("ask for fewer n_probs")
        if image_bytes:
            parts.append(f"{_mib(image_bytes)} MiB to encode an image")
            advice.append("remove the image")
        self._check(
            self.need_bytes(n_tokens) + output_bytes + image_bytes,
            what="(" + ", ".join(parts) + ")",
            advice=", or ".join([", ".join(advice[:-1]), advice[-1]]) if len(advice) > 1 else advice[0],
        )

    def admit_bytes(self, need_bytes: int, *, reserved_bytes: int = 0) -> None:
        """Check a request's working memory (parsing, rendering, tokenizing) before the work starts.

        *reserved_bytes* is what work already running was admitted with and
        may not have allocated yet; it is not available to this request.

        Raises:
            InsufficientMemoryPermanent: it needs more than the machine could ever give.
            MemoryPressure: available memory is below the low-water mark.
            InsufficientMemory: it needs more than is available now.

        """
        self._check(
            need_bytes,
            reserved_bytes=reserved_bytes,
            what="to parse and tokenize",
            advice="send a smaller request",
        )

    def _check(self, need: int, *, what: str, advice: str, reserved_bytes: int = 0) -> None:
        reading = self.probe.read()
        available = max(0, reading.available_bytes - reserved_bytes)
        if reading.limit_bytes and need > reading.limit_bytes:
            raise InsufficientMemoryPermanent(
                f"the request needs about {_mib(need)} MiB {what} but this machine "
                f"can give at most {_mib(reading.limit_bytes)} MiB: {advice}"
            )
        if reading.available_bytes < self.low_water_bytes:
            raise MemoryPressure(
                f"only {_mib(reading.available_bytes)} MiB of memory is available, below the "
                f"{_mib(self.low_water_bytes)} MiB low-water mark: free memory, then retry"
            )
        if need > available:
            raise InsufficientMemory(
                f"the request needs about {_mib(need)} MiB but {_mib(available)} MiB "
                "is available now: free memory, then retry"
            )


def _mib(n_bytes: int) -> int:
    return round(n_bytes / MIB)
