"""The one step most migrations take: add nullable columns to a table where they are missing (idempotent)."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.types import TypeEngine


def add_missing_columns(table: str, columns: dict[str, TypeEngine[Any]]) -> None:
    """Add each named nullable column to `table` unless the table has it (a table created at a later schema does)."""
    present = {column["name"] for column in sa.inspect(op.get_bind()).get_columns(table)}
    for name, kind in columns.items():
        if name not in present:
            op.add_column(table, sa.Column(name, kind))
