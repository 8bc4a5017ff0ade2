"""The slot directory's store: atomic commits, records, checksums, pinned reads, the quota, the sweep."""

from __future__ import annotations

import hashlib
import json
import os
import time

import pytest

from bubo.engine._disk_cache import kv_identity
from bubo.errors import InvalidRequest
from bubo.service.slot_store import (
    STALE_TEMPORARY_S,
    SlotFileStore,
    SlotQuotaExceeded,
    SlotRecord,
    model_fingerprint,
)

FINGERPRINT = "a" * 64


@pytest.fixture(name="store")
def _store(tmp_path) -> SlotFileStore:
    store = SlotFileStore(
        directory=tmp_path / "slots", max_bytes=1 << 20, max_files=4, fingerprint=FINGERPRINT
    )
    store.open()
    return store


def save(store: SlotFileStore, name: str, data: bytes, *, adapters=()) -> SlotRecord:
    """What the service does around the engine's write: a temporary file, then the commit."""
    written = store.temporary()
    written.write_bytes(data)
    return store.commit(
        name, written, fingerprint=FINGERPRINT, model="test 1M", adapters=adapters, n_tokens=3
    )


def names(store: SlotFileStore) -> list[str]:
    return sorted(path.name for path in store.directory.iterdir())


class TestCommit:
    def test_the_state_and_its_record_take_the_name(self, store) -> None:
        """A commit renames the written state into place, writes its record, and leaves no temporary file."""
        record = save(store, "fox.bin", b"state bytes", adapters=((0, 0.5),))
        assert names(store) == ["fox.bin", "fox.bin.bubo.json"]
        assert store.path("fox.bin").read_bytes() == b"state bytes"
        assert record == SlotRecord(
            fingerprint=FINGERPRINT,
            model="test 1M",
            adapters=((0, 0.5),),
            n_tokens=3,
            size_bytes=11,
            sha256=hashlib.sha256(b"state bytes").hexdigest(),
        )
        assert store.read_record("fox.bin") == record
        assert oct(store.record_path("fox.bin").stat().st_mode & 0o777) == oct(0o600)
        assert oct(store.path("fox.bin").stat().st_mode & 0o777) == oct(0o600)
        assert oct(store.directory.stat().st_mode & 0o777) == oct(0o700)

    def test_a_second_save_replaces_both(self, store) -> None:
        save(store, "fox.bin", b"first")
        record = save(store, "fox.bin", b"second state")
        assert names(store) == ["fox.bin", "fox.bin.bubo.json"]
        assert store.read_record("fox.bin") == record
        store.verify(store.path("fox.bin"), record, name="fox.bin")

    def test_record_round_trip(self) -> None:
        record = SlotRecord(
            fingerprint=FINGERPRINT,
            model="m",
            adapters=((1, 2.0),),
            n_tokens=5,
            size_bytes=7,
            sha256="0" * 64,
        )
        assert SlotRecord.from_json(record.to_json()) == record

    @pytest.mark.parametrize(
        "change",
        [
            {"format": None},
            {"version": 1},
            {"fingerprint": None},
            {"n_tokens": -1},
            {"n_tokens": True},
            {"size_bytes": "7"},
            {"adapters": [[0, "x"]]},
            {"adapters": [[-1, 1.0]]},
            {"adapters": None},
        ],
    )
    def test_records_of_another_format_are_refused(self, change) -> None:
        """Bubo's first records (no format, no checksum) and malformed ones are not records."""
        record = SlotRecord(
            fingerprint=FINGERPRINT, model="m", adapters=(), n_tokens=5, size_bytes=7, sha256="0" * 64
        )
        value = {**json.loads(record.to_json()), **change}
        with pytest.raises((ValueError, TypeError), match=r"."):
            SlotRecord.from_json(json.dumps(value))
        for text in ("[]", '{"model": {}, "n_tokens": 2}'):
            with pytest.raises((ValueError, TypeError), match=r"."):
                SlotRecord.from_json(text)


