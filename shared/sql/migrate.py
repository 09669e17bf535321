"""Versioned schema migrations of the SQL store with Alembic (docs/decisions/0007-schema-migrations.md).

Each application's tables carry their own version table, `<app>-SchemaVersion`, so applications sharing a database
are migrated independently. The revisions live in shared/sql/migrations/versions; `upgrade` runs them on the
caller's connection and transaction (the store holds its DDL lock around it), and refuses a database whose revision
this shardherd does not know (written by a newer release) instead of touching it.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import Connection

from shardherd.shared.errors import StoreError
from shardherd.shared.sql.schema import version_table
from shardherd.shared.store import TableNames

MIGRATIONS = Path(__file__).resolve().parent / "migrations"
# Keys of the Alembic config's attributes through which env.py gets the connection and the table names.
CONNECTION, TABLES = "connection", "tables"


class UnknownSchemaRevision(StoreError):
    """The tables are at a revision this shardherd does not have: a newer release migrated them."""


@cache
def _scripts() -> ScriptDirectory:
    return ScriptDirectory(str(MIGRATIONS))


def head() -> str:
    """The newest revision this shardherd knows."""
    revision = _scripts().get_current_head()
    assert revision is not None, f"no revisions under {MIGRATIONS}"
    return revision


def current(conn: Connection, tables: TableNames) -> str | None:
    """The revision the application's tables are at; None before the first migration (or with no tables)."""
    return MigrationContext.configure(conn, opts={"version_table": version_table(tables)}).get_current_revision()


def upgrade(conn: Connection, tables: TableNames) -> None:
    """Bring the application's tables to the head revision, from none, an unversioned earlier schema or any revision."""
    at = current(conn, tables)
    if at is not None and at not in {script.revision for script in _scripts().walk_revisions()}:
        raise UnknownSchemaRevision(f"the tables of {tables.leases!r} are at schema revision {at}, newer than this "
                                    f"shardherd's {head()}: run a release that has it")
    if at == head():
        return
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.attributes[CONNECTION] = conn
    config.attributes[TABLES] = tables
    command.upgrade(config, "head")
