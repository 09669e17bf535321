"""Every store call has a deadline consistent with the failover time (issue 30): a DynamoDB endpoint that answers
nothing fails a call within `store_call_timeout_millis` (derived from the failover time unless set), not after
botocore's 5 s connect and 30 s read timeouts.

Real parts: moto server over HTTP behind a ChaosProxy on 127.0.0.1 that holds every request unanswered.
"""

from __future__ import annotations

import time

import pytest
from sqlalchemy import create_engine, text

from shardherd.services.emulators.moto_server import MotoServer
from shardherd.shared.config import load_settings
from shardherd.shared.errors import StoreUnavailable
from shardherd.shared.retry import RetryPolicy, retry_deadline
from shardherd.shared.store_factory import call_timeouts, open_store
from tests.support.chaos_proxy import Chaos, ChaosProxy
from tests.support.postgres import PostgresServer
from tests.support.stores import unique_app


def test_the_deadline_follows_the_failover_time_and_the_lock_duration_unless_set() -> None:
    assert load_settings().effective_store_call_timeout_millis == 6000  # min(10 s failover, 6 s lock)
    assert load_settings(failover_time_millis=3000).effective_store_call_timeout_millis == 3000
    assert load_settings(failover_time_millis=500, leader_lock_lease_duration_millis=500,
                         leader_lock_heartbeat_period_millis=100, heartbeat_interval_millis=100,
                         leader_stand_down_millis=0).effective_store_call_timeout_millis == 1000  # the floor
    assert load_settings(store_call_timeout_millis=750).effective_store_call_timeout_millis == 750
    assert call_timeouts(3.0) == (1.5, 3.0)


@pytest.mark.parametrize("configured", [None, 600])
def test_a_store_call_against_a_blackholed_endpoint_fails_within_its_deadline(
        moto_server: MotoServer, configured: int | None) -> None:
    with ChaosProxy(moto_server.endpoint_url) as proxy:
        settings = load_settings(application_name=unique_app("deadline"), dynamodb_endpoint_url=proxy.endpoint_url,
                                 failover_time_millis=2000, store_call_timeout_millis=configured)
        store = open_store(settings, RetryPolicy())
        store.ensure_tables()
        deadline = settings.effective_store_call_timeout_millis / 1000
        proxy.set(Chaos(hang=True))
        started = time.monotonic()
        with pytest.raises(StoreUnavailable), retry_deadline(started + deadline):
            store.get_lease("shardId-000000000000")
        took = time.monotonic() - started
        proxy.set(Chaos())
        print(f"\nblackholed get_lease failed after {took:.2f} s (deadline {deadline:.2f} s)")
        assert took <= deadline + 0.5
        assert proxy.served["hung"] >= 1


@pytest.mark.postgres
def test_a_postgres_statement_that_waits_on_a_lock_fails_within_its_deadline(
        postgres_server: PostgresServer) -> None:
    """A session holding the lease table locked (a stuck migration, an operator's open transaction) stalls every
    statement: the statement timeout ends each within the call's deadline, as a transient error."""
    settings = load_settings(application_name=unique_app("stmt-deadline"), store_backend="sql",
                             sql_url=postgres_server.url, failover_time_millis=2000, store_call_timeout_millis=700)
    store = open_store(settings, RetryPolicy())
    store.ensure_tables()
    blocker = create_engine(postgres_server.url)
    try:
        with blocker.begin() as conn:
            conn.execute(text(f'LOCK TABLE "{settings.table_names.leases}" IN ACCESS EXCLUSIVE MODE'))
            started = time.monotonic()
            with pytest.raises(StoreUnavailable, match="statement timeout"), retry_deadline(started + 0.7):
                store.get_lease("shardId-000000000000")
            took = time.monotonic() - started
        print(f"\nget_lease behind a table lock failed after {took:.2f} s (deadline 0.70 s)")
        assert took <= 0.7 + 0.5
        assert store.get_lease("shardId-000000000000") is None  # the lock released: the same call answers
        store.ensure_tables()  # a migration's statements stay unbounded (it waits on the DDL lock, not a deadline)
    finally:
        blocker.dispose()
        store.close()
