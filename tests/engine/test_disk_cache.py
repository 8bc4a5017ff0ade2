"""The prompt cache's disk tier on its own: files, checks, budget, the writer thread (no model)."""

from __future__ import annotations

import json
import os
import re
import stat
import threading
import time
from pathlib import Path

import pytest

from bubo.engine._disk_cache import MAGIC, STALE_TEMPORARY_S, WRITER_THREAD_NAME, DiskTier, kv_identity

IDENTITY = "a" * 64
OTHER = "b" * 64
MIB = 1 << 20


DAY = 86400.0


def tier(
    directory: Path, *, identity: str = IDENTITY, budget: int = MIB, max_age_s: float = 7 * DAY
) -> DiskTier:
    return DiskTier(directory, identity=identity, budget_bytes=budget, max_age_s=max_age_s)


def age(path: Path, seconds: float) -> None:
    """Make *path* look last used *seconds* ago."""
    then = time.time() - seconds
    os.utime(path, (then, then))


def kvc_names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.glob("*.kvc"))


def put(disk: DiskTier, tokens: list[int], payload: bytes) -> None:
    disk.put(tokens, memoryview(payload))
    assert disk.flush(10)


def only_file(disk: DiskTier) -> Path:
    (path,) = disk.directory.glob("*.kvc")
    return path


