"""One snapshot of what the API serves (fleet, lock, published status) per replica, reused for a short time.

Every request, page and scrape of the operator API used to scan both tables (and read the lock and the status item);
a dashboard paging through 10,000 leases every 3 s made that the biggest read cost of the system. Now a replica takes
at most one snapshot per `max_age` seconds however many clients ask (one per REFRESH_AHEAD x `max_age` while callers
with a token keep coming, invariant 2, plus a caller's own read overlapping a slow refresh). The leader replica builds
it from its newest run's scans, the lock as it last wrote it and the status it last published or read: no store read
at all. A replica that does not lead takes the leader's snapshot over HTTP (services/api/peer.py), and reads the store
itself only while the leader does not answer (docs/store-cost.md), and never for an anonymous caller: that one gets
what is at hand, however old (docs/decisions/0021-api-credentials-and-load.md).

Invariants:
1. A caller with a token is served tables at most `max_age` old (issue 33); an anonymous caller never causes a read.
2. With the refresher's thread started (`threaded()`, then `step` run by a supervised loop), a caller with a token who
   finds the tables older than REFRESH_AHEAD x `max_age` (but not older than `max_age`) asks it for new ones and is
   served the cached ones: while such callers keep coming, none waits on a store read. Only a caller finding them older
   than `max_age` (none came for a while, or the refresh failed or is slow) takes them itself, as without the thread.
3. The refresher reads only when asked by such a caller, and at most one refresh is in flight: an idle API reads
   nothing. Its reads run under a deadline (REFRESH_DEADLINE_SECONDS) and count as the API's (caller `api`); a
   failed refresh raises in its supervised thread (logged and counted there) and leaves the cache as it was, so
   invariant 1 still decides what callers get. A refresh that leaves the tables ageing (a replica that does not lead
   got the leader's, which were no newer: the leader refreshes its own meanwhile) is not repeated before
   REFETCH_AFTER x `max_age`: each ask used to fetch the leader's whole snapshot again.
4. The same scans are judged once (the leader's view is one tuple until its next run): an anonymous caller served the
   leader's view past `max_age` (never cached as fresh) reuses the fleet judged for the previous one. Judging is a
   function of the scans as of their read time, so the fleet is the one a second judging would give.
5. `at_hand` never waits, not even for the guard (a caller may hold it over a store read): it serves the cached
   snapshot (one record, replaced whole) when `get` would, else None, so a handler on the event loop serves from it
   and hands everything else (a judging, an HTTP call, a store read) to a worker thread (services/api/context.py
   `served`).
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
from shardherd.shared.retry import retry_deadline
from shardherd.shared.store import LeaseScan, LeaseStore, WorkerScan
from shardherd.shared.store_meter import acting_as

Scans = tuple[LeaseScan, WorkerScan]
TimedScans = tuple[LeaseScan, WorkerScan, float]  # with the monotonic time they were read

REFRESH_AHEAD = 0.5  # a caller with a token finding tables older than this share of max_age asks for new ones
REFRESH_DEADLINE_SECONDS = 5.0  # the refresher's store retries give up rather than sleep past this
REFETCH_AFTER = 0.25  # a fetch that left the tables ageing: the refresher's next not before this share of max_age
REQUEST_WAIT_SECONDS = 0.25  # how long one refresher step waits to be asked (so its loop can stop)


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


@dataclass(frozen=True, slots=True)
class _Taken:
    """A snapshot as fetched: the leader's scans it was built from (on the leader), and when its tables were read."""

    snapshot: ApiSnapshot
    source: TimedScans | None
    data_at: float


@dataclass(frozen=True, slots=True)
class _Kept:
    """The cached snapshot: as taken, and when it was (anonymous callers share it for max_age)."""

    snapshot: ApiSnapshot
    source: TimedScans | None  # the leader's scans it was built from, if it was
    data_at: float  # when its tables were read
    taken: float


