"""One snapshot of what the API serves (fleet, lock, published status) per replica, reused for a short time.

Every request, page and scrape of the operator API used to scan both tables (and read the lock and the status item);
a dashboard paging through 10,000 leases every 3 s made that the biggest read cost of the system. Now a replica takes
at most one snapshot per `max_age` seconds however many clients ask. The leader replica builds it from its newest
run's scans, the lock as it last wrote it and the status it last published or read: no store read at all. A replica
that does not lead takes the leader's snapshot over HTTP (services/api/peer.py), and reads the store itself only
while the leader does not answer (docs/store-cost.md), and never for an anonymous caller: that one gets what is at
hand, however old (docs/decisions/0021-api-credentials-and-load.md).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace

from shardherd.coordinator.leader_lock import LeaderLock, LockView
from shardherd.coordinator.liveness import WorkerGrace
from shardherd.services.api.fleet import CheckpointAges, Fleet, HeartbeatObserver, judge_fleet
from shardherd.services.leader_status import LeaderStatus, MalformedLeaderStatus, read_status, with_recorded_moves
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
    age: float = 0.0  # seconds since its tables were read, as of when it was handed out


class NothingAtHand(Exception):
    """No snapshot can be served without reading the store (asked for a caller who may not cause a read)."""


class SnapshotCache:
    """The replica's ApiSnapshot, refreshed once it is `max_age` seconds old (thread-safe; one refresh at a time)."""

    def __init__(self, store: LeaseStore, lock: LeaderLock, settings: Settings, heartbeats: HeartbeatObserver,
                 grace: WorkerGrace, clock: Clock, max_age: float,
                 leader_scans: Callable[[float], TimedScans | None], checkpoints: CheckpointAges | None = None,
                 own_status: Callable[[], tuple[bool, LeaderStatus | None]] | None = None,
                 from_leader: Callable[[bool], ApiSnapshot | None] | None = None) -> None:
        self._store = store
        self._lock = lock
        self._settings = settings
        self._heartbeats = heartbeats
        self._grace = grace
        self._clock = clock
        self.max_age = max_age
        self._leader_scans = leader_scans
        self._checkpoints = checkpoints
        self._own_status = own_status
        self._from_leader = from_leader
        self._snapshot: ApiSnapshot | None = None
        self._source: TimedScans | None = None  # the leader's scans the snapshot was built from, if it was
        self._taken = 0.0  # when the cached snapshot was made (anonymous callers share it for max_age)
        self._data_at = 0.0  # when its tables were read
        self._guard = threading.Lock()

    def get(self, may_read_store: bool = True, fresh: bool = False) -> ApiSnapshot:
        """The cached snapshot, or a fresh one: the leader's own, the leader's over HTTP, else read from the store.

        On the leader a newer run's view replaces the cached snapshot at once (it costs no store read), so the ages
        and rates served there are as fresh as the leader's own view. Without `may_read_store` (an anonymous caller)
        the store is never read: the leader's own view however old its scans, else the last snapshot however old,
        else NothingAtHand. With `fresh` a caller with a token gets tables at most `max_age` old (the leader's view
        only while it is, else a read): the operator views; scrapes and autoscalers take the view as it is.
        """
        recent = fresh and may_read_store  # tables at most max_age old (issue 33)
        with self._guard:
            now = self._clock.monotonic()
            if self._cached_will_do(now, recent):
                assert self._snapshot is not None
                return replace(self._snapshot, age=now - self._data_at)
            own = self._own(self.max_age, fresh=recent)
            got = own[0] if own is not None else (self._from_leader(recent) if self._from_leader is not None else None)
            if got is None and not may_read_store:
                return self._without_reading(now)
            self._source = own[1] if own is not None else None
            self._snapshot = got if got is not None else self._read(recent)
            self._taken = now
            # Its tables' age, not this copy's: a caller with a token gets them at most max_age old (issue 33).
            self._data_at = min(now, own[1][2] if own is not None else now - (got.age if got is not None else 0.0))
            return replace(self._snapshot, age=now - self._data_at)

    def _cached_will_do(self, now: float, recent: bool) -> bool:
        """The cached snapshot may be served.

        It was taken within max_age, the leader has no newer view, and (for `recent`) its tables are at most max_age
        old.
        """
        return (self._snapshot is not None and now - self._taken < self.max_age and not self._newer_view()
                and (not recent or now - self._data_at <= self.max_age))

    def _without_reading(self, now: float) -> ApiSnapshot:
        """For an anonymous caller when nothing fresh is at hand: the leader's own view or the last snapshot.

        Either however old, and neither is cached as fresh: the next caller with a token still refreshes.
        """
        kept = self._own(math.inf)
        if kept is not None:
            return replace(kept[0], age=max(0.0, now - kept[1][2]))
        if self._snapshot is None:
            raise NothingAtHand("no snapshot at hand yet, and an anonymous request never makes this replica "
                                "read the store: retry shortly, or send the read token")
        return replace(self._snapshot, age=now - self._data_at)

    def _own(self, max_age: float, fresh: bool = False) -> tuple[ApiSnapshot, TimedScans] | None:
        """On the leader: its own snapshot and the run's scans it is built from; None where one part is not at hand.

        `fresh` takes the leader's view only while its scans are at most `max_age` old: between full runs the leader
        ticks on a view up to a full-scan interval old, whose checkpoints (agents write them, not the leader) and
        heartbeats are that old too; a caller who may cause a read gets them from the store instead (issue 33).
        """
        scans = self._view(max_age, fresh)
        lock = self._lock.own_view()
        known, status = self._own_status() if self._own_status is not None else (False, None)
        if scans is None or lock is None or not known:
            return None
        return ApiSnapshot(self._judge(scans), lock, status, None), scans

    def _newer_view(self) -> bool:
        """The snapshot was built from the leader's view, and the leader has a newer one."""
        return self._source is not None and self._leader_scans(self.max_age) not in (None, self._source)

    def _view(self, max_age: float, recent: bool) -> TimedScans | None:
        """The leader's scans as `_leader_scans` gives them, or with `recent` only while at most `max_age` old."""
        scans = self._leader_scans(max_age)
        if recent and scans is not None and self._clock.monotonic() - scans[2] > max_age:
            return None
        return scans

    def _read(self, recent: bool) -> ApiSnapshot:
        """The snapshot from the store (the leader's scans where fresh enough), when no leader's snapshot is at hand."""
        scans = self._view(self.max_age, recent)
        if scans is None:
            worker_scan = self._store.scan_workers()
            scans = (self._store.scan_leases(), worker_scan, self._clock.monotonic())
        # On the leader the lock (it writes it) and the status (it publishes it) are at hand however old its scans.
        lock = self._lock.own_view()
        known, status = self._own_status() if self._own_status is not None else (False, None)
        if lock is not None and known:
            return ApiSnapshot(self._judge(scans), lock, status, None)
        try:  # views for operators: eventually consistent reads (half price) are fresh enough
            # With the moves recorded on the lease rows: a killed leader's last moves are there before its successor
            # publishes them.
            status, problem = with_recorded_moves(read_status(self._store, consistent=False), scans[0].leases), None
        except MalformedLeaderStatus as exc:
            status, problem = None, str(exc)
        return ApiSnapshot(self._judge(scans), self._lock.read(consistent=False), status, problem)

    def _judge(self, scans: TimedScans) -> Fleet:
        leases, workers, read_at = scans
        return judge_fleet(leases, workers, self._settings, self._heartbeats, self._grace, self._checkpoints,
                           at=read_at)
