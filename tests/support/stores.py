"""Builds a fresh store of any backend for one test: unique application name, tables created."""

from __future__ import annotations

import itertools

from shardherd.shared.aws import make_client
from shardherd.shared.memory_store import MemoryLeaseStore, MemoryTables
from shardherd.shared.retry import RetryPolicy
from shardherd.shared.store import LeaseStore, TableNames
from shardherd.shared.worker import WorkerRecord

BACKENDS = ("dynamodb", "sqlite", "postgres", "memory")
_counter = itertools.count()
_memory: dict[TableNames, MemoryTables] = {}  # one in-memory "endpoint": stores opened on the same tables share it


def unique_app(prefix: str = "app") -> str:
    """A table-name-safe application name that no other test in this session uses."""
    return f"{prefix}-{next(_counter):05d}"


def make_store(backend: str, *, moto_url: str | None = None, postgres_url: str | None = None,
               sqlite_path: str | None = None, app: str | None = None,
               retry: RetryPolicy | None = None) -> LeaseStore:
    """Open `backend` on fresh tables named after a unique application."""
    tables = TableNames.for_application(app or unique_app())
    store: LeaseStore
    if backend == "dynamodb":
        from shardherd.shared.dynamo.store import DynamoLeaseStore

        assert moto_url is not None
        store = DynamoLeaseStore(make_client("dynamodb", "us-east-1", moto_url), tables, retry=retry)
    elif backend == "sqlite":
        from shardherd.shared.sql.store import SqlLeaseStore

        assert sqlite_path is not None
        store = SqlLeaseStore(f"sqlite:///{sqlite_path}", tables, retry=retry)
    elif backend == "postgres":
        from shardherd.shared.sql.store import SqlLeaseStore

        assert postgres_url is not None
        store = SqlLeaseStore(postgres_url, tables, retry=retry)
    elif backend == "memory":
        store = MemoryLeaseStore(tables, _memory.setdefault(tables, MemoryTables()))
    else:
        raise ValueError(f"unknown backend {backend}")
    store.ensure_tables()
    return store


def worker_record(store: LeaseStore, worker_id: str) -> WorkerRecord | None:
    """The worker's record as a scan of the worker table reads it (None if absent), for tests to look at one."""
    return next((record for record in store.scan_workers().workers if record.worker_id == worker_id), None)
