"""Schema migrations (shared/sql/migrate.py) from every earlier schema, on SQLite and the session's PostgreSQL.

Earlier schemas: none; the unversioned ones earlier releases created (tests/store/schemas: the CREATE statements
SQLAlchemy issued for shared/sql/schema.py at ad91e78, the first SQL store, and at f9d6d77, which added
`lease_progress`); and every revision of this release. Each one holds rows, which must survive; afterwards the
tables equal the model (Alembic's compare_metadata finds no difference) and the version table names the head.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Engine, create_engine, inspect, text
from sqlalchemy.engine import Connection

from shardherd.shared.checkpoint import Checkpoint
from shardherd.shared.sql import migrate
from shardherd.shared.sql.schema import build_schema, version_table
from shardherd.shared.sql.store import SqlLeaseStore
from shardherd.shared.store import TableNames
from shardherd.shared.worker import LeaseProgress, WorkerRecord
from tests.store.sql_support import SQL_BACKENDS, backend_url, start_up_together
from tests.support.stores import unique_app, worker_record

SCHEMAS = Path(__file__).resolve().parent / "schemas"
UNVERSIONED = ("ad91e78", "f9d6d77")


@pytest.fixture(params=SQL_BACKENDS)
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return backend_url(request, tmp_path)


@pytest.fixture
def engine(url: str) -> Iterator[Engine]:
    engine = create_engine(url)
    yield engine
    engine.dispose()


SEQUENCE = "49590338271490256608559692538361571095921575989136588898"


def insert_rows(conn: Connection, tables: TableNames) -> None:
    """One lease, one worker and one state item, in columns every schema has."""
    conn.execute(text(f'INSERT INTO "{tables.leases}" (lease_key, lease_owner, lease_counter, checkpoint) '
                      "VALUES ('shardId-000000000001', 'w1', 7, :sequence)"), {"sequence": SEQUENCE})
    conn.execute(text(f'INSERT INTO "{tables.worker_metrics}" (wid, lut, hb) VALUES (\'w1\', 1763000000, 3)'))
    conn.execute(text(f'INSERT INTO "{tables.coordinator_state}" (key, document) '
                      """VALUES ('Leader', '{"ownerName": {"S": "coord-1"}}')"""))


def create_unversioned(engine: Engine, commit: str, tables: TableNames) -> None:
    """The tables as the release at `commit` created them, with one lease, one worker and one state item."""
    ddl = (SCHEMAS / f"{commit}-{engine.dialect.name}.sql").read_text()
    ddl = (ddl.replace("{leases}", tables.leases).replace("{workers}", tables.worker_metrics)
           .replace("{state}", tables.coordinator_state))
    statements = [part.strip() for part in ddl.split(";")]
    with engine.begin() as conn:
        for statement in statements:
            body = "\n".join(line for line in statement.splitlines() if not line.startswith("--")).strip()
            if body:
                conn.execute(text(body))
        insert_rows(conn, tables)


def create_at_revision(engine: Engine, revision: str, tables: TableNames) -> None:
    """The tables as this release's migrations leave them at `revision` (and the first revision's rows)."""
    config = Config()
    config.set_main_option("script_location", str(migrate.MIGRATIONS))
    with engine.begin() as conn:
        config.attributes[migrate.CONNECTION] = conn
        config.attributes[migrate.TABLES] = tables
        command.upgrade(config, revision)
        insert_rows(conn, tables)


def differences(conn: Connection, tables: TableNames) -> list[object]:
    """What Alembic finds between the application's tables in the database and the model (shared/sql/schema.py)."""
    own = {tables.leases, tables.worker_metrics, tables.coordinator_state}

    def include(name: str | None, kind: str, parent: object) -> bool:
        return kind != "table" or name in own

    context = MigrationContext.configure(conn, opts={"include_name": include})
    found: list[object] = compare_metadata(context, build_schema(tables).metadata)
    return found


def revisions() -> list[str]:
    """Every revision of this release, oldest first."""
    return [script.revision for script in reversed(list(migrate._scripts().walk_revisions()))]


