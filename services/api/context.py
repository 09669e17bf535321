"""Everything a request handler needs from the replica, in one object stored on the app."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from fastapi import HTTPException, Request, status
from starlette.concurrency import run_in_threadpool

from shardherd.coordinator.leader_lock import LeaderLock
from shardherd.coordinator.leader_loop import LeaderLoop, LoopTiming
from shardherd.services.api.auth import Access, ApiTokens
from shardherd.services.api.fleet import CheckpointAges, HeartbeatObserver
from shardherd.services.api.plan_cache import PlanCache
from shardherd.services.api.rendered import PerFleet
from shardherd.services.api.snapshot import ApiSnapshot, NothingAtHand, SnapshotCache
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
    from_leader: Callable[[bool], ApiSnapshot | None] | None = None  # True: for a caller with a token
    # The replica's supervised threads: /healthz fails while a critical one makes no progress (decision 0022).
    supervisor: Supervisor | None = None
    tokens: ApiTokens = field(init=False)
    heartbeats: HeartbeatObserver = field(init=False)
    checkpoints: CheckpointAges = field(init=False)
    timing: LoopTiming = field(init=False)
    snapshots: SnapshotCache = field(init=False)
    plans: PlanCache = field(init=False)
    rendered: PerFleet = field(init=False)  # what handlers render from a fleet alone, once per fleet

    def __post_init__(self) -> None:
        self.tokens = ApiTokens.from_settings(self.settings)
        self.timing = LoopTiming.from_settings(self.settings)
        self.heartbeats = HeartbeatObserver(self.clock)
        self.checkpoints = CheckpointAges(self.clock)
        self.snapshots = SnapshotCache(self.store, self.lock, self.settings, self.heartbeats,
                                       self.timing.grace, self.clock, self.settings.api_cache_millis / 1000,
                                       self.loop.latest_scans, self.checkpoints, self.watch.stored_status,
                                       self._leaders_snapshot)
        # At most one dry run (two scans and a decide) per assignment interval, or per cache age if longer.
        self.rendered = PerFleet()
        self.plans = PlanCache(self.loop.dry_run, self.clock, max(self.timing.interval, self.snapshots.max_age))

    def _leaders_snapshot(self, fresh: bool) -> ApiSnapshot | None:
        """The leader replica's snapshot, asked for only while this replica does not lead (`fresh`: SnapshotCache)."""
        return None if self.from_leader is None or self.lock.is_leader() else self.from_leader(fresh)

    def snapshot(self, access: Access, fresh: bool = False) -> ApiSnapshot:
        """Fleet, lock and leader status as this replica serves them now (cached; see SnapshotCache).

        For an anonymous caller only from what is at hand (never a store read): 503 when nothing is yet. `fresh`
        (the operator views: assignments, workers, leader) asks for tables at most `api_cache_millis` old for a caller
        with a token; scrapes and autoscalers take the leader's view, which costs no read.
        """
        try:
            return self.snapshots.get(may_read_store=access is not Access.ANONYMOUS, fresh=fresh)
        except NothingAtHand as exc:
            raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, str(exc), headers={"Retry-After": "2"}) from exc

    async def served(self, access: Access, fresh: bool = False) -> ApiSnapshot:
        """`snapshot` for a handler on the event loop: the cached snapshot there, else from a worker thread.

        Only a snapshot at hand is served on the loop (SnapshotCache.at_hand never waits); one that needs fetching
        (judging the leader's newer view, asking the leader, reading the store) is made in a worker thread, so the
        loop never waits on a store read or on another caller's.
        """
        at_hand = self.snapshots.at_hand(may_read_store=access is not Access.ANONYMOUS, fresh=fresh)
        if at_hand is not None:
            return at_hand
        return await run_in_threadpool(self.snapshot, access, fresh)

    @property
    def stall_limit_seconds(self) -> float:
        """How long the leader may go without a successful run before /readyz fails."""
        return self.stall_intervals * self.timing.interval


async def context(request: Request) -> ApiContext:
    """FastAPI dependency: the app's ApiContext (async: a sync dependency costs each request a worker thread hop)."""
    ctx: ApiContext = request.app.state.ctx
    return ctx
