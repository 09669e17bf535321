"""One snapshot of what the API serves (fleet, lock, published status) per replica, reused for a short time.

Every request, page and scrape of the operator API used to scan both tables (and read the lock and the status item);
a dashboard paging through 10,000 leases every 3 s made that the biggest read cost of the system. Now a replica reads
at most once per `max_age` seconds however many clients ask, and the leader replica reuses its newest run's scans, so
dashboards and scrapes there cost one lock and one status read per `max_age` (docs/store-cost.md).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from shardherd.coordinator.leader_lock import LeaderLock, LockView
from shardherd.coordinator.liveness import WorkerGrace
from shardherd.services.api.fleet import CheckpointAges, Fleet, HeartbeatObserver, judge_fleet
from shardherd.services.leader_status import LeaderStatus, MalformedLeaderStatus, read_status
from shardherd.shared.clock import Clock
from shardherd.shared.config import Settings
from shardherd.shared.store import LeaseScan, LeaseStore, WorkerScan

Scans = tuple[LeaseScan, WorkerScan]
TimedScans = tuple[LeaseScan, WorkerScan, float]  # with the monotonic time they were read


@dataclass(frozen=True, slots=True)
class ApiSnapshot:
    """What the API serves: the judged fleet, the lock item, and the leader's status (or why it is unreadable)."""

    fleet: Fleet
    lock: LockView
    status: LeaderStatus | None
    status_problem: str | None


class SnapshotCache:
    """The replica's ApiSnapshot, refreshed once it is `max_age` seconds old (thread-safe; one refresh at a time)."""

    def __init__(self, store: LeaseStore, lock: LeaderLock, settings: Settings, heartbeats: HeartbeatObserver,
                 grace: WorkerGrace, clock: Clock, max_age: float,
                 leader_scans: Callable[[float], TimedScans | None], checkpoints: CheckpointAges | None = None) -> None:
        self._store = store
        self._lock = lock
        self._settings = settings
        self._heartbeats = heartbeats
        self._grace = grace
        self._clock = clock
        self.max_age = max_age
        self._leader_scans = leader_scans
        self._checkpoints = checkpoints
        self._snapshot: ApiSnapshot | None = None
        self._taken = 0.0
        self._guard = threading.Lock()

    def get(self) -> ApiSnapshot:
        """The cached snapshot, or a fresh one (from the leader's scans when this replica leads)."""
        with self._guard:
            now = self._clock.monotonic()
            if self._snapshot is not None and now - self._taken < self.max_age:
                return self._snapshot
            scans = self._leader_scans(self.max_age)
            if scans is None:
                worker_scan = self._store.scan_workers()
                scans = (self._store.scan_leases(), worker_scan, self._clock.monotonic())
            leases, workers, read_at = scans
            fleet = judge_fleet(leases, workers, self._settings, self._heartbeats, self._grace, self._checkpoints,
                                at=read_at)
            try:  # views for operators: eventually consistent reads (half price) are fresh enough
                status, problem = read_status(self._store, consistent=False), None
            except MalformedLeaderStatus as exc:
                status, problem = None, str(exc)
            self._snapshot = ApiSnapshot(fleet, self._lock.read(consistent=False), status, problem)
            self._taken = now
            return self._snapshot
