"""Fixtures of the conformance suite: how to reopen the test's store elsewhere, and lease set-up shortcuts."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from shared.checkpoint import TRIM_HORIZON, Checkpoint
from shared.lease import Lease
from shared.store import Fence, LeaseStore, Outcome
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
