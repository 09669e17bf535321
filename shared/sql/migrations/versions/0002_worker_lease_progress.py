"""Worker records carry per-lease progress (lag, records, bytes) as a JSON column `lease_progress`.

Databases created by shardherd between this column's arrival and the first migration already have it; it is added
only where missing.
"""

from __future__ import annotations

import sqlalchemy as sa

from shardherd.shared.sql.migrations.columns import add_missing_columns
from shardherd.shared.store import TableNames

revision = "0002"
down_revision = "0001"


def upgrade(tables: TableNames) -> None:
    """Add `lease_progress` (JSON text: lease key -> {"lag", "records", "bytes"}) to the worker table."""
    add_missing_columns(tables.worker_metrics, {"lease_progress": sa.Text()})
