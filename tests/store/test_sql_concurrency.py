"""SQL backend under contention and failure: multi-process checkpoint races, a locked SQLite file, lost connections."""

from __future__ import annotations

import multiprocessing
import queue
import random
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy import exc as sa_exc

from shardherd.shared.checkpoint import Checkpoint
from shardherd.shared.clock import ManualClock
from shardherd.shared.errors import StoreError, StoreUnavailable
from shardherd.shared.lease import Lease
from shardherd.shared.retry import RetryPolicy
from shardherd.shared.sql.engine import is_transient
from shardherd.shared.sql.store import SqlLeaseStore
from shardherd.shared.store import TableNames
from tests.store.sql_support import SQL_BACKENDS, backend_url, open_store

KEY = "shardId-000000000000"
OWNER = "worker-a"
CONTENDERS = 8
WRITES_EACH = 25
TIMEOUT = 120.0


@pytest.fixture(params=SQL_BACKENDS)
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return backend_url(request, tmp_path)


def _checkpoint_many(url: str, app: str, seed: int, start: Any, results: Any) -> None:
    """One contender: checkpoint WRITES_EACH random sequence numbers as the owner; report what each write returned."""
    rng = random.Random(seed)
    store = SqlLeaseStore(url, TableNames.for_application(app))
    outcomes: list[tuple[int, bool, str, int | None]] = []
    try:
        start.wait(TIMEOUT)
        for _ in range(WRITES_EACH):
            sequence = rng.randrange(10**30, 10**31)
            outcome = store.checkpoint(KEY, OWNER, Checkpoint.at(sequence))
            counter = outcome.lease.lease_counter if outcome.lease else None
            outcomes.append((sequence, outcome.applied, outcome.conflict.name, counter))
    finally:
        store.close()
        results.put(outcomes)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["threads", "processes"])
def test_concurrent_checkpoints_never_regress_and_count_every_write(url: str, mode: str) -> None:
    with open_store(url) as store:
        assert store.create_lease(Lease(KEY)).applied
        assert store.assign(KEY, OWNER, None, None).applied  # counter 1
        app = store.tables.leases
        if mode == "threads":
            start: Any = threading.Barrier(CONTENDERS)
            results: Any = queue.Queue()
            runners: list[Any] = [threading.Thread(target=_checkpoint_many, args=(url, app, seed, start, results))
                                  for seed in range(CONTENDERS)]
        else:
            context = multiprocessing.get_context("spawn")
            start = context.Barrier(CONTENDERS)
            results = context.Queue()
            runners = [context.Process(target=_checkpoint_many, args=(url, app, seed, start, results))
                       for seed in range(CONTENDERS)]
        for runner in runners:
            runner.start()
        outcomes = [outcome for _ in runners for outcome in results.get(timeout=TIMEOUT)]
        for runner in runners:
            runner.join(TIMEOUT)
        final = store.get_lease(KEY)

    assert len(outcomes) == CONTENDERS * WRITES_EACH
    applied = sorted((counter, sequence) for sequence, ok, _, counter in outcomes if ok and counter is not None)
    rejected = [outcome for outcome in outcomes if not outcome[1]]
    assert {conflict for _, ok, conflict, _ in rejected} <= {"STALE_CHECKPOINT"}
    # every applied write got its own counter value, with no gap: nothing was lost or written twice
    assert [counter for counter, _ in applied] == list(range(2, 2 + len(applied)))
    # in counter order the stored checkpoint only ever moved forward
    sequences = [sequence for _, sequence in applied]
    assert sequences == sorted(sequences)
    assert final is not None
    assert final.lease_counter == 1 + len(applied)
    assert final.checkpoint == Checkpoint.at(max(sequence for sequence, *_ in outcomes))
    # a rejected checkpoint was really behind the value stored when it was rejected
    for sequence, _, _, counter_seen in rejected:
        assert counter_seen is not None
        stored_then = sequences[counter_seen - 2] if counter_seen >= 2 else None
        assert stored_then is not None and sequence < stored_then


# ------------------------------------------------------------------ a locked SQLite file
class _HookedClock(ManualClock):
    """A virtual clock that runs a hook after each sleep (to change the world between retries)."""

    def __init__(self, after_sleep: Callable[[int], None]) -> None:
        super().__init__()
        self.sleeps: list[float] = []
        self._after_sleep = after_sleep

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        super().sleep(seconds)
        self._after_sleep(len(self.sleeps))


def _locked_sqlite(tmp_path: Path, release_after: int | None) -> tuple[str, _HookedClock, sqlite3.Connection]:
    """A SQLite file whose write lock another connection holds until the clock's `release_after`-th sleep."""
    path = tmp_path / "locked.db"
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)

    def maybe_release(sleeps: int) -> None:
        if sleeps == release_after:
            holder.execute("COMMIT")

    return f"sqlite:///{path}?timeout=0.02", _HookedClock(maybe_release), holder


