"""Host CPU utilisation from the first line of /proc/stat (KCL's Linux CPU metric)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from shardherd.agent.metrics import MetricSourceError

PROC_STAT_PATH = Path("/proc/stat")


@dataclass(frozen=True, slots=True)
class CpuTicks:
    """The counters KCL uses from the aggregate `cpu` line: total = user+nice+system+idle+iowait, idle = idle."""

    total: int
    idle: int


def parse_cpu_line(line: str) -> CpuTicks:
    """Read `cpu user nice system idle [iowait ...]`; iowait counts as busy, irq/softirq/steal are ignored (as KCL)."""
    fields = line.split()
    if len(fields) < 5 or fields[0] != "cpu":
        raise MetricSourceError(f"/proc/stat first line is not an aggregate cpu line: {line.strip()!r}")
    try:
        counters = [int(value) for value in fields[1:6]]
    except ValueError as exc:
        raise MetricSourceError(f"/proc/stat cpu line has a non-integer counter: {line.strip()!r}") from exc
    if any(value < 0 for value in counters):
        raise MetricSourceError(f"/proc/stat cpu line has a negative counter: {line.strip()!r}")
    return CpuTicks(total=sum(counters), idle=counters[3])


class ProcStatCpu:
    """Percent of all host CPUs busy between two reads of /proc/stat; the path is injectable for tests."""

    name = "proc"

    def __init__(self, proc_stat_path: Path = PROC_STAT_PATH) -> None:
        self._path = proc_stat_path
        self._previous: CpuTicks | None = None

    def sample(self) -> float:
        """Busy share of the ticks since the last call; 0 on the first call and when no tick has passed."""
        try:
            with self._path.open(encoding="ascii") as handle:
                first_line = handle.readline()
        except (OSError, UnicodeDecodeError) as exc:
            raise MetricSourceError(f"cannot read {self._path}: {exc}") from exc
        current = parse_cpu_line(first_line)
        previous, self._previous = self._previous, current
        if previous is None:
            return 0.0
        total_delta = current.total - previous.total
        idle_delta = current.idle - previous.idle
        if total_delta < idle_delta or idle_delta < 0:
            # KCL reports 0 here; a made-up 0 would pull the interval's average down, so the sample fails instead.
            raise MetricSourceError(
                f"/proc/stat counters went backwards (total delta {total_delta}, idle delta {idle_delta})"
            )
        if total_delta == 0:
            return 0.0
        return (total_delta - idle_delta) / total_delta * 100.0
