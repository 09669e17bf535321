"""Leases carry the time their owner wrote the checkpoint: `checkpointed_at_millis` (the owner's wall clock, epoch ms).

Issue 33: the operator API's checkpoint age counts from it, not from when a replica first saw the checkpoint.
"""

from __future__ import annotations

import sqlalchemy as sa

from shardherd.shared.sql.migrations.columns import add_missing_columns
from shardherd.shared.store import TableNames

revision = "0006"
down_revision = "0005"


def upgrade(tables: TableNames) -> None:
    """Add the nullable column to the lease table where missing."""
    add_missing_columns(tables.leases, {"checkpointed_at_millis": sa.BigInteger()})
