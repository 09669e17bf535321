"""A leader run is not all-or-nothing: a failing shard sync (real ListShards on kinesalite through a fault proxy, a
deleted stream, a listing that does not tile) is reported while dead workers' leases are still failed over, run after
run, and the leader keeps its lock. A foreign lease row (another stream's, a malformed key) is left alone."""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable

import pytest

from shardherd.coordinator.leader_lock import LeaderLock
from shardherd.coordinator.leader_loop import LeaderLoop
from shardherd.coordinator.moves import MoveReason
from shardherd.coordinator.run_summary import RunSummary
from shardherd.services.emulators.kinesalite import NodeEmulator
from shardherd.services.emulators.ports import wait_until
from shardherd.shared.checkpoint import TRIM_HORIZON
from shardherd.shared.clock import ManualClock
from shardherd.shared.config import load_settings
from shardherd.shared.lease import Lease
from shardherd.shared.retry import RetryPolicy
from shardherd.shared.shard_lister import list_shards
from shardherd.shared.shards import Shard
from shardherd.shared.store import LeaseStore
from shardherd.shared.worker import WorkerRecord
from tests.coordinator.conftest import kinesis_client
from tests.support.faulty_proxy import Fault, FaultyProxy

INTERVAL = 2.0
_streams = itertools.count()


class Replica:
    """One leader on a virtual clock whose shard source is a real ListShards call on kinesalite behind a proxy."""

    def __init__(self, store: LeaseStore, kinesalite: NodeEmulator, proxy: FaultyProxy, shards: int = 4) -> None:
        self.store = store
        self.clock = ManualClock()
        self.admin = kinesis_client(kinesalite.endpoint_url)
        self.stream = f"parts-{next(_streams)}"
        self.admin.create_stream(StreamName=self.stream, ShardCount=shards)
        wait_until(self._active, 20.0, f"stream {self.stream} ACTIVE", lambda: True)
        client = kinesis_client(proxy.endpoint_url)
        # ListShards retries back off on a clock of their own, so they do not move the leader's time.
        retry = RetryPolicy(max_attempts=3, clock=ManualClock(), rng=random.Random(3))
        self.edit: Callable[[list[Shard]], list[Shard]] = lambda shards: shards
        self.settings = load_settings(application_name="parts-test", worker_id="coord-a",
                                      lease_assignment_interval_millis=int(INTERVAL * 1000))
        self.lock = LeaderLock(store, "coord-a", self.clock, self.settings.leader_lock_lease_duration_millis,
                               self.settings.leader_lock_heartbeat_period_millis)
        self.loop = LeaderLoop(store, self.lock, self.settings, self.clock,
                               shard_source=lambda: self.edit(list_shards(client, self.stream, retry)))
        self.beats: dict[str, int] = {}

    def _active(self) -> bool:
        summary = self.admin.describe_stream_summary(StreamName=self.stream)["StreamDescriptionSummary"]
        return bool(summary["StreamStatus"] == "ACTIVE")

    def run(self, runs: int, alive: tuple[str, ...]) -> list[RunSummary]:
        summaries = []
        for _ in range(runs):
            for worker in alive:
                self.beats[worker] = self.beats.get(worker, 0) + 1
                self.store.upsert_worker(WorkerRecord(worker, int(self.clock.time()), heartbeat=self.beats[worker]))
            self.lock.tick()
            summary = self.loop.run_once()
            assert summary is not None, "the replica lost its lock"
            summaries.append(summary)
            self.clock.advance(INTERVAL)
        return summaries

    def owners(self) -> dict[str, str | None]:
        return {lease.lease_key: lease.lease_owner for lease in self.store.scan_leases().leases}


def _throttled(replica: Replica, proxy: FaultyProxy) -> str:
    proxy.add([Fault(400, "LimitExceededException")] * 1000)
    return "LimitExceededException"


def _denied(replica: Replica, proxy: FaultyProxy) -> str:
    proxy.add([Fault(400, "AccessDeniedException")] * 1000)
    return "AccessDeniedException"


def _deleted(replica: Replica, proxy: FaultyProxy) -> str:
    replica.admin.delete_stream(StreamName=replica.stream)
    wait_until(lambda: replica.stream not in replica.admin.list_streams()["StreamNames"], 20.0,
               f"stream {replica.stream} deleted", lambda: True)
    return "not found"


def _gap(replica: Replica, proxy: FaultyProxy) -> str:
    replica.edit = lambda shards: shards[1:]  # a listing that leaves part of the hash key space uncovered
    return "hash key space"


