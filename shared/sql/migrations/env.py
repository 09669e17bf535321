"""Alembic environment: migrations run on the store's own connection, inside its transaction, for one application.

shared/sql/migrate.py passes the connection and the application's table names in the config's attributes; the
revisions receive the names as `upgrade(tables)`, since every application has its own tables and version table.
"""

from __future__ import annotations

from alembic import context

from shardherd.shared.sql.migrate import CONNECTION, TABLES
from shardherd.shared.sql.schema import version_table

config = context.config
tables = config.attributes[TABLES]
context.configure(connection=config.attributes[CONNECTION], version_table=version_table(tables),
                  transaction_per_migration=False)
with context.begin_transaction():
    context.run_migrations(tables=tables)
