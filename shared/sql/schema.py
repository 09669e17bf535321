"""SQLAlchemy Core tables of one application: leases (KCL attributes in snake case), workers, coordinator state."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Float,
    Index,
    LargeBinary,
    MetaData,
    Table,
    Text,
)
from sqlalchemy.types import TypeEngine

from shared.store import TableNames

# Lease column -> KCL attribute name (reference 1.2); the column names are the attributes in snake case.
LEASE_ATTRIBUTES: dict[str, str] = {
    "lease_key": "leaseKey",
    "lease_owner": "leaseOwner",
    "lease_counter": "leaseCounter",
    "checkpoint": "checkpoint",
    "checkpoint_sub_sequence_number": "checkpointSubSequenceNumber",
    "owner_switches_since_checkpoint": "ownerSwitchesSinceCheckpoint",
    "pending_checkpoint": "pendingCheckpoint",
    "pending_checkpoint_sub_sequence_number": "pendingCheckpointSubSequenceNumber",
    "pending_checkpoint_state": "pendingCheckpointState",
    "parent_shard_id": "parentShardId",
    "child_shard_ids": "childShardIds",
    "starting_hash_key": "startingHashKey",
    "ending_hash_key": "endingHashKey",
    "throughput_kbps": "throughputKBps",
    "checkpoint_owner": "checkpointOwner",
    "entity_type": "entityType",
    "stream_name": "streamName",
    "shard_id": "shardId",
}

_LEASE_TYPES: dict[str, TypeEngine[Any]] = {
    "lease_counter": BigInteger(),
    "checkpoint_sub_sequence_number": BigInteger(),
    "owner_switches_since_checkpoint": BigInteger(),
    "pending_checkpoint_sub_sequence_number": BigInteger(),
    "pending_checkpoint_state": LargeBinary(),
    "throughput_kbps": Float(),
}

# PostgreSQL truncates identifiers longer than this; index names are made to fit.
_MAX_IDENTIFIER = 63


def _index_name(table: str, column: str) -> str:
    """`<table>_<column>_idx`, shortened with a stable hash when it would exceed PostgreSQL's identifier limit."""
    name = f"{table}_{column}_idx"
    if len(name) <= _MAX_IDENTIFIER:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:10]
    return f"{name[: _MAX_IDENTIFIER - len(digest) - 1]}_{digest}"


@dataclass(frozen=True)
class SqlSchema:
    """The three tables of one application plus the owner index (the SQL twin of the DynamoDB GSI)."""

    metadata: MetaData
    leases: Table
    workers: Table
    state: Table
    owner_index: Index


def build_schema(tables: TableNames) -> SqlSchema:
    """Table definitions named after `tables` (lease table = application name, as in KCL)."""
    metadata = MetaData()
    lease_columns = [
        Column(
            column,
            _LEASE_TYPES.get(column, Text()),
            primary_key=column == "lease_key",
            nullable=column not in ("lease_key", "lease_counter"),
        )
        for column in LEASE_ATTRIBUTES
    ]
    leases = Table(tables.leases, metadata, *lease_columns)
    owner_index = Index(_index_name(tables.leases, "lease_owner"), leases.c.lease_owner)
    workers = Table(
        tables.worker_metrics,
        metadata,
        Column("wid", Text(), primary_key=True),
        Column("lut", BigInteger(), nullable=False),
        Column("sts", Text()),  # JSON: metric -> list of numbers
        Column("opr", Text()),  # JSON: metric -> list of numbers
        Column("hb", BigInteger()),
        Column("worker_state", Text()),
        Column("lease_throughput", Text()),  # JSON: lease key -> KiB/s
        Column("drain_requested", Boolean()),
    )
    state = Table(
        tables.coordinator_state,
        metadata,
        Column("key", Text(), primary_key=True),
        Column("document", Text(), nullable=False),  # JSON: attribute -> {"S"|"N"|"B": value}
    )
    return SqlSchema(metadata, leases, workers, state, owner_index)
