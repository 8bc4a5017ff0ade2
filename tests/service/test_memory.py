"""The memory guard's arithmetic and the system reading it relies on."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest

from bubo.engine import ModelInfo
from bubo.engine.fake import fake_model_info
from bubo.errors import InsufficientMemory, InsufficientMemoryPermanent, MemoryPressure
from bubo.model import KV_CACHE_TYPES, KvCacheSize, kv_bytes_per_token
from bubo.service.generation import most_new_tokens
from bubo.service.memory import WORKING_MARGIN_BYTES, MemoryGuard, MemoryReading, SystemMemory

MIB = 1024 * 1024


@attrs.frozen
class Fixed:
    reading: MemoryReading

    def read(self) -> MemoryReading:
        return self.reading


def guard(available_mib: int, limit_mib: int) -> MemoryGuard:
    reading = MemoryReading(available_bytes=available_mib * MIB, limit_bytes=limit_mib * MIB)
    return MemoryGuard(probe=Fixed(reading), kv_bytes_per_token=MIB, step_bytes=0, low_water_bytes=100 * MIB)


class TestGuard:
    def test_need_is_state_per_token_plus_working_memory(self) -> None:
        assert guard(1000, 1000).need_bytes(10) == 10 * MIB + WORKING_MARGIN_BYTES

    def test_admits_what_fits(self) -> None:
        guard(available_mib=500, limit_mib=1000).admit(300)

    def test_low_water_comes_before_the_request_size(self) -> None:
        with pytest.raises(MemoryPressure) as raised:
            guard(available_mib=50, limit_mib=1000).admit(1)
        assert raised.value.status == 503
        assert raised.value.headers == {"Retry-After": "5"}

    def test_too_big_for_now(self) -> None:
        with pytest.raises(InsufficientMemory) as raised:
            guard(available_mib=200, limit_mib=1000).admit(300)
        assert raised.value.code == "insufficient_memory"
        assert raised.value.headers == {"Retry-After": "5"}

    def test_too_big_for_ever(self) -> None:
        with pytest.raises(InsufficientMemoryPermanent) as raised:
            guard(available_mib=900, limit_mib=1000).admit(2000)
        assert (raised.value.status, raised.value.headers) == (507, {})

    def test_the_answers_log_probabilities_count(self) -> None:
        """What fits as state alone is refused once its log-probabilities are counted, and says so."""
        guard(available_mib=500, limit_mib=1000).admit(300, output_bytes=100 * MIB)
        with pytest.raises(InsufficientMemory):
            guard(available_mib=500, limit_mib=1000).admit(300, output_bytes=300 * MIB)
        with pytest.raises(InsufficientMemoryPermanent) as raised:
            guard(available_mib=500, limit_mib=1000).admit(300, output_bytes=800 * MIB)
        assert "800 MiB of log-probabilities" in raised.value.message
        assert "n_probs" in raised.value.message

    def test_encoding_an_image_counts(self) -> None:
        """The projector's work for an image is counted beside the state; never fitting says remove the image."""
        guard(available_mib=500, limit_mib=1000).admit(300, image_bytes=100 * MIB)
        with pytest.raises(InsufficientMemory):
            guard(available_mib=500, limit_mib=1000).admit(300, image_bytes=300 * MIB)
        with pytest.raises(InsufficientMemoryPermanent) as raised:
            guard(available_mib=500, limit_mib=1000).admit(300, image_bytes=800 * MIB)
        assert "800 MiB to encode an image" in raised.value.message
        assert raised.value.message.endswith("remove the image")
        assert raised.value.headers == {}


class TestMostNewTokens:
    def info(self, *, shift: bool, n_ctx: int = 2048, n_ctx_train: int = 8192) -> ModelInfo:
        return attrs.evolve(fake_model_info(n_ctx), n_ctx_train=n_ctx_train, context_shift=shift)

    def test_the_context_ends_a_generation_without_shift(self) -> None:
        assert most_new_tokens(self.info(shift=False), 48, -1) == 2000
        assert most_new_tokens(self.info(shift=False), 48, 5000) == 2000
        assert most_new_tokens(self.info(shift=False), 48, 16) == 16

    def test_no_limit_under_shift_ends_at_the_training_context(self) -> None:
        """As llama-server caps n_predict -1 (the engine's EndPolicy ends it there)."""
        assert most_new_tokens(self.info(shift=True), 48, -1) == 8192 - 48
        assert most_new_tokens(self.info(shift=True, n_ctx_train=1024), 48, -1) == 1024 - 48

    def test_a_limit_under_shift_is_capped_at_the_training_context(self) -> None:
        assert most_new_tokens(self.info(shift=True), 48, 100_000) == 8192 - 48
        assert most_new_tokens(self.info(shift=True), 48, 5000) == 5000


