"""SQLAlchemy Core tables of one application: leases (KCL attributes in snake case), workers, coordinator state."""

from __future__ import annotations

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

from shardherd.shared.store import TableNames

# Lease column -> KCL attribute name (KCL's lease serializer); the column names are the attributes in snake case.
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
    "millis_behind_latest": "millisBehindLatest",
    "records_processed": "recordsProcessed",
    "bytes_processed": "bytesProcessed",
    "records_behind": "recordsBehind",
    "checkpointed_at_millis": "checkpointedAtMillis",  # migration 0006
    "last_move": "lastMove",  # shardherd's: the leader's record of the move that set the owner (migration 0004)
    "paused": "shardherdPaused",
    "paused_by": "shardherdPausedBy",
}

# The owner's progress as of its last checkpoint (shardherd's columns, added by migration 0003).
# The pause of shared/pause.py (shardherd's columns, added by migration 0005).
PAUSE_COLUMNS = ("paused", "paused_by")

PROGRESS_COLUMNS = ("millis_behind_latest", "records_processed", "bytes_processed", "records_behind",
                    "checkpointed_at_millis")

_LEASE_TYPES: dict[str, TypeEngine[Any]] = {
    "lease_counter": BigInteger(),
    "checkpoint_sub_sequence_number": BigInteger(),
    "owner_switches_since_checkpoint": BigInteger(),
    "pending_checkpoint_sub_sequence_number": BigInteger(),
    "pending_checkpoint_state": LargeBinary(),
    "throughput_kbps": Float(),
    **{name: BigInteger() for name in PROGRESS_COLUMNS},
}

# PostgreSQL's identifier limit; SQLite has none.
POSTGRES_MAX_IDENTIFIER = 63


@dataclass(frozen=True)
class SqlSchema:
    """The three tables of one application plus the owner index (the SQL twin of the DynamoDB GSI)."""

    metadata: MetaData
    leases: Table
    workers: Table
    state: Table
    owner_index: Index


def version_table(tables: TableNames) -> str:
    """The application's Alembic version table, named like KCL's tables: `<app>-SchemaVersion`."""
    return f"{tables.leases}-SchemaVersion"


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
    owner_index = Index(f"{tables.leases}_lease_owner_idx", leases.c.lease_owner)
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
        Column("lease_progress", Text()),  # JSON: lease key -> {"lag", "records", "bytes"}
        Column("drain_requested", Boolean()),
        Column("restart_within_ms", BigInteger()),  # a restart reservation (shared/restart.py)
    )
    state = Table(
        tables.coordinator_state,
        metadata,
        Column("key", Text(), primary_key=True),
        Column("document", Text(), nullable=False),  # JSON: attribute -> {"S"|"N"|"B": value}
    )
    return SqlSchema(metadata, leases, workers, state, owner_index)


def overlong_identifiers(schema: SqlSchema, *others: str) -> list[str]:
    """Table and index names (the schema's and `others`) PostgreSQL cannot hold (longer than 63 characters)."""
    names = [table.name for table in (schema.leases, schema.workers, schema.state)]
    names.append(str(schema.owner_index.name))
    names.extend(others)
    return [name for name in names if len(name) > POSTGRES_MAX_IDENTIFIER]
