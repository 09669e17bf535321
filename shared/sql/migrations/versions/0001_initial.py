"""The first schema (before migrations existed): leases with the owner index, worker metrics, coordinator state.

Created only where missing, so a database made by an earlier shardherd, which created these tables without a
version table, is adopted as it stands; revision 0002 then brings it up to date.
"""

from __future__ import annotations

from alembic import op
from sqlalchemy import BigInteger, Boolean, Column, Float, Index, LargeBinary, MetaData, Table, Text

from shardherd.shared.store import TableNames

revision = "0001"
down_revision = None

_LEASE_COLUMNS = (
    "lease_key", "lease_owner", "lease_counter", "checkpoint", "checkpoint_sub_sequence_number",
    "owner_switches_since_checkpoint", "pending_checkpoint", "pending_checkpoint_sub_sequence_number",
    "pending_checkpoint_state", "parent_shard_id", "child_shard_ids", "starting_hash_key", "ending_hash_key",
    "throughput_kbps", "checkpoint_owner", "entity_type", "stream_name", "shard_id",
)
_TYPES = {"lease_counter": BigInteger, "checkpoint_sub_sequence_number": BigInteger,
          "owner_switches_since_checkpoint": BigInteger, "pending_checkpoint_sub_sequence_number": BigInteger,
          "pending_checkpoint_state": LargeBinary, "throughput_kbps": Float}


def upgrade(tables: TableNames) -> None:
    """Create the three tables and the owner index, each only if missing."""
    metadata = MetaData()
    leases = Table(tables.leases, metadata, *(
        Column(name, _TYPES.get(name, Text)(), primary_key=name == "lease_key",
               nullable=name not in ("lease_key", "lease_counter"))
        for name in _LEASE_COLUMNS))
    Table(tables.worker_metrics, metadata,
          Column("wid", Text(), primary_key=True), Column("lut", BigInteger(), nullable=False),
          Column("sts", Text()), Column("opr", Text()), Column("hb", BigInteger()), Column("worker_state", Text()),
          Column("lease_throughput", Text()), Column("drain_requested", Boolean()))
    Table(tables.coordinator_state, metadata,
          Column("key", Text(), primary_key=True), Column("document", Text(), nullable=False))
    bind = op.get_bind()
    metadata.create_all(bind, checkfirst=True)
    Index(f"{tables.leases}_lease_owner_idx", leases.c.lease_owner).create(bind, checkfirst=True)
