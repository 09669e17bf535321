"""Worker rows carry a restart reservation: `restart_within_ms` (decision 0035, shared/restart.py).

Set by a worker stopping for a restart or by an operator; while the row is silent for less than it, the leader keeps
the worker's leases for it.
"""

from __future__ import annotations

import sqlalchemy as sa

from shardherd.shared.sql.migrations.columns import add_missing_columns
from shardherd.shared.store import TableNames

revision = "0007"
down_revision = "0006"


def upgrade(tables: TableNames) -> None:
    """Add the nullable column to the worker table where missing."""
    add_missing_columns(tables.worker_metrics, {"restart_within_ms": sa.BigInteger()})
