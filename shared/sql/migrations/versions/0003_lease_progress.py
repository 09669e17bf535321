"""Leases carry their owner's progress as of its last checkpoint.

The columns `millis_behind_latest`, `records_processed`, `bytes_processed` and `records_behind` (issue 17): the
worker's heartbeat row no longer carries them, so a heartbeat stays one write unit.
"""

from __future__ import annotations

import sqlalchemy as sa

from shardherd.shared.sql.migrations.columns import add_missing_columns
from shardherd.shared.sql.schema import PROGRESS_COLUMNS
from shardherd.shared.store import TableNames

revision = "0003"
down_revision = "0002"


def upgrade(tables: TableNames) -> None:
    """Add the nullable integer progress columns to the lease table where missing."""
    add_missing_columns(tables.leases, {name: sa.BigInteger() for name in PROGRESS_COLUMNS})