@pytest.mark.parametrize("breaks", [_throttled, _denied, _deleted, _gap],
                         ids=["throttled", "access-denied", "stream-deleted", "no-tiling"])
def test_a_failing_shard_sync_does_not_stop_failover(loop_store: LeaseStore, kinesalite: NodeEmulator,
                                                     breaks: Callable[[Replica, FaultyProxy], str]) -> None:
    with FaultyProxy(kinesalite.endpoint_url) as proxy:
        replica = Replica(loop_store, kinesalite, proxy)
        first = replica.run(3, alive=("w1", "w2"))
        assert all(s.ok and s.shard_sync_error is None for s in first)
        held = {w: {k for k, o in replica.owners().items() if o == w} for w in ("w1", "w2")}
        assert len(held["w1"]) == len(held["w2"]) == 2

        expected = breaks(replica, proxy)
        failover = replica.settings.failover_time_millis / 1000
        runs = replica.run(int(failover / INTERVAL) + 3, alive=("w1",))  # w2 dies as shard sync breaks

    owners = replica.owners()
    assert all(owners[key] == "w1" for key in held["w2"])  # failed over although shard sync kept failing
    assert all(s.ok for s in runs)  # every run still placed what needed an owner
    assert sum(s.moves_by_reason().get(MoveReason.EXPIRED.value, 0) for s in runs) == 2
    assert replica.lock.is_leader()  # a failing shard sync is no reason to hand leadership on
    synced = [s for s in runs if s.shard_sync_ran]
    # (Seen once in CI, not reproduced in 48 local runs: a synced run without the expected error. The message says
    # which runs synced and with what, for the next time.)
    assert synced and all(expected in (s.shard_sync_error or "") for s in synced), \
        [(s.started_at, s.shard_sync_error) for s in runs if s.shard_sync_ran]
    # Retries back off (1, 2, 4 intervals, ... up to the sync interval) instead of listing every run.
    assert len(synced) < len(runs)


def test_shard_sync_retries_with_backoff_and_recovers(loop_store: LeaseStore, kinesalite: NodeEmulator) -> None:
    with FaultyProxy(kinesalite.endpoint_url) as proxy:
        replica = Replica(loop_store, kinesalite, proxy, shards=2)
        replica.run(2, alive=("w1",))
        proxy.add([Fault(400, "AccessDeniedException")] * 2)  # two failed syncs, then ListShards works again
        runs = replica.run(12, alive=("w1",))
    attempts = [i for i, s in enumerate(runs) if s.shard_sync_ran]
    errors = [runs[i].shard_sync_error for i in attempts]
    assert errors[:3] == [f"ShardListingError: ListShards for {replica.stream} failed: AccessDeniedException: "
                          "injected AccessDeniedException"] * 2 + [None]
    assert [b - a for a, b in itertools.pairwise(attempts[:3])] == [1, 2]  # retried after 1, then 2 intervals
    assert all(s.ok for s in runs) and list(replica.owners().values()) == ["w1", "w1"]


def test_foreign_lease_rows_are_left_alone_while_the_stream_syncs(loop_store: LeaseStore,
                                                                  kinesalite: NodeEmulator) -> None:
    # A KCL multi-stream application's lease and a malformed key share the table of a single-stream application:
    # shard sync goes on, and neither row is assigned, changed or deleted.
    foreign = Lease(lease_key="123456789012:other:1700000000:shardId-000000000000", checkpoint=TRIM_HORIZON,
                    stream_name="123456789012:other:1700000000", shard_id="shardId-000000000000")
    broken = Lease(lease_key="123456789012:other:soon:shardId-000000000001", checkpoint=TRIM_HORIZON)
    with FaultyProxy(kinesalite.endpoint_url) as proxy:
        replica = Replica(loop_store, kinesalite, proxy)
        created = [replica.store.create_lease(lease) for lease in (foreign, broken)]
        assert all(outcome.applied for outcome in created)
        runs = replica.run(4, alive=("w1", "w2"))
    assert all(s.ok and s.shard_sync_error is None for s in runs)
    owners = replica.owners()
    assert owners.pop(foreign.lease_key) is None and owners.pop(broken.lease_key) is None
    assert len(owners) == 4 and set(owners.values()) == {"w1", "w2"}
    assert [replica.store.get_lease(lease.lease_key) for lease in (foreign, broken)] == [o.lease for o in created]
