"""A replica on a virtual clock for API tests: real store, real lock and leader loop, the app via TestClient."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from shardherd.coordinator.leader_lock import LeaderLock
from shardherd.coordinator.leader_loop import LeaderLoop
from shardherd.coordinator.run_summary import RunSummary
from shardherd.services.api import ApiContext, create_app
from shardherd.services.leader_status import MIN_PUBLISH_SECONDS, LeaderWatch
from shardherd.shared.clock import ManualClock
from shardherd.shared.config import load_settings
from shardherd.shared.shards import MAX_HASH_KEY, Shard
from shardherd.shared.store import LeaseStore
from shardherd.shared.worker import CPU_METRIC, LeaseProgress, WorkerRecord

INTERVAL = 2.0
TOKEN = "s3cret-token-0123456789"


def even_shards(count: int) -> list[Shard]:
    """`count` open shards splitting the hash key space evenly."""
    width = (MAX_HASH_KEY + 1) // count
    return [Shard(f"shardId-{i:012d}", None, None, str(i * width),
                  str(MAX_HASH_KEY if i == count - 1 else (i + 1) * width - 1), str(100 + i)) for i in range(count)]


class Replica:
    """One coordinator replica (lock, loop, watch, API) plus workers that heartbeat through the store."""

    def __init__(self, store: LeaseStore, shards: int = 6, replica_id: str = "coord-a",
                 clock: ManualClock | None = None, publish_every: float = MIN_PUBLISH_SECONDS,
                 **settings: Any) -> None:
        self.store = store
        self.clock = clock or ManualClock()
        self.shards = even_shards(shards)
        # Every request reads afresh unless a test asks for the snapshot cache (test_api_snapshot.py does).
        settings.setdefault("api_cache_millis", 0)
        self.settings = load_settings(application_name="api-test", worker_id=replica_id,
                                      lease_assignment_interval_millis=int(INTERVAL * 1000), **settings)
        self.watch = LeaderWatch(store, replica_id, self.clock, min_interval=publish_every)
        self.lock = LeaderLock(store, replica_id, self.clock, self.settings.leader_lock_lease_duration_millis,
                               self.settings.leader_lock_heartbeat_period_millis, on_change=self.watch.on_lock_change,
                               last_success=self.watch.last_success_wall)
        self.loop = LeaderLoop(store, self.lock, self.settings, self.clock, shard_source=lambda: list(self.shards),
                               on_run=lambda summary: self.watch.on_run(summary, self.loop.viewed_leases),
                               published_scale=self.watch.published_scale)
        self.context = ApiContext(self.settings, store, self.lock, self.loop, self.watch, self.clock)
        self.client = TestClient(create_app(self.context))
        self.beats: dict[str, int] = {}
        self.cpu: dict[str, float] = {}
        self.lease_throughput: dict[str, dict[str, float]] = {}
        self.lease_progress: dict[str, dict[str, LeaseProgress]] = {}

    def join(self, worker: str, cpu: float = 20.0) -> None:
        """A worker starts heartbeating with a CPU reading."""
        self.beats.setdefault(worker, 0)
        self.cpu[worker] = cpu

    def leave(self, worker: str) -> None:
        """A worker stops heartbeating (kill -9)."""
        self.cpu.pop(worker, None)

    def heartbeat(self) -> None:
        """Every live worker writes its record, keeping an operator's drain flag untouched."""
        for worker, cpu in sorted(self.cpu.items()):
            self.beats[worker] += 1
            self.store.upsert_worker(WorkerRecord(
                worker, int(self.clock.time()), metric_stats={CPU_METRIC: (cpu, cpu)},
                operating_range={CPU_METRIC: (100.0,)}, heartbeat=self.beats[worker],
                lease_throughput=self.lease_throughput.get(worker, {}),
                lease_progress=self.lease_progress.get(worker, {})))

    def step(self, runs: int = 1) -> list[RunSummary | None]:
        """Heartbeat, tick the lock, run the loop, advance one interval; `runs` times."""
        summaries = []
        for _ in range(runs):
            self.heartbeat()
            self.lock.tick()
            summaries.append(self.loop.run_once())
            self.clock.advance(INTERVAL)
        return summaries

    def owners(self) -> dict[str, str | None]:
        """Lease key -> leaseOwner as stored."""
        return {lease.lease_key: lease.lease_owner for lease in self.store.scan_leases().leases}

    def auth(self) -> dict[str, str]:
        """The bearer header with the right token."""
        return {"Authorization": f"Bearer {TOKEN}"}
