"""Helpers of the SQL-backend tests: URLs for both SQL backends and a plain engine for raw SQL on the same database."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from sqlalchemy import Engine, create_engine

from shardherd.shared.retry import RetryPolicy
from shardherd.shared.sql.schema import SqlSchema, build_schema
from shardherd.shared.sql.store import SqlLeaseStore
from shardherd.shared.store import TableNames
from tests.support.stores import unique_app

SQL_BACKENDS = ("sqlite", pytest.param("postgres", marks=pytest.mark.postgres))


def backend_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The URL of the backend the test is parametrized with: a SQLite file in tmp_path or the session's PostgreSQL."""
    if request.param == "postgres":
        url: str = request.getfixturevalue("postgres_server").url
        return url
    return f"sqlite:///{tmp_path / 'leases.db'}"


@contextmanager
def open_store(url: str, app: str | None = None, retry: RetryPolicy | None = None) -> Iterator[SqlLeaseStore]:
    """A store with its tables created, closed afterwards."""
    store = SqlLeaseStore(url, TableNames.for_application(app or unique_app("sql")), retry=retry)
    try:
        store.ensure_tables()
        yield store
    finally:
        store.close()


def start_up_together(url: str, tables: TableNames, count: int = 4) -> list[BaseException]:
    """`count` stores calling `ensure_tables` at the same moment from their own threads; what they raised."""
    errors: list[BaseException] = []
    barrier = threading.Barrier(count)

    def start_up() -> None:
        store = SqlLeaseStore(url, tables)
        try:
            barrier.wait(timeout=30)
            store.ensure_tables()
        except BaseException as exc:  # reported to the caller
            errors.append(exc)
        finally:
            store.close()

    threads = [threading.Thread(target=start_up) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    return errors


@contextmanager
def raw_access(url: str, tables: TableNames) -> Iterator[tuple[Engine, SqlSchema]]:
    """A plain SQLAlchemy engine (no shardherd codec or retries) and the table objects, to plant or inspect rows."""
    engine = create_engine(url)
    try:
        yield engine, build_schema(tables)
    finally:
        engine.dispose()
