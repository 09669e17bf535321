"""The leader writes a run's assignments in parallel, each still fenced, and stops at a lost fence."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any, cast

import pytest

from shardherd.coordinator.leader_lock import LeaderLock
from shardherd.coordinator.leader_loop import LeaderLoop
from shardherd.shared.clock import ManualClock
from shardherd.shared.config import load_settings
from shardherd.shared.lease import Lease
from shardherd.shared.store import Fence, LeaseStore, Outcome
from shardherd.shared.worker import WorkerRecord
from tests.support.stores import make_store

LEASES = 60
THREADS = 6
LOSE_AFTER = 12  # the lock is released while the 12th assignment is being written


class _Watched:
    """A store whose `assign` counts calls and writes in flight, and releases the leader's lock at one call."""

    def __init__(self, inner: LeaseStore) -> None:
        self.inner = inner
        self.lock: LeaderLock | None = None
        self.calls = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self.released = False
        self.after_release: list[str] = []  # leases whose write started once the lock was gone
        self._guard = threading.Lock()
        self._barrier = threading.Barrier(THREADS, timeout=5)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def assign(self, lease_key: str, new_owner: str, expected_owner: str | None,
               expected_checkpoint_owner: str | None, fence: Fence | None = None, move: str | None = None) -> Outcome:
        with self._guard:
            self.calls += 1
            call = self.calls
            if self.released:
                self.after_release.append(lease_key)
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if call <= THREADS:  # the first writes wait for each other: they can only all arrive if run at once
                self._barrier.wait()
            if call == LOSE_AFTER and self.lock is not None:
                self.lock.release()
                with self._guard:
                    self.released = True
            return self.inner.assign(lease_key, new_owner, expected_owner, expected_checkpoint_owner, fence=fence,
                                     move=move)
        finally:
            with self._guard:
                self.in_flight -= 1


@pytest.fixture(params=["dynamodb", "postgres"])
def real_store(request: pytest.FixtureRequest) -> Iterator[LeaseStore]:
    """DynamoDB on the session's moto server, then the session's PostgreSQL."""
    if request.param == "dynamodb":
        store = make_store("dynamodb", moto_url=request.getfixturevalue("moto_server").endpoint_url)
    else:
        store = make_store("postgres", postgres_url=request.getfixturevalue("postgres_server").url)
    yield store
    store.close()


def test_writes_run_concurrently_and_stop_at_a_lost_fence(real_store: LeaseStore) -> None:
    settings = load_settings(application_name="parallel-writes", leader_write_threads=THREADS)
    clock = ManualClock()
    watched = _Watched(real_store)
    store = cast(LeaseStore, watched)
    for index in range(LEASES):
        real_store.create_lease(Lease(f"shardId-{index:012d}"))
    lock = LeaderLock(store, "coord-a", clock, settings.leader_lock_lease_duration_millis,
                      settings.leader_lock_heartbeat_period_millis)
    watched.lock = lock
    assert lock.tick()
    loop = LeaderLoop(store, lock, settings, clock)
    for beat in (1, 2):  # the leader counts a worker alive once it has seen its heartbeat advance
        for worker in ("w1", "w2", "w3"):
            real_store.upsert_worker(WorkerRecord(worker, int(clock.time()), heartbeat=beat))
        if beat == 1:
            first = loop.run_once()
            assert first is not None and first.plan is not None and not first.plan.moves
            clock.advance(2.0)

    assert loop.run_once() is None  # the run stopped: leadership was lost mid-write

    assert watched.max_in_flight == THREADS
    assert watched.calls < LEASES  # writes not yet started when the fence was lost were skipped
    owned = [lease for lease in real_store.scan_leases().leases if lease.lease_owner is not None]
    assert LOSE_AFTER - THREADS <= len(owned) < LOSE_AFTER + THREADS  # those written before the release
    assert not {lease.lease_key for lease in owned} & set(watched.after_release)  # every write was fenced
