"""Fixtures of the conformance suite: how to reopen the test's store elsewhere, and lease set-up shortcuts."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import MetaData, Table, create_engine, insert, select

from shardherd.shared.aws import make_client
from shardherd.shared.checkpoint import TRIM_HORIZON, Checkpoint
from shardherd.shared.lease import Lease
from shardherd.shared.store import Fence, LeaseStore, Outcome
from tests.support.stores import make_store

LEADER_LOCK = "leader"


@dataclass(frozen=True)
class StoreSpec:
    """Everything needed to open another store on the same tables (picklable, so spawned processes can use it)."""

    backend: str
    app: str
    moto_url: str | None = None
    postgres_url: str | None = None
    sqlite_path: str | None = None

    def open(self) -> LeaseStore:
        """A new store object (own client / engine) on the test's tables."""
        return make_store(self.backend, moto_url=self.moto_url, postgres_url=self.postgres_url,
                          sqlite_path=self.sqlite_path, app=self.app)


@pytest.fixture
def store_spec(request: pytest.FixtureRequest, store: LeaseStore, tmp_path: Path) -> StoreSpec:
    """The connection details of the `store` fixture of this test."""
    backend: str = request.node.callspec.params["store"]
    app = store.tables.leases
    if backend == "dynamodb":
        return StoreSpec(backend, app, moto_url=request.getfixturevalue("moto_server").endpoint_url)
    if backend == "postgres":
        return StoreSpec(backend, app, postgres_url=request.getfixturevalue("postgres_server").url)
    return StoreSpec(backend, app, sqlite_path=str(tmp_path / "leases.db"))


def expect_applied(outcome: Outcome) -> Lease:
    """Assert that a write was applied and return the row after it."""
    assert outcome.applied, f"write not applied: {outcome}"
    assert outcome.conflict.name == "NONE"
    assert outcome.lease is not None
    return outcome.lease


class Leases:
    """Short ways to bring a lease into a given state through the store's own operations."""

    def __init__(self, store: LeaseStore) -> None:
        self.store = store

    def create(self, key: str = "shardId-000000000000", checkpoint: Checkpoint = TRIM_HORIZON) -> Lease:
        """An unowned lease at `checkpoint`."""
        lease = expect_applied(self.store.create_lease(Lease(lease_key=key, checkpoint=checkpoint)))
        assert lease.lease_counter == 0
        return lease

    def owned(self, owner: str, key: str = "shardId-000000000000",
              checkpoint: Checkpoint = TRIM_HORIZON) -> Lease:
        """A lease assigned to `owner` by the leader (counter 1, no handoff)."""
        self.create(key, checkpoint)
        return expect_applied(self.store.assign(key, owner, None, None))

    def in_handoff(self, old: str, new: str, key: str = "shardId-000000000000") -> Lease:
        """A lease being handed from `old` to `new` (leaseOwner = new, checkpointOwner = old)."""
        self.owned(old, key)
        return expect_applied(self.store.start_handoff(key, new, old))

    def must_be_unchanged(self, before: Lease) -> None:
        """Assert that the stored row is exactly `before` (a rejected write wrote nothing)."""
        assert self.store.get_lease(before.lease_key) == before


@pytest.fixture
def leases(store: LeaseStore) -> Leases:
    """Lease set-up shortcuts on the test's store."""
    return Leases(store)


@pytest.fixture
def leader_fence(store: LeaseStore) -> Fence:
    """A fence on a leader-lock item that exists: owner `leader-1`, epoch 7."""
    assert store.put_state(LEADER_LOCK, {"ownerName": "leader-1", "epoch": 7})
    return Fence(LEADER_LOCK, {"ownerName": "leader-1", "epoch": 7})


@pytest.fixture
def lost_fence(store: LeaseStore) -> Fence:
    """A fence whose condition does not hold: the lock moved to another leader (epoch 8)."""
    assert store.put_state(LEADER_LOCK, {"ownerName": "leader-2", "epoch": 8})
    return Fence(LEADER_LOCK, {"ownerName": "leader-1", "epoch": 7})


class RawTable:
    """Writes and reads lease rows behind the store's back (KCL attribute names), to plant rows it did not write."""

    def __init__(self, spec: StoreSpec) -> None:
        self._spec = spec
        self._table = spec.app
        if spec.backend == "dynamodb":
            self._client: Any = make_client("dynamodb", "us-east-1", spec.moto_url)
        else:
            url = spec.postgres_url or f"sqlite:///{spec.sqlite_path}"
            self._engine = create_engine(url)
            self._leases = Table(self._table, MetaData(), autoload_with=self._engine)

    def put(self, attributes: dict[str, str | int]) -> None:
        """Insert one row; str values are strings, int values numbers."""
        if self._spec.backend == "dynamodb":
            item = {name: {"S": value} if isinstance(value, str) else {"N": str(value)}
                    for name, value in attributes.items()}
            self._client.put_item(TableName=self._table, Item=item)
            return
        row = {_snake(name): value for name, value in attributes.items()}
        with self._engine.begin() as connection:
            connection.execute(insert(self._leases).values(**row))

    def get(self, key: str) -> dict[str, Any] | None:
        """The stored row as the backend holds it (for before/after comparisons), None if absent."""
        if self._spec.backend == "dynamodb":
            response = self._client.get_item(TableName=self._table, Key={"leaseKey": {"S": key}},
                                             ConsistentRead=True)
            item: dict[str, Any] | None = response.get("Item")
            return item
        with self._engine.connect() as connection:
            found = connection.execute(select(self._leases).where(self._leases.c.lease_key == key)).mappings().first()
        return dict(found) if found is not None else None

    def close(self) -> None:
        """Release the engine (SQL)."""
        if self._spec.backend != "dynamodb":
            self._engine.dispose()


def _snake(name: str) -> str:
    """KCL attribute name -> SQL column name (`leaseCounter` -> `lease_counter`)."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


@pytest.fixture
def raw_table(store_spec: StoreSpec) -> Iterator[RawTable]:
    """Direct access to the lease table of the test's store (none behind the in-process memory backend)."""
    if store_spec.backend not in ("dynamodb", "sqlite", "postgres"):
        pytest.skip(f"the {store_spec.backend} backend has no table to plant rows in")
    raw = RawTable(store_spec)
    try:
        yield raw
    finally:
        raw.close()
