"""How many PostgreSQL connections an SQL store keeps: an agent (any process but the coordinator) keeps 2 open
between calls, however many of its threads called at once; the coordinator keeps its pool; each connection names
its process's role in pg_stat_activity. The scale run's 34 agents had exhausted max_connections with 10 idle each."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from sqlalchemy import create_engine, text

from shardherd.shared.config import load_settings
from shardherd.shared.store import LeaseStore
from shardherd.shared.store_factory import SQL_IDLE_CONNECTIONS, open_store
from tests.support.postgres import PostgresServer
from tests.support.stores import unique_app

pytestmark = pytest.mark.postgres
THREADS = 8


def _connections(server: PostgresServer, name: str) -> int:
    engine = create_engine(server.url)
    try:
        with engine.connect() as connection:
            count = connection.execute(text("select count(*) from pg_stat_activity where application_name = :name"),
                                       {"name": name}).scalar_one()
    finally:
        engine.dispose()
    return int(count)


def _busy(store: LeaseStore) -> None:
    """THREADS threads scanning at once until all of them held a connection together (a barrier per round)."""
    barrier = threading.Barrier(THREADS)

    def scan() -> None:
        for _ in range(5):
            barrier.wait(timeout=30)
            store.scan_leases()
            store.scan_workers()

    threads = [threading.Thread(target=scan) for _ in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)


@pytest.fixture(params=["agent", "coordinator"])
def role(request: pytest.FixtureRequest, postgres_server: PostgresServer) -> Iterator[tuple[str, LeaseStore]]:
    settings = load_settings(application_name=unique_app("pool"), store_backend="sql", sql_url=postgres_server.url)
    store = open_store(settings, caller=request.param)
    store.ensure_tables()
    yield request.param, store
    store.close()


def test_only_the_coordinator_keeps_its_busy_connections(role: tuple[str, LeaseStore],
                                                         postgres_server: PostgresServer) -> None:
    caller, store = role
    _busy(store)
    kept = _connections(postgres_server, f"shardherd-{caller}")
    if caller == "coordinator":
        assert kept > SQL_IDLE_CONNECTIONS, kept  # its pool stays open for the next run's writes
    else:
        assert 1 <= kept <= SQL_IDLE_CONNECTIONS, kept
