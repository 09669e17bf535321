"""Everything a request handler needs from the replica, in one object stored on the app."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from fastapi import Request

from shardherd.coordinator.leader_lock import LeaderLock
from shardherd.coordinator.leader_loop import LeaderLoop, LoopTiming
from shardherd.services.api.auth import TokenSource
from shardherd.services.api.fleet import CheckpointAges, Fleet, HeartbeatObserver
from shardherd.services.api.snapshot import ApiSnapshot, SnapshotCache
from shardherd.services.leader_status import LeaderWatch
from shardherd.shared.clock import Clock
from shardherd.shared.config import Settings
from shardherd.shared.store import LeaseStore
from shardherd.shared.supervision import Supervisor

# /readyz on the leader fails after this many lease-assignment intervals without a successful run.
STALL_INTERVALS = 5


@dataclass
class ApiContext:
    """The replica's store, lock, loop and leader watch, plus per-replica API state (token, heartbeat sightings)."""

    settings: Settings
    store: LeaseStore
    lock: LeaderLock
    loop: LeaderLoop
    watch: LeaderWatch
    clock: Clock
    stall_intervals: int = STALL_INTERVALS
    # On a replica that does not lead: the leader's snapshot over HTTP (services/peer_client.py), None if it fails.
    from_leader: Callable[[], ApiSnapshot | None] | None = None
    # The replica's supervised threads: /healthz fails while a critical one makes no progress (decision 0022).
    supervisor: Supervisor | None = None
    tokens: TokenSource = field(init=False)
    heartbeats: HeartbeatObserver = field(init=False)
    checkpoints: CheckpointAges = field(init=False)
    timing: LoopTiming = field(init=False)
    snapshots: SnapshotCache = field(init=False)

    def __post_init__(self) -> None:
        self.tokens = TokenSource.from_settings(self.settings)
        self.timing = LoopTiming.from_settings(self.settings)
        self.heartbeats = HeartbeatObserver(self.clock)
        self.checkpoints = CheckpointAges(self.clock)
        self.snapshots = SnapshotCache(self.store, self.lock, self.settings, self.heartbeats,
                                       self.timing.grace, self.clock, self.settings.api_cache_millis / 1000,
                                       self.loop.latest_scans, self.checkpoints, self.watch.stored_status,
                                       self._leaders_snapshot)

    def _leaders_snapshot(self) -> ApiSnapshot | None:
        """The leader replica's snapshot, asked for only while this replica does not lead."""
        return None if self.from_leader is None or self.lock.is_leader() else self.from_leader()

    def snapshot(self) -> ApiSnapshot:
        """Fleet, lock and leader status as this replica serves them now (cached; see SnapshotCache)."""
        return self.snapshots.get()

    def fleet(self) -> Fleet:
        """Workers and leases as this replica serves them now."""
        return self.snapshot().fleet

    @property
    def stall_limit_seconds(self) -> float:
        """How long the leader may go without a successful run before /readyz fails."""
        return self.stall_intervals * self.timing.interval


def context(request: Request) -> ApiContext:
    """FastAPI dependency: the app's ApiContext."""
    ctx: ApiContext = request.app.state.ctx
    return ctx
