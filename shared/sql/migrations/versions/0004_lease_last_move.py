"""Leases carry the leader's record of the move that set their owner.

The column `last_move` (issue 33): the leader writes it with the owner itself, so a move's reason and time survive a
leader killed before it published its status (services/leader_status.py).
"""

from __future__ import annotations

import sqlalchemy as sa

from shardherd.shared.sql.migrations.columns import add_missing_columns
from shardherd.shared.store import TableNames

revision = "0004"
down_revision = "0003"


def upgrade(tables: TableNames) -> None:
    """Add the nullable text column to the lease table where missing."""
    add_missing_columns(tables.leases, {"last_move": sa.Text()})
