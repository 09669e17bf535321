"""Container CPU utilisation from cgroup v1 and v2 files, as a share of the container's CPU limit (as KCL's).

Both versions measure `(CPU seconds used / seconds elapsed) / CPUs allowed x 100`, capped at 100. Unlike KCL, the
elapsed time comes from the injected clock's monotonic time (KCL uses the millisecond wall clock, which can jump), the
limit is re-read on every sample (so an in-place resize is seen) and cgroup v1's accounting file is also looked for in
the `cpuacct` and `cpu,cpuacct` hierarchies, where most hosts mount it.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path

from shardherd.agent.metrics import MetricSourceError
from shardherd.shared.clock import Clock

CGROUP_ROOT = Path("/sys/fs/cgroup")
_V1_USAGE_DIRS = ("cpu", "cpuacct", "cpu,cpuacct", "cpuacct,cpu")
_V1_QUOTA_DIRS = ("cpu", "cpu,cpuacct", "cpuacct,cpu")


def read_text(path: Path) -> str:
    """The stripped contents of a small kernel file, or a MetricSourceError naming it."""
    try:
        return path.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise MetricSourceError(f"cannot read {path}: {exc}") from exc


def read_int(path: Path) -> int:
    """A file holding one integer."""
    text = read_text(path)
    try:
        return int(text)
    except ValueError as exc:
        raise MetricSourceError(f"{path} does not hold an integer: {text!r}") from exc


def count_cpus(cpu_list: str) -> int:
    """Number of CPUs in a kernel CPU list such as `0-3,6,8-10` (9): ranges are inclusive."""
    count = 0
    for part in cpu_list.strip().split(","):
        low, dash, high = part.strip().partition("-")
        try:
            first = int(low)
            last = int(high) if dash else first
        except ValueError as exc:
            raise MetricSourceError(f"malformed CPU list {cpu_list!r}") from exc
        if first < 0 or last < first:
            raise MetricSourceError(f"malformed CPU list {cpu_list!r}")
        count += last - first + 1
    return count


@dataclass(frozen=True, slots=True)
class _Reading:
    usage_seconds: float
    at: float


class CgroupCpu(ABC):
    """The shared formula of both cgroup versions; subclasses say where usage and limit come from."""

    name: str

    def __init__(self, clock: Clock, root: Path = CGROUP_ROOT, host_cpus: int | None = None) -> None:
        self._clock = clock
        self._root = root
        self._host_cpus = host_cpus if host_cpus is not None else (os.cpu_count() or 1)
        self._previous: _Reading | None = None

    @abstractmethod
    def usage_seconds(self) -> float:
        """CPU time used by the container so far, in seconds."""

    @abstractmethod
    def limit_cpus(self) -> float:
        """How many CPUs the container may use (quota / period, or the CPUs it may run on)."""

    def cpuset_cpus(self, path: Path) -> int:
        """CPUs in a cpuset file, or every host CPU when the file is absent (no cpuset controller)."""
        if not path.exists():
            return self._host_cpus
        return count_cpus(read_text(path))

    def sample(self) -> float:
        """Percent of the limit used since the last call; 0 on the first call."""
        current = _Reading(self.usage_seconds(), self._clock.monotonic())
        previous, self._previous = self._previous, current
        if previous is None:
            return 0.0
        elapsed = current.at - previous.at
        used = current.usage_seconds - previous.usage_seconds
        if elapsed <= 0:
            raise MetricSourceError("no time passed since the previous cgroup sample")
        if used < 0:
            raise MetricSourceError(f"cgroup CPU usage went backwards by {-used:.6f} s")
        limit = self.limit_cpus()
        if limit <= 0:
            raise MetricSourceError(f"cgroup CPU limit is not positive: {limit}")
        return min(100.0, used / elapsed / limit * 100.0)


class CgroupV1Cpu(CgroupCpu):
    """cgroup v1: `cpuacct.usage` (ns), `cpu.cfs_quota_us` / `cpu.cfs_period_us`, `cpuset.effective_cpus`."""

    name = "cgroup-v1"

    @staticmethod
    def usage_file(root: Path) -> Path | None:
        """Where this host keeps `cpuacct.usage` under `root`, or None if it is not a cgroup v1 host."""
        for directory in _V1_USAGE_DIRS:
            candidate = root / directory / "cpuacct.usage"
            if candidate.is_file():
                return candidate
        return None

    @classmethod
    def present(cls, root: Path) -> bool:
        """True when `root` holds cgroup v1 CPU accounting."""
        return cls.usage_file(root) is not None

    def usage_seconds(self) -> float:
        """`cpuacct.usage` in seconds."""
        path = self.usage_file(self._root)
        if path is None:
            raise MetricSourceError(f"no cpuacct.usage under {self._root}")
        return read_int(path) / 1e9

    def limit_cpus(self) -> float:
        """Quota over period; a quota of -1 (or no quota file) means the cpuset's CPU count."""
        for directory in _V1_QUOTA_DIRS:
            quota_path = self._root / directory / "cpu.cfs_quota_us"
            if quota_path.is_file():
                quota = read_int(quota_path)
                if quota > 0:
                    period = read_int(self._root / directory / "cpu.cfs_period_us")
                    if period <= 0:
                        raise MetricSourceError(f"cpu.cfs_period_us under {directory} is not positive: {period}")
                    return quota / period
                break
        return self.cpuset_cpus(self._root / "cpuset" / "cpuset.effective_cpus")


class CgroupV2Cpu(CgroupCpu):
    """cgroup v2: `usage_usec` in `cpu.stat` (µs), `cpu.max` (`QUOTA PERIOD` or `max PERIOD`), the cpuset."""

    name = "cgroup-v2"

    def usage_seconds(self) -> float:
        """The `usage_usec` line of `cpu.stat`, in seconds."""
        path = self._root / "cpu.stat"
        for line in read_text(path).splitlines():
            key, _, value = line.partition(" ")
            if key == "usage_usec":
                try:
                    return int(value) / 1e6
                except ValueError as exc:
                    raise MetricSourceError(f"{path}: malformed usage_usec line {line!r}") from exc
        raise MetricSourceError(f"{path} has no usage_usec line")

    def limit_cpus(self) -> float:
        """`cpu.max` quota over period; `max` (or no file, as in the root cgroup) means the cpuset's CPU count."""
        max_path = self._root / "cpu.max"
        if max_path.exists():
            text = read_text(max_path)
            fields = text.split()
            if len(fields) != 2:
                raise MetricSourceError(f"{max_path} is not `QUOTA PERIOD`: {text!r}")
            if fields[0] != "max":
                try:
                    quota, period = int(fields[0]), int(fields[1])
                except ValueError as exc:
                    raise MetricSourceError(f"{max_path} is not `QUOTA PERIOD`: {text!r}") from exc
                if quota <= 0 or period <= 0:
                    raise MetricSourceError(f"{max_path} has a non-positive quota or period: {text!r}")
                return quota / period
        return self.cpuset_cpus(self._root / "cpuset.cpus.effective")

    @staticmethod
    def present(root: Path) -> bool:
        """True when `root` is a cgroup v2 mount with CPU accounting."""
        return (root / "cgroup.controllers").is_file() and (root / "cpu.stat").is_file()