class TestFiles:
    def test_a_snapshot_survives_a_new_tier(self, tmp_path: Path) -> None:
        """A file written by one tier is indexed by the next one on the same directory and reads back whole."""
        disk = tier(tmp_path)
        put(disk, list(range(100)), b"state" * 100)
        disk.close()
        again = tier(tmp_path)
        entry, match = again.best([*range(100), 7, 8], max_tokens=1000)
        assert entry is not None
        assert match == 100
        assert again.read(entry) == bytearray(b"state" * 100)

    def test_the_longest_prefix_wins_and_the_prompt_keeps_its_last_token(self, tmp_path: Path) -> None:
        """best() matches as the RAM tier does: the longest shared prefix, never the whole prompt."""
        disk = tier(tmp_path)
        put(disk, [1, 2, 3, 4], b"x")
        put(disk, [1, 2, 9, 9, 9], b"y")
        entry, match = disk.best([1, 2, 3, 4], max_tokens=100)
        assert entry is not None
        assert (list(entry.tokens), match) == ([1, 2, 3, 4], 3)
        assert disk.best([5, 6], max_tokens=100) == (None, 0)

    def test_files_longer_than_the_context_are_not_offered(self, tmp_path: Path) -> None:
        """A file the sequence could not hold (the context shrank since) is passed over."""
        disk = tier(tmp_path)
        put(disk, list(range(50)), b"x")
        assert disk.best([*range(50), 1], max_tokens=50) == (None, 0)

    def test_a_longer_snapshot_replaces_the_one_it_extends(self, tmp_path: Path) -> None:
        """The next turn's snapshot supersedes the previous turn's file."""
        disk = tier(tmp_path)
        put(disk, [1, 2, 3], b"x" * 10)
        put(disk, [1, 2, 3, 4, 5], b"y" * 10)
        assert [list(e.tokens) for e in disk.entries()] == [[1, 2, 3, 4, 5]]
        assert len(list(disk.directory.glob("*.kvc"))) == 1

    def test_names_are_hashes_and_modes_private(self, tmp_path: Path) -> None:
        """Directories are 0700, files 0600, names a hex digest; no temporary file is left behind."""
        disk = tier(tmp_path / "cache")
        put(disk, [1, 2, 3], b"x")
        path = only_file(disk)
        assert re.fullmatch(r"[0-9a-f]{40}\.kvc", path.name)
        assert stat.S_IMODE((tmp_path / "cache").stat().st_mode) == 0o700
        assert stat.S_IMODE(disk.directory.stat().st_mode) == 0o700
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert sorted(p.name for p in disk.directory.iterdir()) == [path.name]

    def test_another_identity_has_another_directory(self, tmp_path: Path) -> None:
        """Two models (or settings) sharing --cache-dir never see each other's files."""
        put(tier(tmp_path), [1, 2, 3], b"x")
        assert tier(tmp_path, identity=OTHER).entries() == []
        assert len(tier(tmp_path).entries()) == 1

    def test_a_file_is_offered_only_under_the_adapter_set_it_was_computed_under(self, tmp_path: Path) -> None:
        """The LoRA set is in the header (and the name): a prompt under another set, or none, is not offered it."""
        lora = ((0, 0.5),)
        disk = tier(tmp_path)
        disk.put([1, 2, 3, 4], memoryview(b"lora"), lora)
        assert disk.flush(10)
        assert disk.holds([1, 2, 3, 4], lora)
        assert not disk.holds([1, 2, 3, 4])
        assert disk.best([1, 2, 3, 4, 5], max_tokens=100) == (None, 0)
        assert disk.best([1, 2, 3, 4, 5], ((0, 1.0),), max_tokens=100) == (None, 0)
        disk.close()
        again = tier(tmp_path)  # the set comes back from the file's header
        entry, match = again.best([1, 2, 3, 4, 5], lora, max_tokens=100)
        assert entry is not None
        assert (entry.adapters, match) == (lora, 4)
        assert again.read(entry) == bytearray(b"lora")
        header = only_file(again).read_bytes()[len(MAGIC) + 4 :]
        assert b'"adapters": [[0, 0.5]]' in header

    def test_the_same_tokens_under_two_adapter_sets_are_two_files(self, tmp_path: Path) -> None:
        """Neither supersedes the other: each serves its own set, and a longer one replaces only its own set's."""
        disk = tier(tmp_path)
        put(disk, [1, 2, 3], b"base")
        disk.put([1, 2, 3], memoryview(b"lora"), ((1, 1.0),))
        disk.put([1, 2, 3, 4], memoryview(b"lora2"), ((1, 1.0),))
        assert disk.flush(10)
        held = sorted((list(e.tokens), e.adapters) for e in disk.entries())
        assert held == [([1, 2, 3], ()), ([1, 2, 3, 4], ((1, 1.0),))]
        entry, _ = disk.best([1, 2, 3, 9], max_tokens=100)
        assert entry is not None
        assert disk.read(entry) == bytearray(b"base")

    def test_writes_happen_on_the_writer_thread(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """put() only queues: the file is written by the tier's own thread, never the caller's."""
        disk = tier(tmp_path)
        writers: list[str] = []
        write = disk._write
        monkeypatch.setattr(
            disk, "_write", lambda job: (writers.append(threading.current_thread().name), write(job))
        )
        put(disk, [1, 2, 3], b"x")
        assert writers == [WRITER_THREAD_NAME]
        assert threading.current_thread().name != WRITER_THREAD_NAME


class TestBudget:
    def test_least_recently_used_files_go_first(self, tmp_path: Path) -> None:
        """Over the budget the oldest use is deleted; a read counts as a use."""
        disk = tier(tmp_path)
        for first in (10, 20, 30):
            put(disk, [first, 1, 2], b"p" * 1000)
        disk.budget_bytes = disk.total_bytes  # exactly these three fit
        oldest = next(e for e in disk.entries() if e.tokens[0] == 10)
        assert disk.read(oldest) is not None  # 10 is now the most recently used
        put(disk, [40, 1, 2], b"p" * 1000)
        assert sorted(e.tokens[0] for e in disk.entries()) == [10, 30, 40]
        assert disk.total_bytes <= disk.budget_bytes
        assert len(list(disk.directory.glob("*.kvc"))) == 3

    def test_a_smaller_budget_at_start_is_held(self, tmp_path: Path) -> None:
        """Restarting with less disk deletes the oldest files down to it."""
        disk = tier(tmp_path)
        for first in (10, 20, 30):
            put(disk, [first, 1, 2], b"p" * 1000)
        one = disk.entries()[0].size_bytes
        disk.close()
        smaller = tier(tmp_path, budget=one)
        assert [e.tokens[0] for e in smaller.entries()] == [30]

    def test_a_snapshot_over_the_budget_is_not_written(self, tmp_path: Path) -> None:
        """One snapshot larger than the whole budget is dropped, not written then deleted."""
        disk = tier(tmp_path, budget=100)
        put(disk, [1, 2, 3], b"p" * 1000)
        assert disk.entries() == []
        assert list(disk.directory.iterdir()) == []


class TestOneBudgetOverTheTree:
    """Every identity's directory under the one budget; unused ones pruned; another server tolerated."""

    def written(self, directory: Path, identity: str, firsts: list[int], size: int = 1000) -> DiskTier:
        disk = tier(directory, identity=identity)
        for first in firsts:
            put(disk, [first, 1, 2], b"p" * size)
        disk.close()
        return disk

    def test_other_identities_files_count_and_go_least_recently_used_first(self, tmp_path: Path) -> None:
        """A new model's files and an old model's share the budget; the oldest use goes, whichever's it is."""
        old = self.written(tmp_path, OTHER, [10, 20, 30])
        one = old.entries()[0].size_bytes
        disk = tier(tmp_path, budget=3 * one)
        assert len(kvc_names(old.directory)) == 3
        put(disk, [40, 1, 2], b"p" * 1000)
        assert len(kvc_names(old.directory)) == 2
        put(disk, [50, 1, 2], b"p" * 1000)
        put(disk, [60, 1, 2], b"p" * 1000)
        assert kvc_names(old.directory) == []
        assert sorted(e.tokens[0] for e in disk.entries()) == [40, 50, 60]
        put(disk, [70, 1, 2], b"p" * 1000)
        assert sorted(e.tokens[0] for e in disk.entries()) == [50, 60, 70]

    def test_a_start_holds_the_whole_tree_to_the_budget(self, tmp_path: Path) -> None:
        """Starting with one file's budget over two old identities' six files leaves the newest one."""
        first = self.written(tmp_path, OTHER, [10, 20, 30])
        second = self.written(tmp_path, "c" * 64, [40, 50, 60])
        one = first.entries()[0].size_bytes
        disk = tier(tmp_path, budget=one)
        assert disk.entries() == []
        assert kvc_names(first.directory) == []
        assert len(kvc_names(second.directory)) == 1
        assert second.directory.exists()

    def test_an_unused_identity_directory_is_pruned(self, tmp_path: Path) -> None:
        """Another identity's directory unused for max_age_s goes whole: its files, old leftovers, itself."""
        stale = self.written(tmp_path, OTHER, [10, 20])
        recent = self.written(tmp_path, "c" * 64, [30])
        leftover = stale.directory / ".x.1.tmp"
        leftover.write_bytes(b"cut short")
        for path in [*stale.directory.iterdir(), stale.directory]:
            age(path, 8 * DAY)
        for path in [*recent.directory.iterdir(), recent.directory]:
            age(path, 6 * DAY)
        unrelated = tmp_path / "not-an-identity"
        unrelated.mkdir()
        age(unrelated, 30 * DAY)
        tier(tmp_path)
        assert not stale.directory.exists()
        assert len(kvc_names(recent.directory)) == 1
        assert unrelated.exists()

    def test_a_pruned_directory_with_foreign_files_is_kept(self, tmp_path: Path) -> None:
        """Only snapshot files are deleted: a directory holding anything else stays, emptied of them."""
        stale = self.written(tmp_path, OTHER, [10])
        (stale.directory / "notes.txt").write_text("not Bubo's")
        for path in [*stale.directory.iterdir(), stale.directory]:
            age(path, 8 * DAY)
        tier(tmp_path)
        assert sorted(p.name for p in stale.directory.iterdir()) == ["notes.txt"]

    def test_a_use_keeps_a_directory(self, tmp_path: Path) -> None:
        """A directory is as recent as its newest file: a read (its time set) keeps the whole directory."""
        old = self.written(tmp_path, OTHER, [10, 20])
        for path in [*old.directory.iterdir(), old.directory]:
            age(path, 8 * DAY)
        os.utime(next(old.directory.glob("*.kvc")))  # the other server restored it just now
        tier(tmp_path)
        assert len(kvc_names(old.directory)) == 2

    def test_another_servers_writes_in_progress_are_left_alone(self, tmp_path: Path) -> None:
        """A temporary file in another identity's directory is neither counted nor deleted."""
        other = self.written(tmp_path, OTHER, [10])
        in_progress = other.directory / ".abc.999.tmp"
        in_progress.write_bytes(b"w" * 5000)
        one = other.entries()[0].size_bytes
        disk = tier(tmp_path, budget=2 * one)
        put(disk, [20, 1, 2], b"p" * 1000)
        assert in_progress.exists()
        assert len(kvc_names(other.directory)) == 1

    def test_files_another_server_deleted_are_forgotten(self, tmp_path: Path) -> None:
        """A running tier whose files vanish (another server's eviction) stops counting them at its next write."""
        disk = tier(tmp_path)
        put(disk, [10, 1, 2], b"p" * 1000)
        put(disk, [20, 1, 2], b"p" * 1000)
        for path in disk.directory.glob("*.kvc"):
            path.unlink()
        put(disk, [30, 1, 2], b"p" * 1000)
        assert [e.tokens[0] for e in disk.entries()] == [30]
        assert disk.total_bytes == only_file(disk).stat().st_size

    def test_a_directory_pruned_under_a_running_tier_is_made_again(self, tmp_path: Path) -> None:
        """Another server pruned this tier's directory meanwhile: the next write creates it again."""
        disk = tier(tmp_path)
        put(disk, [10, 1, 2], b"p" * 1000)
        for path in disk.directory.iterdir():
            path.unlink()
        disk.directory.rmdir()
        put(disk, [20, 1, 2], b"p" * 1000)
        assert [e.tokens[0] for e in disk.entries()] == [20]
        assert stat.S_IMODE(disk.directory.stat().st_mode) == 0o700


class TestBrokenFiles:
    @pytest.fixture(name="written")
    def _written(self, tmp_path: Path) -> Path:
        disk = tier(tmp_path)
        put(disk, list(range(20)), bytes(range(256)) * 4)
        disk.close()
        return only_file(disk)

    def reads_back(self, directory: Path) -> bytearray | None:
        disk = tier(directory)
        entry, _ = disk.best([*range(20), 99], max_tokens=100)
        return None if entry is None else disk.read(entry)

    def test_a_flipped_payload_byte_fails_the_checksum(
        self, tmp_path: Path, written: Path, caplog: pytest.LogCaptureFixture
    ) -> None:
        """A byte changed on disk: the read is refused with a warning and the file deleted."""
        data = bytearray(written.read_bytes())
        data[-10] ^= 0xFF
        written.write_bytes(data)
        assert self.reads_back(tmp_path) is None
        assert "checksum" in caplog.text
        assert not written.exists()

    def test_a_truncated_file_is_dropped_at_start(
        self, tmp_path: Path, written: Path, caplog: pytest.LogCaptureFixture
    ) -> None:
        """A file cut short (a crash, a full disk) never enters the index."""
        written.write_bytes(written.read_bytes()[:-100])
        assert tier(tmp_path).entries() == []
        assert "does not match its header" in caplog.text
        assert not written.exists()

    def test_a_file_truncated_after_start_is_refused_on_read(self, tmp_path: Path, written: Path) -> None:
        """Cut short between the index and the read: the read sees it."""
        disk = tier(tmp_path)
        (entry,) = disk.entries()
        written.write_bytes(written.read_bytes()[:-100])
        assert disk.read(entry) is None
        assert disk.entries() == []

    def test_another_models_file_is_refused(
        self, tmp_path: Path, written: Path, caplog: pytest.LogCaptureFixture
    ) -> None:
        """A file written for another identity, copied into this directory, is refused and deleted."""
        foreign = tier(tmp_path / "other", identity=OTHER)
        put(foreign, list(range(20)), b"f" * 1024)
        source = only_file(foreign)
        written.unlink()
        (written.parent / source.name).write_bytes(source.read_bytes())
        assert tier(tmp_path).entries() == []
        assert "another model or other settings" in caplog.text

    def test_garbage_and_leftovers(self, tmp_path: Path, written: Path) -> None:
        """Not a snapshot file, a header that lies, a temporary file of a cut write: all deleted at start."""
        directory = written.parent
        (directory / ("0" * 40 + ".kvc")).write_bytes(b"not a snapshot at all")
        header = json.dumps(
            {"identity": IDENTITY, "n_tokens": "many", "payload_bytes": 1, "sha256": ""}
        ).encode()
        (directory / ("1" * 40 + ".kvc")).write_bytes(MAGIC + len(header).to_bytes(4, "little") + header)
        (directory / ".abc.123.tmp").write_bytes(b"half")
        age(directory / ".abc.123.tmp", STALE_TEMPORARY_S + 60)
        (directory / ".def.456.tmp").write_bytes(b"another server's write in progress")
        (directory / "notes.txt").write_text("not ours")
        disk = tier(tmp_path)
        assert len(disk.entries()) == 1
        assert sorted(p.name for p in directory.iterdir()) == sorted(
            [written.name, ".def.456.tmp", "notes.txt"]
        )


def test_the_identity_follows_the_model_file_and_the_settings(tmp_path: Path) -> None:
    """Another model file, or another KV setting, is another identity."""
    model = tmp_path / "m.gguf"
    model.write_bytes(os.urandom(3 * MIB))
    first = kv_identity(model, {"type_k": 1})
    assert kv_identity(model, {"type_k": 1}) == first
    assert kv_identity(model, {"type_k": 8}) != first
    data = bytearray(model.read_bytes())
    data[100] ^= 1
    model.write_bytes(data)
    assert kv_identity(model, {"type_k": 1}) != first


def test_a_file_gone_since_it_was_chosen_is_a_quiet_miss(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Evicted between best() and read() (another request's write): no warning, just no payload."""
    disk = tier(tmp_path)
    put(disk, [1, 2, 3], b"x")
    (entry,) = disk.entries()
    only_file(disk).unlink()
    assert disk.read(entry) is None
    assert disk.entries() == []
    assert "skipped" not in caplog.text


def test_a_file_being_written_is_held(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """While the writer writes a snapshot, holds() says so: the same tokens are not queued twice."""
    disk = tier(tmp_path)
    started, release = threading.Event(), threading.Event()
    write = disk._write

    def slow_write(job: object) -> None:
        started.set()
        assert release.wait(10)
        write(job)  # type: ignore[arg-type]

    monkeypatch.setattr(disk, "_write", slow_write)
    disk.put([1, 2, 3], memoryview(b"x"))
    assert started.wait(10)
    try:
        assert disk.holds([1, 2, 3])
        assert not disk.holds([1, 2])
    finally:
        release.set()
    assert disk.flush(10)
    assert disk.holds([1, 2, 3])
