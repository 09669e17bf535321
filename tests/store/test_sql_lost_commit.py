"""PostgreSQL carried out a COMMIT and the client never heard back (a pooler or the network dropped the connection).

The store retries the transaction on a new connection, and the retry's condition fails on the very write it repeats.
`LostCommitProxy` (tests/support/pg_proxy.py) stands between the store and a real PostgreSQL server and drops the
connection once the server answered the armed COMMIT.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest

from shardherd.coordinator.leader_lock import OWNER, VERSION, LeaderLock
from shardherd.shared.checkpoint import TRIM_HORIZON, Checkpoint
from shardherd.shared.clock import ManualClock
from shardherd.shared.lease import new_lease
from shardherd.shared.retry import RetryPolicy
from shardherd.shared.sql.store import SqlLeaseStore
from shardherd.shared.store import TableNames
from tests.support.pg_proxy import LostCommitProxy
from tests.support.postgres import PostgresServer
from tests.support.stores import unique_app

KEY = "shardId-000000000000"


@pytest.fixture
def proxied(postgres_server: PostgresServer) -> Iterator[tuple[LostCommitProxy, SqlLeaseStore, ManualClock]]:
    clock = ManualClock()
    with LostCommitProxy(postgres_server.port) as proxy:
        store = SqlLeaseStore(proxy.url(postgres_server.url),
                              TableNames.for_application(unique_app("lostcommit")),
                              retry=RetryPolicy(max_attempts=4, clock=clock, rng=random.Random(5)))
        store.ensure_tables()
        try:
            yield proxy, store, clock
        finally:
            store.close()


def test_a_renewal_whose_commit_reply_was_lost_is_still_this_owners(
        proxied: tuple[LostCommitProxy, SqlLeaseStore, ManualClock]) -> None:
    proxy, store, _ = proxied
    store.create_lease(new_lease(KEY, TRIM_HORIZON))
    held = store.assign(KEY, "w1", None, None).lease
    assert held is not None
    proxy.lose_commit_replies()
    outcome = store.renew(KEY, "w1", held.lease_counter)
    assert proxy.lost == 1, "the renewal's commit was carried out and its reply dropped"
    assert outcome.applied, outcome
    stored = store.get_lease(KEY)
    assert stored is not None and stored.lease_owner == "w1" and stored.lease_counter == held.lease_counter + 1
    assert outcome.lease == stored


def test_a_release_whose_commit_reply_was_lost_is_a_release(
        proxied: tuple[LostCommitProxy, SqlLeaseStore, ManualClock]) -> None:
    proxy, store, _ = proxied
    store.create_lease(new_lease(KEY, TRIM_HORIZON))
    assert store.assign(KEY, "w1", None, None).applied
    proxy.lose_commit_replies()
    outcome = store.release(KEY, "w1")
    assert proxy.lost == 1 and outcome.applied, outcome
    assert outcome.lease is not None and outcome.lease.released


def _handing_off(proxy: LostCommitProxy, store: SqlLeaseStore) -> None:
    """w1 holds the lease and hands it to w2; the next COMMIT's reply is lost."""
    store.create_lease(new_lease(KEY, TRIM_HORIZON))
    assert store.assign(KEY, "w1", None, None).applied
    assert store.start_handoff(KEY, "w2", "w1").applied
    proxy.lose_commit_replies()


def test_a_handoff_completion_whose_commit_reply_was_lost_is_a_completion(
        proxied: tuple[LostCommitProxy, SqlLeaseStore, ManualClock]) -> None:
    proxy, store, _ = proxied
    _handing_off(proxy, store)
    outcome = store.complete_handoff(KEY, "w1")
    assert proxy.lost == 1 and outcome.applied, outcome
    assert outcome.lease is not None and outcome.lease.lease_owner == "w2" and outcome.lease.checkpoint_owner is None


def test_a_final_handoff_checkpoint_whose_commit_reply_was_lost_is_written(
        proxied: tuple[LostCommitProxy, SqlLeaseStore, ManualClock]) -> None:
    proxy, store, _ = proxied
    _handing_off(proxy, store)
    final = Checkpoint.at("49590338271490256608559692538361571095921575989136588898")
    outcome = store.checkpoint(KEY, "w1", final, hand_over=True)
    assert proxy.lost == 1 and outcome.applied, outcome
    assert outcome.lease is not None and outcome.lease.checkpoint == final
    assert outcome.lease.checkpoint_owner is None and outcome.lease.lease_owner == "w2"


def test_a_lock_heartbeat_whose_commit_reply_was_lost_keeps_the_lead(
        proxied: tuple[LostCommitProxy, SqlLeaseStore, ManualClock]) -> None:
    proxy, store, clock = proxied
    lock = LeaderLock(store, "coord-a", clock, 6_000, 1_500)
    assert lock.tick()
    before = store.get_state("Leader")
    proxy.lose_commit_replies()
    clock.advance(1.5)
    assert lock.tick(), "the holder kept its term"
    after = store.get_state("Leader")
    assert proxy.lost == 1 and before is not None and after is not None
    assert after[OWNER] == "coord-a" and after[VERSION] != before[VERSION]
