"""The leader deletes worker rows older than `stale_worker_metrics_entry_cleanup_seconds`, conditionally, as KCL does:
DynamoDB on the moto server and PostgreSQL, through the real leader loop on a virtual clock."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from shardherd.coordinator.leader_lock import LeaderLock
from shardherd.coordinator.leader_loop import LeaderLoop
from shardherd.coordinator.run_summary import RunSummary
from shardherd.shared.clock import ManualClock
from shardherd.shared.config import Settings, load_settings
from shardherd.shared.store import LeaseStore
from shardherd.shared.worker import WorkerRecord
from tests.support.stores import make_store

INTERVAL = 2.0
DAY = 86_400


@pytest.fixture(params=["dynamodb", "postgres"])
def kcl_store(request: pytest.FixtureRequest) -> Iterator[LeaseStore]:
    kwargs: dict[str, Any] = {}
    if request.param == "dynamodb":
        kwargs["moto_url"] = request.getfixturevalue("moto_server").endpoint_url
    else:
        kwargs["postgres_url"] = request.getfixturevalue("postgres_server").url
    store = make_store(request.param, **kwargs)
    yield store
    store.close()


class Leader:
    """A leader (lock + loop) and the workers that write their rows, on one virtual clock."""

    def __init__(self, store: LeaseStore, settings: Settings) -> None:
        self.store = store
        self.clock = ManualClock()
        self.settings = settings
        self.lock = LeaderLock(store, "coord-a", self.clock, settings.leader_lock_lease_duration_millis,
                               settings.leader_lock_heartbeat_period_millis)
        self.loop = LeaderLoop(store, self.lock, settings, self.clock)
        self.beats: dict[str, int] = {}
        self.skew: dict[str, float] = {}  # live workers -> how far their wall clock is behind (seconds)

    def write(self, worker: str, age: float = 0.0) -> None:
        """The worker writes its row with a `lut` of `age` seconds ago (by its own wall clock)."""
        self.beats[worker] = self.beats.get(worker, 0) + 1
        self.store.upsert_worker(WorkerRecord(worker, int(self.clock.time() - age), heartbeat=self.beats[worker]))

    def run(self, runs: int) -> list[RunSummary]:
        summaries = []
        for _ in range(runs):
            for worker, skew in self.skew.items():
                self.write(worker, skew)
            self.lock.tick()
            summary = self.loop.run_once()
            assert summary is not None and summary.ok
            summaries.append(summary)
            self.clock.advance(INTERVAL)
        return summaries

    def rows(self) -> set[str]:
        return {record.worker_id for record in self.store.scan_workers().workers}


def test_rows_older_than_a_day_are_deleted_and_live_or_recent_ones_kept(kcl_store: LeaseStore) -> None:
    leader = Leader(kcl_store, load_settings(application_name="stale-test"))
    assert leader.settings.stale_worker_metrics_entry_cleanup_seconds == DAY  # KCL's default
    leader.write("pod-a:41", age=DAY + 60)  # a driver pod that ended yesterday
    leader.write("pod-b:42", age=2 * DAY)
    leader.write("pod-c:43", age=DAY - 600)  # dead, but not stale yet
    leader.skew = {"w1": 0.0, "skewed": 2 * DAY}  # alive; `skewed`'s wall clock is two days behind
    grace = leader.settings.failover_time_millis / 1000

    first = leader.run(1)
    assert leader.rows() == {"pod-a:41", "pod-b:42", "pod-c:43", "w1", "skewed"}  # a new leader watches first
    summaries = first + leader.run(int(grace / INTERVAL) + 2)
    assert leader.rows() == {"pod-c:43", "w1", "skewed"}
    assert sum(s.writes.workers_deleted for s in summaries) == 2

    leader.clock.advance(600)  # pod-c's row turns a day old
    assert sum(s.writes.workers_deleted for s in leader.run(1)) == 1
    assert leader.rows() == {"w1", "skewed"}


def test_a_worker_that_comes_back_keeps_its_row_and_the_setting_is_honoured(kcl_store: LeaseStore) -> None:
    leader = Leader(kcl_store, load_settings(application_name="stale-test",
                                             stale_worker_metrics_entry_cleanup_seconds=3_600))
    leader.write("returning", age=7_200)  # two hours old under a one-hour setting
    row = next(r for r in kcl_store.scan_workers().workers if r.worker_id == "returning")
    leader.run(2)
    leader.write("returning")  # back before the leader watched it for a grace period
    # What the leader's delete is conditioned on: the row it read. The worker rewrote it, so the delete misses.
    assert kcl_store.delete_worker_if_unchanged(row.worker_id, row.last_update, row.heartbeat) is False
    grace_runs = int(leader.settings.failover_time_millis / 1000 / INTERVAL) + 2
    leader.skew = {"returning": 0.0}
    assert sum(s.writes.workers_deleted for s in leader.run(grace_runs)) == 0
    leader.skew = {}  # it stops for good
    leader.clock.advance(3_600)
    assert sum(s.writes.workers_deleted for s in leader.run(grace_runs)) == 1
    assert leader.rows() == set()
