"""CPU used by this agent's own process tree: itself, and the Spark JVM and Python workers it started.

For hosts where the CPU sources that KCL knows would measure other agents' load too.

Several agents on one host without a cgroup each (the local stack, a VM running a few Spark drivers) all read the
same host-wide /proc/stat (or the same shared cgroup) figure: the leader then balances on a number no move changes
(the live bench saw KCL 3.1.3 move 7-11 leases a minute that way). `ProcessTreeCpu` counts the CPU seconds of this
process and its descendants instead, as a share of the host's CPUs; `shares_scope` decides when that is needed.

The tree is listed every sample (once a second) from the kernel's per-thread lists of children
(`/proc/PID/task/TID/children`), which cost one read per thread of the tree. psutil's `children(recursive=True)` reads
the parent of every process of the host instead: 3.5 ms of CPU per sample with 161 processes on this machine, in
every agent of a shared host, the hosts this source exists for (the 64-shard, 8-agent local stack: 6 % of a plain
agent's time holding the GIL). Where the kernel has no such lists (not Linux, or built without
CONFIG_PROC_CHILDREN) the tree is psutil's. Like psutil's, the listing races with processes starting and exiting:
a child started after it counts whole at the next sample, one that exited is left out of the interval.

Where the kernel lists children, everything here reads /proc itself (a process's CPU seconds and parent from
/proc/PID/stat, the host's processes from /proc's entries, as psutil does on Linux) and psutil is not imported:
its modules cost every agent about 1 MiB of resident memory (decision 0024). Elsewhere psutil answers.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from shardherd.agent.metrics import MetricSourceError
from shardherd.shared.clock import Clock

PidSource = Callable[[], Iterable[int]]
PROC = Path("/proc")


def family(pid: int, proc: Path = PROC) -> set[int]:
    """`pid`, its ancestors and its descendants (the processes whose CPU is this agent's, or that started it)."""
    if children_listed(pid, proc):
        return {pid, *ancestors(pid, proc), *descendants(pid, proc)}
    psutil = _psutil()
    try:
        process = psutil.Process(pid)
        related = [process, *process.parents(), *process.children(recursive=True)]
    except psutil.Error as exc:
        raise MetricSourceError(f"cannot list the process tree of {pid}: {exc}") from exc
    return {p.pid for p in related}


def host_pids(proc: Path = PROC) -> list[int]:
    """Every process of the host (what /proc/stat and psutil measure): /proc's numbered entries, else psutil's."""
    if proc.is_dir():
        return [int(name) for name in os.listdir(proc) if name.isdigit()]
    return list(_psutil().pids())


def _psutil() -> Any:
    """psutil, imported where /proc does not answer (see the module's docstring)."""
    import psutil

    return psutil


def _stat_fields(pid: int, proc: Path) -> list[str]:
    """The fields of /proc/PID/stat after the command name (field 3, the state, first); OSError if it exited."""
    text = (proc / str(pid) / "stat").read_text(encoding="ascii", errors="replace")
    return text[text.rindex(")") + 2:].split()


_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_seconds(pid: int, proc: Path = PROC) -> float:
    """User + system CPU seconds of `pid` from /proc/PID/stat (fields 14 and 15); OSError if it exited."""
    fields = _stat_fields(pid, proc)
    return (int(fields[11]) + int(fields[12])) / _TICKS


def ancestors(pid: int, proc: Path = PROC) -> list[int]:
    """The processes that started `pid`, nearest first, from /proc/PID/stat (field 4); those that exited end it."""
    found: list[int] = []
    while True:
        try:
            pid = int(_stat_fields(pid, proc)[1])
        except OSError:
            return found
        if pid <= 0:
            return found
        found.append(pid)


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
    return any(other not in mine and _alive(other) for other in scope_pids)


def _alive(pid: int, proc: Path = PROC) -> bool:
    return (proc / str(pid)).is_dir() if proc.is_dir() else bool(_psutil().pid_exists(pid))


def children_listed(pid: int, proc: Path = PROC) -> bool:
    """True if the kernel lists the children of `pid`'s threads (`/proc/PID/task/PID/children`)."""
    return (proc / str(pid) / "task" / str(pid) / "children").exists()


def descendants(pid: int, proc: Path = PROC) -> list[int]:
    """The processes `pid` started and those they started, from the kernel's per-thread lists of children.

    A process or thread that exits while the tree is read is left out. Call it only where `children_listed`.
    """
    found: list[int] = []
    parents = [pid]
    while parents:
        tasks = proc / str(parents.pop()) / "task"
        try:
            threads = os.listdir(tasks)
        except OSError:
            continue  # the process exited
        for thread in threads:
            try:
                text = (tasks / thread / "children").read_text(encoding="ascii")
            except OSError:
                continue  # the thread exited
            children = [int(child) for child in text.split()]
            found += children
            parents += children
    return found


class ProcessTreeCpu:
    """Percent of the host's CPUs this process and its descendants used since the previous call; 0 on the first."""

    name = "process-tree"

    def __init__(self, clock: Clock, pid: int | None = None, cpus: int | None = None, proc: Path = PROC) -> None:
        self._clock = clock
        self._pid = os.getpid() if pid is None else pid
        self._cpus = cpus or os.cpu_count() or 1
        self._seconds: dict[int, float] = {}
        self._at: float | None = None
        self._proc = proc
        self._listed = children_listed(self._pid, proc)  # else psutil lists and reads the tree (module docstring)

    def _tree(self) -> dict[int, float]:
        """CPU seconds (user + system) of each live process of the tree."""
        if not self._listed:
            return self._psutil_tree()
        try:
            seconds = {self._pid: cpu_seconds(self._pid, self._proc)}
        except OSError as exc:
            raise MetricSourceError(f"cannot read the process tree of {self._pid}: {exc}") from exc
        for pid in descendants(self._pid, self._proc):
            try:
                seconds[pid] = cpu_seconds(pid, self._proc)
            except OSError:
                continue  # exited between listing and reading: its last interval is not counted
        return seconds

    def _psutil_tree(self) -> dict[int, float]:
        psutil = _psutil()
        try:
            root = psutil.Process(self._pid)
            processes = [root, *root.children(recursive=True)]
            times = root.cpu_times()
        except psutil.Error as exc:
            raise MetricSourceError(f"cannot read the process tree of {self._pid}: {exc}") from exc
        seconds = {self._pid: times.user + times.system}
        for process in processes[1:]:
            try:
                times = process.cpu_times()
            except psutil.Error:
                continue  # exited between listing and reading
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
