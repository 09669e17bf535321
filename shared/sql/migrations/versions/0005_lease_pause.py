"""Leases carry an operator's pause: `paused` (the reason) and `paused_by` (the worker that stopped for it).

Issue 34, decision 0031: nullable text columns, absent on every lease that was never paused.
"""

from __future__ import annotations

import sqlalchemy as sa

from shardherd.shared.sql.migrations.columns import add_missing_columns
from shardherd.shared.sql.schema import PAUSE_COLUMNS
from shardherd.shared.store import TableNames

revision = "0005"
down_revision = "0004"


def upgrade(tables: TableNames) -> None:
    """Add the nullable pause columns to the lease table where missing."""
    add_missing_columns(tables.leases, {name: sa.Text() for name in PAUSE_COLUMNS})