def test_a_locked_sqlite_database_is_retried_until_the_lock_goes(tmp_path: Path) -> None:
    url, clock, holder = _locked_sqlite(tmp_path, release_after=2)
    retry = RetryPolicy(max_attempts=5, clock=clock, rng=random.Random(7))
    with open_store(url, "locked", retry=retry) as store:
        holder.execute("BEGIN EXCLUSIVE")
        outcome = store.create_lease(Lease(KEY))
    holder.close()
    assert outcome.applied
    assert len(clock.sleeps) == 2  # two attempts met the lock, the third got through
    assert clock.monotonic() == pytest.approx(1_000.0 + sum(clock.sleeps))


def test_a_lock_that_never_goes_exhausts_the_budget(tmp_path: Path) -> None:
    url, clock, holder = _locked_sqlite(tmp_path, release_after=None)
    retry = RetryPolicy(max_attempts=3, clock=clock, rng=random.Random(7))
    with open_store(url, "locked", retry=retry) as store:
        holder.execute("BEGIN EXCLUSIVE")
        with pytest.raises(StoreUnavailable, match="database is locked"):
            store.renew(KEY, OWNER, 0)
        holder.execute("COMMIT")
        assert store.get_lease(KEY) is None
    holder.close()
    assert len(clock.sleeps) == 2


def test_non_transient_errors_are_not_retried(tmp_path: Path) -> None:
    clock = ManualClock()
    url = f"sqlite:///{tmp_path / 'leases.db'}"
    with open_store(url, "dropped", retry=RetryPolicy(clock=clock)) as store:
        sqlite3.connect(tmp_path / "leases.db").execute('DROP TABLE "dropped"')
        with pytest.raises(StoreError, match="no such table"):
            store.get_lease(KEY)
    assert clock.monotonic() == 1_000.0


def test_a_full_sqlite_file_is_an_outage_not_a_permanent_error(tmp_path: Path) -> None:
    """SQLITE_FULL (what a full disk gives; here the file's page limit) is retried and ends as StoreUnavailable.

    Made permanent, it ended every heartbeat and lock keeper of the fleet at once (the fault matrix's "SQLite disk
    full" cell); as an outage, agents fence and the leader stands down until space comes back.
    """
    engine = create_engine(f"sqlite:///{tmp_path / 'full.db'}")
    try:
        with pytest.raises(sa_exc.OperationalError) as caught, engine.connect() as conn:
            conn.execute(text("CREATE TABLE t (b BLOB)"))
            pages = conn.execute(text("PRAGMA page_count")).scalar()
            conn.execute(text(f"PRAGMA max_page_count = {pages}"))
            conn.execute(text("INSERT INTO t VALUES (zeroblob(1000000))"))
    finally:
        engine.dispose()
    assert "full" in str(caught.value)
    assert is_transient(caught.value)


# ------------------------------------------------------------------ PostgreSQL errors
@pytest.mark.postgres
@pytest.mark.parametrize(("sqlstate", "transient"), [
    ("40001", True),  # serialization failure
    ("40P01", True),  # deadlock detected
    ("57P01", True),  # admin shutdown
    ("08006", True),  # connection failure
    ("53100", True),  # disk full: an outage of the store, fenced and waited out
    ("23505", False),  # unique violation
    ("42P01", False),  # undefined table
])
def test_postgres_errors_are_classified_by_sqlstate(postgres_server: Any, sqlstate: str, transient: bool) -> None:
    engine = create_engine(postgres_server.url)
    try:
        with pytest.raises(sa_exc.DBAPIError) as caught, engine.connect() as conn:
            conn.execute(text(f"DO $$ BEGIN RAISE EXCEPTION 'boom' USING ERRCODE = '{sqlstate}'; END $$"))
    finally:
        engine.dispose()
    assert is_transient(caught.value) is transient


@pytest.mark.postgres
def test_postgres_store_survives_its_connections_being_killed(postgres_server: Any) -> None:
    clock = ManualClock()
    with open_store(postgres_server.url, retry=RetryPolicy(clock=clock, rng=random.Random(3))) as store:
        assert store.create_lease(Lease(KEY)).applied
        admin = create_engine(postgres_server.url)
        try:
            with admin.connect() as conn:
                killed = conn.execute(text(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                    "WHERE pid <> pg_backend_pid() AND backend_type = 'client backend'")).scalar()
        finally:
            admin.dispose()
        assert killed
        outcome = store.assign(KEY, OWNER, None, None)
    assert outcome.applied
    assert outcome.lease is not None
    assert outcome.lease.lease_owner == OWNER
    assert clock.monotonic() > 1_000.0  # the dead pooled connection failed once and the write was retried


# ------------------------------------------------------------------ coordinator-state races
@pytest.mark.parametrize("rounds", [10])
def test_exactly_one_contender_creates_an_absent_state_item(url: str, rounds: int) -> None:
    with open_store(url) as store:
        for round_number in range(rounds):
            key = f"leader-{round_number}"
            start = threading.Barrier(CONTENDERS)
            wins: list[str] = []

            def acquire(me: str, key: str = key, start: threading.Barrier = start, wins: list[str] = wins) -> None:
                start.wait(TIMEOUT)
                if store.put_state(key, {"ownerName": me}, {"key": None}):
                    wins.append(me)

            threads = [threading.Thread(target=acquire, args=(f"w{i}",)) for i in range(CONTENDERS)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(TIMEOUT)
            assert len(wins) == 1, f"round {round_number}: {wins}"
            assert store.get_state(key) == {"ownerName": wins[0]}
