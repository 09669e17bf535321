"""A leader that releases the lock after failed runs lets another replica lead: two real replicas (lock + loop) on
DynamoDB (moto server), one of which reaches the lease table through a proxy that fails its scans."""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator
from typing import Any

import pytest

from shardherd.coordinator.leader_lock import LeaderLock
from shardherd.coordinator.leader_loop import LeaderLoop
from shardherd.coordinator.run_summary import RunSummary
from shardherd.services.emulators.moto_server import MotoServer
from shardherd.shared.clock import ManualClock
from shardherd.shared.config import Settings, load_settings
from shardherd.shared.errors import ConfigError
from shardherd.shared.retry import RetryPolicy
from shardherd.shared.store import LeaseStore
from shardherd.shared.worker import WorkerRecord
from tests.support.faulty_proxy import INTERNAL_ERROR, Fault, FaultyProxy
from tests.support.stores import make_store, unique_app

INTERVAL = 2.0
_beats = itertools.count(1)


class ScansFail(FaultyProxy):
    """Answers DynamoDB Scan requests with 500 while `failing`; the lock's item reads and writes pass."""

    failing = False

    def _next(self, target: str) -> Fault | None:
        if self.failing and target.endswith(".Scan"):
            return INTERNAL_ERROR
        return super()._next(target)


class Replica:
    """A coordinator replica: its own store client, lock and loop, on the fleet's virtual clock."""

    def __init__(self, name: str, store: LeaseStore, clock: ManualClock, settings: Settings) -> None:
        self.name = name
        self.store = store
        self.lock = LeaderLock(store, name, clock, settings.leader_lock_lease_duration_millis,
                               settings.leader_lock_heartbeat_period_millis)
        self.loop = LeaderLoop(store, self.lock, settings, clock)
        self.running = True


@pytest.fixture
def fleet(moto_server: MotoServer) -> Iterator[tuple[ManualClock, ScansFail, Settings, dict[str, Any]]]:
    app = unique_app("standdown")
    proxy = ScansFail(moto_server.endpoint_url)
    with proxy:
        # The store's retries back off on a clock of their own, so they do not move the replicas' time.
        retry = RetryPolicy(max_attempts=2, clock=ManualClock(), rng=random.Random(5))
        stores = {"coord-a": make_store("dynamodb", moto_url=proxy.endpoint_url, app=app, retry=retry),
                  "coord-b": make_store("dynamodb", moto_url=moto_server.endpoint_url, app=app)}
        settings = load_settings(application_name="standdown", lease_assignment_interval_millis=int(INTERVAL * 1000))
        yield ManualClock(), proxy, settings, stores
        for store in stores.values():
            store.close()


def _run(replicas: list[Replica], clock: ManualClock, steps: int, worker_store: LeaseStore,
         runs: list[RunSummary] | None = None) -> list[str | None]:
    """Each step: a worker heartbeats, every live replica ticks its lock (its keeper thread), then runs its loop.

    Returns the leader after each step; the summaries of runs that happened go to `runs`.
    """
    leaders = []
    for _ in range(steps):
        worker_store.upsert_worker(WorkerRecord("w1", int(clock.time()), heartbeat=next(_beats)))
        live = [r for r in replicas if r.running]
        for replica in live:
            replica.lock.tick()
        for replica in live:
            summary = replica.loop.run_once()
            if summary is not None and runs is not None:
                runs.append(summary)
        leaders.append(next((r.name for r in live if r.lock.is_leader()), None))
        clock.advance(INTERVAL)
    return leaders


def test_a_release_after_failed_runs_lets_another_replica_lead(
        fleet: tuple[ManualClock, ScansFail, Settings, dict[str, Any]]) -> None:
    clock, proxy, settings, stores = fleet
    a = Replica("coord-a", stores["coord-a"], clock, settings)
    b = Replica("coord-b", stores["coord-b"], clock, settings)
    replicas = [a, b]  # a ticks first in every step: without a stand-down it wins the election after its release
    assert _run(replicas, clock, 2, stores["coord-b"]) == ["coord-a", "coord-a"]

    proxy.failing = True  # coord-a can no longer scan the lease table (throttled, or its role lost dynamodb:Scan)
    failed: list[RunSummary] = []
    leaders = _run(replicas, clock, settings.leader_failure_threshold, stores["coord-b"], failed)
    assert len(failed) == settings.leader_failure_threshold and not any(s.ok for s in failed)
    assert leaders[-1] is None  # released after the third failed run

    leaders = _run(replicas, clock, 10, stores["coord-b"])
    assert leaders[0] == "coord-b"  # taken at b's next tick, a second or two after the release
    assert leaders == ["coord-b"] * 10  # and kept: a does not take it back while b heartbeats
    assert b.loop.history.recent()[-1].ok
    assert a.lock.read().owner == "coord-b"

    b.running = False  # b dies; a (scans fixed) takes over once b's lock runs out, like any contender
    proxy.failing = False
    leaders = _run(replicas, clock, 8, stores["coord-b"])
    assert "coord-a" in leaders


def test_a_lone_replica_takes_the_lock_back_after_the_stand_down(
        fleet: tuple[ManualClock, ScansFail, Settings, dict[str, Any]]) -> None:
    clock, proxy, settings, stores = fleet
    a = Replica("coord-a", stores["coord-a"], clock, settings)
    _run([a], clock, 1, stores["coord-b"])
    proxy.failing = True
    leaders = _run([a], clock, settings.leader_failure_threshold, stores["coord-b"])
    assert leaders[-1] is None
    released_at = clock.monotonic() - INTERVAL
    proxy.failing = False
    back = None
    for _ in range(40):
        a.lock.tick()
        if a.lock.is_leader():
            back = clock.monotonic() - released_at
            break
        clock.advance(0.25)
    stand_down = settings.leader_stand_down_millis / 1000
    assert back is not None and stand_down <= back <= stand_down + settings.leader_lock_heartbeat_period_millis / 1000


@pytest.mark.parametrize(("stand_down", "ok"), [(0, True), (2_999, False), (3_000, True)])
def test_stand_down_is_zero_or_at_least_two_lock_heartbeats(stand_down: int, ok: bool) -> None:
    if ok:
        assert load_settings(leader_stand_down_millis=stand_down).leader_stand_down_millis == stand_down
    else:
        with pytest.raises(ConfigError, match="leader_stand_down_millis"):
            load_settings(leader_stand_down_millis=stand_down)
