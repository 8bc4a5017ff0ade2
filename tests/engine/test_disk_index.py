"""The disk tier's index and the tree's budget on their own: no files read or written."""

from __future__ import annotations

import array
from pathlib import Path

from bubo.engine._disk_format import DiskEntry
from bubo.engine._disk_index import DiskIndex
from bubo.engine._disk_tree import DiskTree, TreeFile
from bubo.engine.lora import NO_ADAPTERS, AdapterSet

LORA: AdapterSet = ((0, 1.0),)


def entry(
    name: str, tokens: list[int], size: int, *, last_used: float = 0.0, adapters: AdapterSet = NO_ADAPTERS
) -> DiskEntry:
    return DiskEntry(name, array.array("i", tokens), size, last_used, adapters)


class TestDiskIndex:
    def test_a_file_supersedes_those_it_extends_under_its_own_adapter_set(self) -> None:
        index = DiskIndex()
        index.found([entry("b", [1, 2], 20, last_used=2), entry("a", [1], 10, last_used=1)])
        index.found([entry("lora", [1, 2], 5, adapters=LORA), entry("other", [9], 5)])
        assert index.add(entry("c", [1, 2, 3], 30)) == ["a", "b"]
        assert [e.name for e in index.entries()] == ["a", "b", "lora", "other", "c"]

    def test_counts_the_bytes_of_what_it_holds(self) -> None:
        index = DiskIndex()
        index.found([entry("a", [1], 10), entry("b", [2], 20)])
        index.add(entry("a", [1], 15))  # written again: replaced, not counted twice
        index.pop("b")
        index.pop("gone")
        assert (index.total_bytes, "a" in index, "b" in index) == (15, True, False)
        index.keep_only({"b"})
        assert (index.total_bytes, index.entries()) == (0, [])

    def test_a_read_makes_a_file_the_most_recently_used(self) -> None:
        index = DiskIndex()
        first, second = entry("a", [1], 1, last_used=1), entry("b", [2], 1, last_used=2)
        index.found([first, second])
        index.used(first, 5.0)
        assert ([e.name for e in index.entries()], first.last_used) == (["b", "a"], 5.0)
        index.pop("a")
        index.used(first, 9.0)  # deleted meanwhile: nothing comes back
        assert ([e.name for e in index.entries()], first.last_used) == (["b"], 5.0)


def test_the_tree_deletes_the_least_recently_used_until_the_rest_fit() -> None:
    files = [
        TreeFile(Path(name), size, last_used)
        for name, size, last_used in [("a", 10, 3), ("b", 10, 1), ("c", 10, 2)]
    ]
    assert DiskTree.excess(files, 30) == []
    assert [f.path.name for f in DiskTree.excess(files, 15)] == ["b", "c"]
    assert [f.path.name for f in DiskTree.excess(files, 0)] == ["b", "c", "a"]
