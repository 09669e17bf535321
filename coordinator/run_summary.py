"""What one leader run did, kept in a bounded history the operator API serves (KCL keeps none of this)."""

from __future__ import annotations

import threading
from collections import deque
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
    decide_ms: float = 0.0  # this process's CPU time in the decider (the run's time minus store waits, roughly)
    scanned: bool = True  # a full run (both tables scanned); False: a tick on the leader's view (scan_policy)
    scan_ms: float = 0.0  # a full run's time reading both tables (wall clock: store waits and this process's CPU)
    scan_reason: str | None = None  # why a full run scanned
    scale: ScaleFigure | None = None  # the desired-worker count of a full run (coordinator/scale_model.py)
    worker_rows: int = 0  # rows in the worker table, live or not (a full run's scan)

    @property
    def ok(self) -> bool:
        """True if the run completed (placed and wrote its plan), even if shard sync or balancing failed."""
        return self.error is None

    def moves_by_reason(self) -> dict[str, int]:
        """Move counts keyed by reason name (empty for a failed run)."""
        if self.plan is None:
            return {}
        return {reason.value: count for reason, count in self.plan.moves_by_reason().items()}


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