class TestRead:
    def test_missing_file(self, store) -> None:
        with pytest.raises(InvalidRequest) as raised:
            store.read_record("none.bin")
        assert (raised.value.code, raised.value.param) == ("invalid_request", "filename")

    def test_missing_or_broken_record(self, store) -> None:
        """A state without its record (a crash between the renames, a foreign file) is slot_file_invalid."""
        store.path("fox.bin").write_bytes(b"x")
        with pytest.raises(InvalidRequest) as raised:
            store.read_record("fox.bin")
        assert raised.value.code == "slot_file_invalid"
        store.record_path("fox.bin").write_text("{not json")
        with pytest.raises(InvalidRequest) as raised:
            store.read_record("fox.bin")
        assert raised.value.code == "slot_file_invalid"

    @pytest.mark.parametrize("spoiled", [b"state byte", b"state bytes!", b"State bytes"])
    def test_verify_refuses_other_bytes(self, store, spoiled) -> None:
        """Cut short, grown or altered: the size or the checksum differs, slot_file_corrupt."""
        record = save(store, "fox.bin", b"state bytes")
        store.path("fox.bin").write_bytes(spoiled)
        with pytest.raises(InvalidRequest) as raised:
            store.verify(store.path("fox.bin"), record, name="fox.bin")
        assert (raised.value.code, raised.value.param) == ("slot_file_corrupt", "filename")

    def test_a_pinned_file_keeps_the_bytes_that_were_checked(self, store) -> None:
        """A save of the same name after the pin renames a new file onto it; the link keeps the old one."""
        record = save(store, "fox.bin", b"first state")
        link = store.pin("fox.bin")
        assert link.name == "fox.bin"
        assert link.parent != store.directory
        save(store, "fox.bin", b"another model's state")
        store.verify(link, record, name="fox.bin")
        assert link.read_bytes() == b"first state"
        store.unpin(link)
        assert names(store) == ["fox.bin", "fox.bin.bubo.json"]

    def test_pin_of_a_vanished_file(self, store) -> None:
        with pytest.raises(InvalidRequest) as raised:
            store.pin("none.bin")
        assert raised.value.param == "filename"
        assert names(store) == []


class TestQuota:
    def test_usage_counts_slot_files_and_every_byte(self, store) -> None:
        """Files: slot files only; bytes: theirs, their records' and temporary files'."""
        save(store, "a.bin", b"12345")
        store.temporary().write_bytes(b"123")
        usage = store.usage()
        assert usage.n_files == 1
        assert usage.n_bytes == 5 + store.record_path("a.bin").stat().st_size + 3
        assert store.usage(leaving="a.bin").n_bytes == 3

    def test_file_quota(self, store) -> None:
        """The fifth name of four allowed is refused before anything is written; a kept name is not."""
        for n in range(4):
            save(store, f"{n}.bin", b"x")
        with pytest.raises(SlotQuotaExceeded) as raised:
            store.check_room("new.bin")
        assert (raised.value.status, raised.value.code) == (507, "slot_quota_exceeded")
        store.check_room("0.bin")
        with pytest.raises(SlotQuotaExceeded):
            save(store, "new.bin", b"x")
        assert "new.bin" not in names(store)
        assert not [name for name in names(store) if name.startswith(".")]

    def test_byte_quota_counts_the_written_size(self, store) -> None:
        """A commit whose real size passes the quota deletes what was written and keeps the old file."""
        save(store, "a.bin", b"old")
        with pytest.raises(SlotQuotaExceeded, match="--slot-save-max-mib"):
            save(store, "a.bin", b"x" * (1 << 20))
        assert names(store) == ["a.bin", "a.bin.bubo.json"]
        assert store.path("a.bin").read_bytes() == b"old"

    def test_a_full_directory_refuses_before_writing(self, store) -> None:
        store.path("big").write_bytes(b"x" * (1 << 20))
        with pytest.raises(SlotQuotaExceeded):
            store.check_room("a.bin")


class TestSweep:
    def test_stale_temporary_files_go_fresh_ones_stay(self, store) -> None:
        """open() deletes temporary files and restore links an hour old, not another save's in progress."""
        stale, fresh = store.temporary(), store.temporary()
        stale.write_bytes(b"cut short")
        fresh.write_bytes(b"being written")
        save(store, "kept.bin", b"x")
        link = store.pin("kept.bin")
        old = time.time() - STALE_TEMPORARY_S - 60
        os.utime(stale, (old, old))
        os.utime(link.parent, (old, old))
        store.open()
        assert not stale.exists()
        assert fresh.exists()
        assert not link.parent.exists()
        assert store.path("kept.bin").exists()


class TestModelFingerprint:
    def test_every_byte_of_the_model_counts(self, tmp_path) -> None:
        """Two files that differ in one byte anywhere (a fine-tune of the same shapes) differ."""
        model = tmp_path / "base.gguf"
        data = bytearray(range(256)) * 160_000  # 41 MB
        model.write_bytes(data)
        tuned = tmp_path / "tuned.gguf"
        data[12_000_000] ^= 0x01  # between two of the regions the prompt cache's sampled identity reads
        tuned.write_bytes(data)
        assert kv_identity(model, {}) == kv_identity(tuned, {})
        assert model_fingerprint(model, "kv") != model_fingerprint(tuned, "kv")

    def test_the_settings_count(self, tmp_path) -> None:
        """The same file under other KV settings (another state_identity) is another fingerprint."""
        model = tmp_path / "base.gguf"
        model.write_bytes(b"weights")
        assert model_fingerprint(model, "f16") == model_fingerprint(model, "f16")
        assert model_fingerprint(model, "f16") != model_fingerprint(model, "q8_0")