class TestSystemMemory:
    def write(self, root: Path, relative: str, text: str) -> None:
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)

    def test_meminfo(self, tmp_path: Path) -> None:
        self.write(
            tmp_path, "proc/meminfo", "MemTotal:  8000000 kB\nMemFree: 10 kB\nMemAvailable: 4000000 kB\n"
        )
        assert SystemMemory(tmp_path).read() == MemoryReading(
            available_bytes=4_000_000 * 1024, limit_bytes=8_000_000 * 1024
        )

    def test_a_cgroup_v2_limit_bounds_both(self, tmp_path: Path) -> None:
        self.write(tmp_path, "proc/meminfo", "MemTotal: 8000000 kB\nMemAvailable: 4000000 kB\n")
        self.write(tmp_path, "sys/fs/cgroup/memory.max", f"{2048 * MIB}\n")
        self.write(tmp_path, "sys/fs/cgroup/memory.current", f"{1536 * MIB}\n")
        assert SystemMemory(tmp_path).read() == MemoryReading(
            available_bytes=512 * MIB, limit_bytes=2048 * MIB
        )

    def test_reclaimable_page_cache_is_not_used_memory(self, tmp_path: Path) -> None:
        """memory.current counts the page cache (the mmapped model too); its inactive part is reclaimable."""
        self.write(tmp_path, "proc/meminfo", "MemTotal: 8000000 kB\nMemAvailable: 4000000 kB\n")
        self.write(tmp_path, "sys/fs/cgroup/memory.max", f"{2048 * MIB}\n")
        self.write(tmp_path, "sys/fs/cgroup/memory.current", f"{2000 * MIB}\n")
        self.write(tmp_path, "sys/fs/cgroup/memory.stat", f"anon {500 * MIB}\ninactive_file {1500 * MIB}\n")
        assert SystemMemory(tmp_path).read().available_bytes == 1548 * MIB

    def test_a_cgroup_v1_limit(self, tmp_path: Path) -> None:
        self.write(tmp_path, "proc/meminfo", "MemTotal: 8000000 kB\nMemAvailable: 4000000 kB\n")
        self.write(tmp_path, "sys/fs/cgroup/memory/memory.limit_in_bytes", f"{1024 * MIB}\n")
        self.write(tmp_path, "sys/fs/cgroup/memory/memory.usage_in_bytes", f"{900 * MIB}\n")
        self.write(tmp_path, "sys/fs/cgroup/memory/memory.stat", f"total_inactive_file {100 * MIB}\n")
        assert SystemMemory(tmp_path).read() == MemoryReading(
            available_bytes=224 * MIB, limit_bytes=1024 * MIB
        )

    def test_an_unlimited_cgroup_changes_nothing(self, tmp_path: Path) -> None:
        self.write(tmp_path, "proc/meminfo", "MemTotal: 8000000 kB\nMemAvailable: 4000000 kB\n")
        self.write(tmp_path, "sys/fs/cgroup/memory.max", "max\n")
        assert SystemMemory(tmp_path).read().limit_bytes == 8_000_000 * 1024

    def test_this_machine(self) -> None:
        reading = SystemMemory().read()
        assert 0 < reading.available_bytes <= reading.limit_bytes


SMOLLM2 = {  # SmolLM2-135M's attention shape
    "general.architecture": "llama",
    "llama.block_count": 30,
    "llama.embedding_length": 576,
    "llama.attention.head_count": 9,
    "llama.attention.head_count_kv": 3,
}


class TestKvBytesPerToken:
    def test_grouped_query_attention(self) -> None:
        assert kv_bytes_per_token(SMOLLM2) == 30 * 3 * (64 + 64) * 2  # SmolLM2-135M: 23,040

    def test_explicit_key_and_value_lengths(self) -> None:
        metadata = {
            "general.architecture": "gemma3",
            "gemma3.block_count": 18,
            "gemma3.embedding_length": 640,
            "gemma3.attention.head_count": 4,
            "gemma3.attention.head_count_kv": 1,
            "gemma3.attention.key_length": 256,
            "gemma3.attention.value_length": 256,
        }
        assert kv_bytes_per_token(metadata) == 18 * 1 * 512 * 2

    def test_unknown_is_zero(self) -> None:
        assert kv_bytes_per_token({}) == 0

    @pytest.mark.parametrize(
        ("cache_type", "row_bytes"),
        # one layer's K (or V) row of SmolLM2: 3 heads x 64 values, in ggml's blocks of 32
        [("f32", 768), ("f16", 384), ("bf16", 384), ("q8_0", 204), ("q5_1", 144), ("q5_0", 132),
         ("q4_1", 120), ("q4_0", 108), ("iq4_nl", 108)],
    )  # fmt: skip
    def test_quantized_types_count_their_blocks(self, cache_type: str, row_bytes: int) -> None:
        assert kv_bytes_per_token(SMOLLM2, cache_type, cache_type) == 30 * 2 * row_bytes
        assert set(KV_CACHE_TYPES) == {"f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"}

    def test_a_cache_size_says_what_it_saves_against_f16(self) -> None:
        size = KvCacheSize.of(SMOLLM2, type_k="q8_0", type_v="f16", n_ctx=1024)
        assert (size.bytes, size.f16_bytes) == (1024 * 30 * (204 + 384), 1024 * 30 * 768)
        assert size.saved_bytes == 1024 * 30 * 180
