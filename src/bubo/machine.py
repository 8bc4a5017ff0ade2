"""What this machine gives the process to compute with: the CPUs it may use and the cores they are on.

Read from Linux's sysfs and cgroup files; elsewhere every CPU ``os.cpu_count()``
counts is taken as a core.  Each reader takes the paths it reads, so that a
test can hand it a made-up machine.

- :func:`default_threads` is ``--threads``' default: one thread a core, as
  llama-server's ``-t`` (llama.cpp's ``cpu_get_num_math``): hyperthreads of a
  core count once, a hybrid Intel CPU's efficiency cores not at all (Linux
  lists them in ``/sys/devices/cpu_atom/cpus``; llama.cpp asks each CPU with
  ``cpuid``).  Unlike llama.cpp, only the CPUs this process may run on count,
  and never more than a cgroup's CPU quota allows.
- :func:`usable_cpus` is what the event loop and llama.cpp's threads share
  (``--courier auto``: a courier where some are left to the event loop).
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from pathlib import Path

__all__ = [
    "CGROUP_ROOT",
    "CPU_TOPOLOGY",
    "E_CORES",
    "PROC_CGROUP",
    "allowed_cpus",
    "cpu_quota",
    "default_threads",
    "parse_cpu_list",
    "physical_cores",
    "usable_cpus",
]

CPU_TOPOLOGY = Path("/sys/devices/system/cpu")
E_CORES = Path("/sys/devices/cpu_atom/cpus")  # a hybrid Intel CPU's efficiency cores; absent elsewhere
CGROUP_ROOT = Path("/sys/fs/cgroup")  # cgroup v2's unified hierarchy
PROC_CGROUP = Path("/proc/self/cgroup")


def allowed_cpus() -> frozenset[int]:
    """The CPUs this process may run on (its affinity mask; every CPU where there is none)."""
    try:
        return frozenset(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return frozenset(range(os.cpu_count() or 1))


def parse_cpu_list(text: str) -> frozenset[int]:
    """Linux's CPU list format (``0-3,8,10-11``); empty for an empty list.

    Raises:
        ValueError: *text* is not a CPU list.

    """
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        first, _, last = part.partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    return frozenset(cpus)


def cpu_quota(cgroup_root: Path = CGROUP_ROOT, proc_cgroup: Path = PROC_CGROUP) -> int | None:
    """The CPUs a cgroup CPU quota allows this process (rounded up); None without one.

    cgroup v2: the tightest ``cpu.max`` of the process's cgroup and each one
    above it (a container's limit is usually at its root).  cgroup v1: the
    ``cpu`` controller's ``cpu.cfs_quota_us`` over ``cpu.cfs_period_us``, in
    the process's cgroup or, where that path is not in the mount (a container
    without a cgroup namespace), at the mount's root.
    """
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return None
    quotas: list[int] = []
    for line in lines:
        number, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        relative = _relative(path)
        if relative is None:
            continue
        if number == "0" and not controllers:  # v2: "0::/path"
            group = cgroup_root / relative
            quotas += [q for d in (group, *group.parents) if _within(d, cgroup_root) for q in _v2_quota(d)]
        elif "cpu" in controllers.split(","):  # v1: "4:cpu,cpuacct:/path", mounted by either name
            mounts = (cgroup_root / controllers, cgroup_root / "cpu")
            places = [place for mount in mounts for place in (mount / relative, mount)]
            found = next((quota for place in places for quota in _v1_quota(place)), None)
            if found is not None:
                quotas.append(found)
    return min(quotas, default=None)


def _relative(path: str) -> str | None:
    """A cgroup path as a path below the hierarchy's root; None for one that climbs out of it."""
    parts = [part for part in path.strip().split("/") if part]
    return None if ".." in parts else "/".join(parts)


def _within(directory: Path, root: Path) -> bool:
    return directory == root or root in directory.parents


def _v2_quota(directory: Path) -> list[int]:
    """``cpu.max`` is ``QUOTA PERIOD`` in microseconds, or ``max PERIOD`` for none."""
    try:
        quota, period = (directory / "cpu.max").read_text().split()
        return [max(1, math.ceil(int(quota) / int(period)))]
    except (OSError, ValueError, ZeroDivisionError):  # absent, "max", or not what the kernel writes
        return []


def _v1_quota(directory: Path) -> list[int]:
    """``cpu.cfs_quota_us`` over ``cpu.cfs_period_us``; a quota of -1 is none."""
    try:
        quota = int((directory / "cpu.cfs_quota_us").read_text())
        period = int((directory / "cpu.cfs_period_us").read_text())
        return [max(1, math.ceil(quota / period))] if quota > 0 else []
    except (OSError, ValueError, ZeroDivisionError):
        return []


def usable_cpus(cpus: Iterable[int] | None = None, *, quota: int | None = None) -> int:
    """The CPUs the process may keep busy at once: *cpus* (default: its own), at most *quota*."""
    count = len(set(allowed_cpus() if cpus is None else cpus))
    return max(1, min(count, quota) if quota is not None else count)


def physical_cores(cpus: Iterable[int], topology: Path = CPU_TOPOLOGY) -> int | None:
    """The cores *cpus* are on: their distinct sets of hyperthread siblings; None where sysfs does not say."""
    siblings = set()
    for cpu in cpus:
        try:
            siblings.add((topology / f"cpu{cpu}" / "topology" / "thread_siblings").read_text().strip())
        except OSError:
            return None
    return len(siblings) or None


def default_threads(
    cpus: Iterable[int] | None = None,
    *,
    topology: Path = CPU_TOPOLOGY,
    e_cores: Path = E_CORES,
    quota: int | None = None,
) -> int:
    """One llama.cpp thread a core of *cpus* (default: the process's own), efficiency cores left out.

    At most *quota* (a cgroup's CPU quota); every CPU where sysfs does not say which core it is on.
    """
    allowed = frozenset(allowed_cpus() if cpus is None else cpus)
    try:
        performance = allowed - parse_cpu_list(e_cores.read_text())
    except (OSError, ValueError):  # no hybrid CPU here (or sysfs does not say)
        performance = allowed
    counted = performance or allowed
    cores = physical_cores(counted, topology) or len(counted)
    return max(1, min(cores, quota) if quota is not None else cores)
