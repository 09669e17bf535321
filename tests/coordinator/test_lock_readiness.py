"""Readiness from the leader lock's store calls: a store that answers reads but refuses writes is not ready.

Found by the fault matrix's "SQLite read-only" cell (issue 30): every lock write failed with a disk I/O error
(EROFS), no replica could lead, yet /readyz stayed 200 on both replicas all along, because `check_store`, lacking
fresh evidence, read the lock item, and reads of a read-only store succeed.
"""

from __future__ import annotations

import random

import pytest

from shardherd.coordinator.leader_lock import LeaderLock
from shardherd.services.emulators.moto_server import MotoServer
from shardherd.shared.aws import make_client
from shardherd.shared.clock import ManualClock
from shardherd.shared.dynamo.store import DynamoLeaseStore
from shardherd.shared.errors import StoreUnavailable
from shardherd.shared.retry import RetryPolicy
from shardherd.shared.store import TableNames
from tests.support.chaos_proxy import CALM, Chaos, ChaosProxy
from tests.support.stores import unique_app

WITHIN = 5.0  # the evidence window the API gives check_store (STORE_CHECK_SECONDS plus heartbeats, shortened)


def _run(clock: ManualClock, seconds: float, lock: LeaderLock) -> None:
    end = clock.monotonic() + seconds
    while clock.monotonic() < end:
        clock.advance(0.5)
        lock.tick()


def test_a_store_refusing_writes_is_not_ready_and_ready_again_when_writes_pass(moto_server: MotoServer) -> None:
    clock = ManualClock()
    with ChaosProxy(moto_server.endpoint_url) as proxy:
        store = DynamoLeaseStore(make_client("dynamodb", "us-east-1", proxy.endpoint_url),
                                 TableNames.for_application(unique_app("ready")),
                                 retry=RetryPolicy(clock=clock, rng=random.Random(5)))
        try:
            store.ensure_tables()
            lock = LeaderLock(store, "coord-a", clock, 6_000, 1_500)
            assert lock.tick()
            lock.check_store(WITHIN)  # ready while leading
            proxy.set(Chaos(error_rate=1.0, writes_only=True))
            # The term runs out; the item is watched for the lease duration, then each takeover attempt reads it
            # and fails to write.
            _run(clock, 16.0, lock)
            assert not lock.is_leader()
            assert proxy.forwarded[-1].endswith(".PutItem"), "a takeover write was tried last"
            with pytest.raises(StoreUnavailable):
                lock.check_store(WITHIN)
            proxy.set(CALM)
            _run(clock, 2.0, lock)
            assert lock.is_leader()
            lock.check_store(WITHIN)
        finally:
            store.close()
