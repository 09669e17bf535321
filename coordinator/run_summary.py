"""What one leader run did, kept in a bounded history the operator API serves (KCL keeps none of this)."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

from shardherd.coordinator.moves import Plan
from shardherd.coordinator.scale_model import ScaleFigure


@dataclass(frozen=True, slots=True)
class WriteTally:
    """Outcomes of the run's store writes."""

    handoffs_started: int = 0
    assigned: int = 0
    lost_races: int = 0
    created: int = 0
    deleted: int = 0
    workers_deleted: int = 0  # stale worker rows removed (stale_worker_metrics_entry_cleanup_seconds)


@dataclass(frozen=True, slots=True)
class RunSummary:
    """One leader run: when, how long, on what, what it decided, what landed, and why it failed if it did."""

    epoch: int
    started_at: float  # wall clock, for display only
    duration_ms: float
    leases: int
    active_workers: int
    expired_leases: int
    malformed_rows: int
    balanced_this_run: bool
    plan: Plan | None
    writes: WriteTally = field(default_factory=WriteTally)
    shard_sync_ran: bool = False
    error: str | None = None
    shard_sync_error: str | None = None  # the run went on without shard sync (leases were still assigned)
    balancing_error: str | None = None  # the run went on without balancing (leases were still assigned)
    decide_ms: float = 0.0  # wall time in the decider (its CPU, and the host's other threads and processes)
    scanned: bool = True  # a full run (both tables scanned); False: a tick on the leader's view (scan_policy)
    scan_ms: float = 0.0  # a full run's time reading both tables (wall clock: store waits and this process's CPU)
    scan_reason: str | None = None  # why a full run scanned
    scale: ScaleFigure | None = None  # the desired-worker count of a full run (coordinator/scale_model.py)
    worker_rows: int = 0  # rows in the worker table, live or not (a full run's scan)
    # Wall milliseconds of each part of the run besides `scan` and `decide` (RunLaps), and the run thread's CPU time:
    # a run slowed by the host shows wall far above CPU; one doing too much work shows both high.
    parts: Mapping[str, float] = field(default_factory=dict)
    cpu_ms: float = 0.0

    @property
    def ok(self) -> bool:
        """True if the run completed (placed and wrote its plan), even if shard sync or balancing failed."""
        return self.error is None

    def moves_by_reason(self) -> dict[str, int]:
        """Move counts keyed by reason name (empty for a failed run)."""
        if self.plan is None:
            return {}
        return {reason.value: count for reason, count in self.plan.moves_by_reason().items()}


# A full run's parts in the order it runs them (LeaderLoop._run's laps); `scan` and `decide` have summary fields.
FULL_RUN_PARTS = ("scan", "observe", "sync", "views", "decide", "write", "feed", "cleanup")


class RunLaps:
    """Where a run's time goes: consecutive laps of wall time (perf_counter), and the thread's CPU time since start.

    Each `lap(part)` ends the current part and starts the next, so the parts add up to the run's wall time with no
    gap: nothing the run does goes unaccounted. Wall time includes store waits and the time other threads and
    processes held the cores; `cpu_ms` is this thread's own work (`time.thread_time`), so the two tell a run slowed by
    the host from one doing too much.
    """

    def __init__(self) -> None:
        self._mark = time.perf_counter()
        self._cpu = time.thread_time()
        self._parts: dict[str, float] = {}

    def lap(self, part: str) -> float:
        """End the current lap as `part` (added to earlier laps of that name); its milliseconds."""
        now = time.perf_counter()
        spent = (now - self._mark) * 1000
        self._parts[part] = self._parts.get(part, 0.0) + spent
        self._mark = now
        return spent

    def parts(self, *leaving_out: str) -> dict[str, float]:
        """Milliseconds per part so far, but for the parts named in `leaving_out` (a summary has fields for them)."""
        return {part: ms for part, ms in self._parts.items() if part not in leaving_out}

    def cpu_ms(self) -> float:
        """CPU milliseconds of the calling thread since the laps started."""
        return (time.thread_time() - self._cpu) * 1000


class RunHistory:
    """The last N run summaries, safe to read from the API thread while the leader loop appends."""

    def __init__(self, size: int = 50) -> None:
        self._runs: deque[RunSummary] = deque(maxlen=size)
        self._guard = threading.Lock()

    def append(self, summary: RunSummary) -> None:
        """Record a run."""
        with self._guard:
            self._runs.append(summary)

    def recent(self) -> list[RunSummary]:
        """Oldest first."""
        with self._guard:
            return list(self._runs)

    def last_success(self) -> RunSummary | None:
        """The newest successful run, if any."""
        with self._guard:
            return next((run for run in reversed(self._runs) if run.ok), None)
