"""``bubo.machine``: the CPUs a process may use and the cores they are on, read from a made-up machine."""

from __future__ import annotations

from pathlib import Path

import pytest

from bubo.machine import cpu_quota, default_threads, parse_cpu_list, physical_cores, usable_cpus


def topology(root: Path, siblings: dict[int, str]) -> Path:
    """sysfs's CPU topology for *siblings* (each CPU's ``thread_siblings`` mask)."""
    for cpu, mask in siblings.items():
        (root / f"cpu{cpu}" / "topology").mkdir(parents=True)
        (root / f"cpu{cpu}" / "topology" / "thread_siblings").write_text(f"{mask}\n")
    return root


HYPERTHREADED = {0: "05", 1: "0a", 2: "05", 3: "0a"}  # cores {0, 2} and {1, 3}


class TestCores:
    def test_two_hyperthreads_of_a_core_count_once(self, tmp_path: Path) -> None:
        assert physical_cores(range(4), topology(tmp_path, HYPERTHREADED)) == 2

    def test_only_the_cpus_given_count(self, tmp_path: Path) -> None:
        assert physical_cores([0, 2], topology(tmp_path, HYPERTHREADED)) == 1  # pinned to one core's two

    def test_one_thread_a_core_is_every_cpu(self, tmp_path: Path) -> None:
        assert physical_cores([0, 1], topology(tmp_path, {0: "1", 1: "2"})) == 2

    def test_an_unreadable_topology_says_nothing(self, tmp_path: Path) -> None:
        assert physical_cores([0, 1], tmp_path) is None


class TestDefaultThreads:
    """One thread a core, efficiency cores left out, at most the quota: llama-server's ``-t``, fenced."""

    def test_one_a_core(self, tmp_path: Path) -> None:
        root = topology(tmp_path / "cpu", HYPERTHREADED)
        assert default_threads(range(4), topology=root, e_cores=tmp_path / "none") == 2

    def test_efficiency_cores_are_left_out(self, tmp_path: Path) -> None:
        root = topology(tmp_path / "cpu", {0: "1", 1: "2", 2: "4", 3: "8"})
        (tmp_path / "atom").write_text("2-3\n")
        assert default_threads(range(4), topology=root, e_cores=tmp_path / "atom") == 2

    def test_a_process_on_efficiency_cores_alone_uses_them(self, tmp_path: Path) -> None:
        root = topology(tmp_path / "cpu", {0: "1", 1: "2", 2: "4", 3: "8"})
        (tmp_path / "atom").write_text("2-3\n")
        assert default_threads([2, 3], topology=root, e_cores=tmp_path / "atom") == 2

    def test_at_most_the_quota(self, tmp_path: Path) -> None:
        root = topology(tmp_path / "cpu", {cpu: f"{1 << cpu:x}" for cpu in range(8)})
        assert default_threads(range(8), topology=root, e_cores=tmp_path / "none", quota=2) == 2

    def test_without_a_topology_every_cpu(self, tmp_path: Path) -> None:
        assert default_threads(range(3), topology=tmp_path, e_cores=tmp_path / "none") == 3


@pytest.mark.parametrize(
    ("text", "cpus"),
    [("0-3", {0, 1, 2, 3}), ("0,2,4-5\n", {0, 2, 4, 5}), ("7", {7}), ("", set())],
)
def test_cpu_lists_read_as_linux_writes_them(text: str, cpus: set[int]) -> None:
    assert parse_cpu_list(text) == cpus


class TestQuota:
    @staticmethod
    def proc(root: Path, *lines: str) -> Path:
        """``/proc/self/cgroup`` with *lines*."""
        proc = root / "proc-cgroup"
        proc.write_text("".join(f"{line}\n" for line in lines))
        return proc

    @staticmethod
    def files(root: Path, files: dict[str, str]) -> Path:
        """A cgroup tree under *root*: each file's path and content."""
        for name, content in files.items():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_text(f"{content}\n")
        return root

    def test_a_v2_quota_rounds_up_to_whole_cpus(self, tmp_path: Path) -> None:
        fs = self.files(tmp_path / "fs", {"cpu.max": "150000 100000"})
        assert cpu_quota(fs, self.proc(tmp_path, "0::/")) == 2

    def test_the_tightest_v2_quota_above_the_process_counts(self, tmp_path: Path) -> None:
        fs = self.files(
            tmp_path / "fs",
            {"cpu.max": "400000 100000", "box/cpu.max": "200000 100000", "box/app/cpu.max": "300000 100000"},
        )
        assert cpu_quota(fs, self.proc(tmp_path, "0::/box/app")) == 2

    def test_no_v2_quota(self, tmp_path: Path) -> None:
        fs = self.files(tmp_path / "fs", {"box/cpu.max": "max 100000"})
        assert cpu_quota(fs, self.proc(tmp_path, "0::/box")) is None

    def test_a_v1_quota_in_the_process_cgroup(self, tmp_path: Path) -> None:
        fs = self.files(
            tmp_path / "fs",
            {
                "cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "250000",
                "cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000",
            },
        )
        assert cpu_quota(fs, self.proc(tmp_path, "4:cpu,cpuacct:/docker/abc", "0::/")) == 3

    def test_a_v1_quota_at_the_mount_root_when_the_path_is_not_in_the_mount(self, tmp_path: Path) -> None:
        fs = self.files(
            tmp_path / "fs", {"cpu/cpu.cfs_quota_us": "200000", "cpu/cpu.cfs_period_us": "100000"}
        )
        assert cpu_quota(fs, self.proc(tmp_path, "1:cpu:/docker/abc")) == 2

    def test_no_v1_quota(self, tmp_path: Path) -> None:
        fs = self.files(tmp_path / "fs", {"cpu/cpu.cfs_quota_us": "-1", "cpu/cpu.cfs_period_us": "100000"})
        assert cpu_quota(fs, self.proc(tmp_path, "1:cpu:/", "2:cpuacct:/")) is None

    def test_a_path_out_of_the_hierarchy_is_not_followed(self, tmp_path: Path) -> None:
        self.files(tmp_path, {"x/cpu.max": "100000 100000"})  # beside the hierarchy, where "/../x" leads
        fs = self.files(tmp_path / "fs", {"cpu.max": "max 100000"})
        assert cpu_quota(fs, self.proc(tmp_path, "0::/../x")) is None

    def test_no_cgroup_file(self, tmp_path: Path) -> None:
        assert cpu_quota(tmp_path, tmp_path / "absent") is None

    def test_usable_cpus_are_the_allowed_ones_within_the_quota(self) -> None:
        assert usable_cpus(range(16), quota=4) == 4
        assert usable_cpus(range(2), quota=4) == 2
        assert usable_cpus(range(2)) == 2
