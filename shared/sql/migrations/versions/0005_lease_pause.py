"""Leases carry an operator's pause: `paused` (the reason) and `paused_by` (the worker that stopped for it).

Issue 34, decision 0031: nullable text columns, absent on every lease that was never paused.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from shardherd.shared.sql.schema import PAUSE_COLUMNS
from shardherd.shared.store import TableNames

revision = "0005"
down_revision = "0004"


def upgrade(tables: TableNames) -> None:
    """Add the nullable pause columns to the lease table where missing."""
    columns = {column["name"] for column in sa.inspect(op.get_bind()).get_columns(tables.leases)}
    for name in PAUSE_COLUMNS:
        if name not in columns:
            op.add_column(tables.leases, sa.Column(name, sa.Text()))