class SnapshotCache:
    """The replica's ApiSnapshot, refreshed once it is `max_age` seconds old, or ahead of that by `step` (thread-safe).

    Callers refresh under the guard, one at a time; the refresher fetches outside it and keeps only newer tables.
    """

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
        self._kept: _Kept | None = None  # replaced whole under the guard, read whole without it (invariant 5)
        self._guard = threading.Lock()
        self._threaded = False
        self._asked = threading.Event()  # a caller with a token found the tables ageing (invariant 2)
        self._quiet_until = -math.inf  # the refresher's source had nothing newer: no fetch before (invariant 3)
        self._judged: tuple[TimedScans, Fleet] | None = None  # the newest scans judged, and their fleet (invariant 4)

    def get(self, may_read_store: bool = True, fresh: bool = False) -> ApiSnapshot:
        """The cached snapshot, or a fresh one: the leader's own, the leader's over HTTP, else read from the store.

        On the leader a newer run's view replaces the cached snapshot at once (it costs no store read), so the ages
        and rates served there are as fresh as the leader's own view. Without `may_read_store` (an anonymous caller)
        the store is never read: the leader's own view however old its scans, else the last snapshot however old,
        else NothingAtHand. With `fresh` a caller with a token gets tables at most `max_age` old (the leader's view
        only while it is, else a read): the operator views; scrapes and autoscalers take the view as it is. Such a
        caller finding them older than REFRESH_AHEAD x `max_age` asks the refresher for new ones (invariant 2).
        """
        recent = fresh and may_read_store  # tables at most max_age old (issue 33)
        with self._guard:
            now = self._clock.monotonic()
            cached = self._cached(now, recent)
            if cached is not None:
                return cached
            taken = self._fetch(now, self.max_age, recent, may_read_store)
            if taken is None:
                return self._without_reading(now)
            return self._served(now, self._keep(taken, now))

    def at_hand(self, may_read_store: bool = True, fresh: bool = False) -> ApiSnapshot | None:
        """`get`'s answer when it is the cached snapshot, else None: never waits (invariant 5).

        Lock-free: served while another caller holds the guard over a store read. On None, ask `get` from a thread.
        """
        return self._cached(self._clock.monotonic(), fresh and may_read_store)

    def threaded(self) -> None:
        """From now on callers with a token ask `step` (a supervised thread) for new tables ahead of `max_age`."""
        self._threaded = True

    def step(self) -> None:
        """The refresher's step: wait briefly to be asked, then fetch new tables and keep them if newer (invariant 3).

        Fetched outside the guard, so callers meanwhile are served the cached snapshot; the leader's own view counts
        only while younger than REFRESH_AHEAD x `max_age` (an older one would be asked for again at once).
        """
        if not self._asked.wait(REQUEST_WAIT_SECONDS):
            return
        self._asked.clear()
        with self._guard:
            now = self._clock.monotonic()
            if not self._ageing(now) or now < self._quiet_until:
                return  # a caller or the leader's newer view renewed it meanwhile, or its source has nothing newer
        started = self._clock.monotonic()
        with acting_as("api"), retry_deadline(started + REFRESH_DEADLINE_SECONDS):
            taken = self._fetch(started, REFRESH_AHEAD * self.max_age, recent=True, may_read_store=True)
        assert taken is not None  # may_read_store: a read at worst
        with self._guard:
            now = self._clock.monotonic()
            if self._kept is None or taken.data_at > self._kept.data_at:
                self._keep(taken, now)
            if self._ageing(now):  # a follower's leader between its own refreshes: ask it again only after a while
                self._quiet_until = now + REFETCH_AFTER * self.max_age

    def _cached(self, now: float, recent: bool) -> ApiSnapshot | None:
        """The cached snapshot as of `now` if it will do (asking the refresher if ageing, invariant 2), else None."""
        kept = self._kept
        if kept is None or not self._cached_will_do(now, recent, kept):
            return None
        if recent and self._threaded and self._ageing(now):
            self._asked.set()
        return self._served(now, kept)

    def _served(self, now: float, kept: _Kept) -> ApiSnapshot:
        """The kept snapshot with its tables' age as of `now`."""
        return replace(kept.snapshot, age=now - kept.data_at)

    def _ageing(self, now: float) -> bool:
        """The cached tables are due for a refresh ahead of callers (older than REFRESH_AHEAD x max_age)."""
        kept = self._kept
        return kept is not None and now - kept.data_at > REFRESH_AHEAD * self.max_age

    def _fetch(self, now: float, max_age: float, recent: bool, may_read_store: bool) -> _Taken | None:
        """A new snapshot: the leader's own, else the leader's over HTTP, else (if `may_read_store`) a read."""
        own = self._own(max_age, fresh=recent)
        if own is not None:
            return _Taken(own[0], own[1], min(now, own[1][2]))
        got = self._from_leader(recent) if self._from_leader is not None else None
        if got is not None:
            return _Taken(got, None, now - got.age)
        return _Taken(self._read(max_age, recent), None, now) if may_read_store else None

    def _keep(self, taken: _Taken, now: float) -> _Kept:
        """Cache `taken` as of `now`; its tables' age counts from when they were read, not from now (issue 33)."""
        self._kept = _Kept(taken.snapshot, taken.source, taken.data_at, now)
        return self._kept

    def _cached_will_do(self, now: float, recent: bool, kept: _Kept) -> bool:
        """The cached snapshot may be served.

        It was taken within max_age, the leader has no newer view, and (for `recent`) its tables are at most max_age
        old.
        """
        return (now - kept.taken < self.max_age and not self._newer_view(kept)
                and (not recent or now - kept.data_at <= self.max_age))

    def _without_reading(self, now: float) -> ApiSnapshot:
        """For an anonymous caller when nothing fresh is at hand: the leader's own view or the last snapshot.

        Either however old, and neither is cached as fresh: the next caller with a token still refreshes.
        """
        own = self._own(math.inf)
        if own is not None:
            return replace(own[0], age=max(0.0, now - own[1][2]))
        if self._kept is None:
            raise NothingAtHand("no snapshot at hand yet, and an anonymous request never makes this replica "
                                "read the store: retry shortly, or send the read token")
        return self._served(now, self._kept)

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

    def _newer_view(self, kept: _Kept) -> bool:
        """The snapshot was built from the leader's view, and the leader has a newer one."""
        return kept.source is not None and self._leader_scans(self.max_age) not in (None, kept.source)

    def _view(self, max_age: float, recent: bool) -> TimedScans | None:
        """The leader's scans as `_leader_scans` gives them, or with `recent` only while at most `max_age` old."""
        scans = self._leader_scans(max_age)
        if recent and scans is not None and self._clock.monotonic() - scans[2] > max_age:
            return None
        return scans

    def _read(self, max_age: float, recent: bool) -> ApiSnapshot:
        """The snapshot from the store (the leader's scans where fresh enough), when no leader's snapshot is at hand."""
        scans = self._view(max_age, recent)
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
        """The fleet of `scans`, judged once per scans (invariant 4): the same scans judge the same as of their time."""
        judged = self._judged
        if judged is not None and judged[0] is scans:
            return judged[1]
        leases, workers, read_at = scans
        fleet = judge_fleet(leases, workers, self._settings, self._heartbeats, self._grace, self._checkpoints,
                            at=read_at)
        self._judged = (scans, fleet)
        return fleet