def assert_at_head_with_the_rows(url: str, engine: Engine, tables: TableNames) -> None:
    with engine.connect() as conn:
        assert migrate.current(conn, tables) == migrate.head()
        found = differences(conn, tables)
        assert found == [], found
    store = SqlLeaseStore(url, tables)
    try:
        lease = store.get_lease("shardId-000000000001")
        assert lease is not None and lease.lease_owner == "w1" and lease.lease_counter == 7
        assert lease.checkpoint == Checkpoint(SEQUENCE)
        worker = worker_record(store, "w1")
        assert worker is not None and worker.heartbeat == 3
        assert store.get_state("Leader") == {"ownerName": "coord-1"}
        progress = {"shardId-000000000001": LeaseProgress(5, 10, 100)}
        store.upsert_worker(WorkerRecord("w2", 1763000001, heartbeat=1, lease_progress=progress))
        written = worker_record(store, "w2")
        assert written is not None and written.lease_progress == progress  # the column revision 0002 added
    finally:
        store.close()


@pytest.mark.parametrize("commit", UNVERSIONED)
def test_an_unversioned_schema_of_an_earlier_release_is_migrated_keeping_its_rows(url: str, engine: Engine,
                                                                                  commit: str) -> None:
    tables = TableNames.for_application(unique_app("mig"))
    create_unversioned(engine, commit, tables)
    with engine.connect() as conn:
        assert migrate.current(conn, tables) is None
    store = SqlLeaseStore(url, tables)
    try:
        store.ensure_tables()
    finally:
        store.close()
    assert_at_head_with_the_rows(url, engine, tables)


@pytest.mark.parametrize("revision", revisions())
def test_every_revision_is_migrated_to_the_head_keeping_its_rows(url: str, engine: Engine, revision: str) -> None:
    tables = TableNames.for_application(unique_app("mig"))
    create_at_revision(engine, revision, tables)
    with engine.connect() as conn:
        assert migrate.current(conn, tables) == revision
    store = SqlLeaseStore(url, tables)
    try:
        store.ensure_tables()
        store.ensure_tables()  # at the head: nothing to do
    finally:
        store.close()
    assert_at_head_with_the_rows(url, engine, tables)


def test_an_empty_database_gets_the_head_schema_and_applications_are_versioned_apart(url: str,
                                                                                       engine: Engine) -> None:
    first, second = (TableNames.for_application(unique_app("mig")) for _ in range(2))
    create_unversioned(engine, "ad91e78", second)
    store = SqlLeaseStore(url, first)
    try:
        store.ensure_tables()
    finally:
        store.close()
    with engine.connect() as conn:
        assert migrate.current(conn, first) == migrate.head()
        assert migrate.current(conn, second) is None  # another application's tables are left alone
        assert "lease_progress" not in {column["name"] for column in inspect(conn).get_columns(second.worker_metrics)}
        assert differences(conn, first) == []


def test_concurrent_start_ups_migrate_once(url: str, engine: Engine) -> None:
    tables = TableNames.for_application(unique_app("mig"))
    create_unversioned(engine, "ad91e78", tables)
    assert start_up_together(url, tables) == []
    assert_at_head_with_the_rows(url, engine, tables)


def test_a_revision_from_a_newer_release_is_refused_untouched(url: str, engine: Engine) -> None:
    tables = TableNames.for_application(unique_app("mig"))
    create_at_revision(engine, migrate.head(), tables)
    with engine.begin() as conn:
        conn.execute(text(f'UPDATE "{version_table(tables)}" SET version_num = \'9999\''))
    store = SqlLeaseStore(url, tables)
    try:
        with pytest.raises(migrate.UnknownSchemaRevision, match="revision 9999, newer than this shardherd"):
            store.ensure_tables()
    finally:
        store.close()
    with engine.connect() as conn:
        assert migrate.current(conn, tables) == "9999"


def test_only_a_migrating_process_imports_alembic(tmp_path: Path) -> None:
    """Agents open the store and never migrate: Alembic's 8.5 MiB of modules stay out of every agent on an SQL store."""
    script = ("import sys; from shardherd.shared.sql.store import SqlLeaseStore; "
              "from shardherd.shared.store import TableNames; "
              f"store = SqlLeaseStore('sqlite:///{tmp_path}/s.db', TableNames.for_application('app')); "
              "before = 'alembic' in sys.modules; "
              "store.ensure_tables(); store.close(); print(before, 'alembic' in sys.modules)")
    shown = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    assert shown.stdout.split() == ["False", "True"]
