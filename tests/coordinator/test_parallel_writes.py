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


def _leader(real_store: LeaseStore, wrapped: object, application: str) -> tuple[LeaderLock, LeaderLoop, ManualClock]:
    """LEASES unowned leases in `real_store`, and a leader (THREADS write threads) on `wrapped`, a wrapper of it."""
    settings = load_settings(application_name=application, leader_write_threads=THREADS)
    clock = ManualClock()
    store = cast(LeaseStore, wrapped)
    for index in range(LEASES):
        real_store.create_lease(Lease(f"shardId-{index:012d}"))
    lock = LeaderLock(store, "coord-a", clock, settings.leader_lock_lease_duration_millis,
                      settings.leader_lock_heartbeat_period_millis)
    return lock, LeaderLoop(store, lock, settings, clock), clock


def test_writes_run_concurrently_and_stop_at_a_lost_fence(real_store: LeaseStore) -> None:
    watched = _Watched(real_store)
    lock, loop, clock = _leader(real_store, watched, "parallel-writes")
    watched.lock = lock
    assert lock.tick()
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


class _Writers:
    """A store that records the thread of each owner write (assign or handoff start)."""

    def __init__(self, inner: LeaseStore) -> None:
        self.inner = inner
        self.threads: list[threading.Thread] = []  # kept: a thread object is never reused for another thread
        self._guard = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def _note(self) -> None:
        with self._guard:
            self.threads.append(threading.current_thread())

    def assign(self, *args: Any, **kwargs: Any) -> Outcome:
        self._note()
        return self.inner.assign(*args, **kwargs)

    def start_handoff(self, *args: Any, **kwargs: Any) -> Outcome:
        self._note()
        return self.inner.start_handoff(*args, **kwargs)


def test_the_write_threads_are_kept_across_runs_and_stopped_at_close(real_store: LeaseStore) -> None:
    writers = _Writers(real_store)
    lock, loop, clock = _leader(real_store, writers, "kept-writers")
    workers = ["w1"]
    writing_runs = 0
    for beat in range(1, 40):
        if beat == 10:
            workers.append("w2")  # a joining worker: balancing hands it leases, in more runs with writes
        for worker in workers:
            real_store.upsert_worker(WorkerRecord(worker, int(clock.time()), heartbeat=beat))
        lock.tick()
        summary = loop.run_once()
        assert summary is not None
        writing_runs += bool(summary.writes.assigned or summary.writes.handoffs_started)
        clock.advance(2.0)
    assert writing_runs >= 3
    kept = set(writers.threads)
    assert 2 <= len(kept) <= THREADS  # a pool per run would have started new threads at each run that wrote
    assert all(thread.name.startswith("leader-write") for thread in kept)
    loop.close()
    assert not any(thread.is_alive() for thread in kept)
