"""CPU used by this agent's own process tree: itself, and the Spark JVM and Python workers it started.

For hosts where the CPU sources that KCL knows would measure other agents' load too.

Several agents on one host without a cgroup each (the local stack, a VM running a few Spark drivers) all read the
same host-wide /proc/stat (or the same shared cgroup) figure: the leader then balances on a number no move changes
(the live bench saw KCL 3.1.3 move 7-11 leases a minute that way). `ProcessTreeCpu` counts the CPU seconds of this
process and its descendants instead, as a share of the host's CPUs; `shares_scope` decides when that is needed.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path

import psutil

from shardherd.agent.metrics import MetricSourceError
from shardherd.shared.clock import Clock

PidSource = Callable[[], Iterable[int]]


def family(pid: int) -> set[int]:
    """`pid`, its ancestors and its descendants (the processes whose CPU is this agent's, or that started it)."""
    try:
        process = psutil.Process(pid)
        related = [process, *process.parents(), *process.children(recursive=True)]
    except psutil.Error as exc:
        raise MetricSourceError(f"cannot list the process tree of {pid}: {exc}") from exc
    return {p.pid for p in related}


def cgroup_pids(directory: Path) -> set[int]:
    """Every process id listed in `cgroup.procs` files at and below `directory` (none when there are none)."""
    found: set[int] = set()
    for root, _, files in os.walk(directory):
        if "cgroup.procs" not in files:
            continue
        try:
            text = (Path(root) / "cgroup.procs").read_text(encoding="ascii")
        except OSError:
            continue  # a cgroup removed while walking
        found.update(int(line) for line in text.split() if line.isdigit())
    return found


def shares_scope(scope_pids: Iterable[int], pid: int | None = None) -> bool:
    """True when a process that is not this agent's family runs in the scope a CPU source measures.

    Kernel threads and every other process of the host count: a host-wide or shared-cgroup figure then shows their
    load as this agent's.
    """
    mine = family(os.getpid() if pid is None else pid)
    return any(other not in mine and psutil.pid_exists(other) for other in scope_pids)


class ProcessTreeCpu:
    """Percent of the host's CPUs this process and its descendants used since the previous call; 0 on the first."""

    name = "process-tree"

    def __init__(self, clock: Clock, pid: int | None = None, cpus: int | None = None) -> None:
        self._clock = clock
        self._pid = os.getpid() if pid is None else pid
        self._cpus = cpus or psutil.cpu_count() or 1
        self._seconds: dict[int, float] = {}
        self._at: float | None = None

    def _tree(self) -> dict[int, float]:
        """CPU seconds (user + system) of each live process of the tree."""
        try:
            root = psutil.Process(self._pid)
            processes = [root, *root.children(recursive=True)]
        except psutil.Error as exc:
            raise MetricSourceError(f"cannot read the process tree of {self._pid}: {exc}") from exc
        seconds = {}
        for process in processes:
            try:
                times = process.cpu_times()
            except psutil.Error:
                continue  # exited between listing and reading: its last interval is not counted
            seconds[process.pid] = times.user + times.system
        return seconds

    def sample(self) -> float:
        """Share of all host CPUs the tree used since the last call (processes started since then count whole)."""
        now, current = self._clock.monotonic(), self._tree()
        previous, self._seconds = self._seconds, current
        started, self._at = self._at, now
        if started is None:
            return 0.0
        elapsed = now - started
        if elapsed <= 0:
            raise MetricSourceError("no time passed since the previous process-tree sample")
        used = sum(max(0.0, value - previous.get(pid, 0.0)) for pid, value in current.items())
        return min(100.0, used / elapsed / self._cpus * 100.0)
